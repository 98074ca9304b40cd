"""The Flower app the drivers run: the run config its pyproject.toml declares, and the engines that can run it.

Below `fedsynth run` (fedsynth/cli.py) and `fedsynth study` (fedsynth/study/cli.py), which both read them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ENGINES = ("simulation", "inprocess")  # Flower's simulation engine (Ray), or the in-process grid


def app_defaults(app_dir: Path) -> dict[str, Any]:
    """The default run config declared in the app's pyproject.toml, its tables flattened as Flower flattens them
    (`[tool.flwr.app.config.fedadam]`'s `eta` is the key "fedadam.eta": a plugin's own settings)."""
    from flwr.common.config import flatten_dict

    with open(app_dir / "pyproject.toml", "rb") as handle:
        return flatten_dict(tomllib.load(handle)["tool"]["flwr"]["app"]["config"])
