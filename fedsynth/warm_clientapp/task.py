"""What a warm task runs: Flower's `flwr-clientapp`, less the FAB extraction an installed app does not need.

Flower 1.42's `run_clientapp` calls `install_from_fab(fab, skip_prompt=True)` for every message. That
function extracts the whole FAB into a temporary folder and checks every file's hash, and only then, when the
app's folder (`FLWR_HOME/apps/<publisher>.<name>.<version>.<hash[:8]>`) exists already, returns it without
installing anything. For every message after a run's first, all that work is thrown away. Measured with
cProfile inside warm tasks of `benchmarks/deployment.py` (this app's FAB, 160 files, loaded 2-core machine):
1.1 s of a 3.4 s task, the largest single part of a warm task's life.

`run` is `flwr.supernode.cli:flwr_clientapp` with one change: `install_from_fab` first looks up the folder
Flower would return (Flower's own `get_fab_config`, `get_metadata_from_config` and `get_project_dir`, on the
FAB's bytes and their sha256, as Flower names it) and returns it when it exists; otherwise (a new app or a new
version: a new hash) Flower's function runs unchanged and installs it. The result is the path Flower's function
would have returned. What is skipped is Flower's re-check of the same bytes' file hashes, which passed when
those bytes were installed. Cold tasks (`FEDSYNTH_WARM_CLIENTAPP=0`) run Flower's code untouched.

Imported by the warm server before it forks (so a task finds it loaded); the change is made in each forked
child, never in the server.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable


def installed_app_dir(fab: bytes) -> Path | None:
    """The folder Flower installed `fab` into, or None when it is not installed (yet)."""
    from flwr.common.config import get_fab_config, get_metadata_from_config, get_project_dir

    fab_id, fab_version = get_metadata_from_config(get_fab_config(fab))
    folder = get_project_dir(fab_id, fab_version, hashlib.sha256(fab).hexdigest())
    return folder if folder.is_dir() else None


def install_once(flower_install: Callable[..., Path]) -> Callable[..., Path]:
    """`flower_install` (Flower's `install_from_fab`), returning an installed app's folder without extracting it."""

    def install_from_fab(fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        if isinstance(fab_file, bytes) and install_dir is None and skip_prompt:  # run_clientapp's call
            folder = installed_app_dir(fab_file)
            if folder is not None:
                return folder
        return flower_install(fab_file, install_dir=install_dir, skip_prompt=skip_prompt)

    return install_from_fab


def run() -> Any:
    """The `flwr-clientapp` console script's function, with `install_once` in place (in this process only)."""
    from flwr.supernode.cli import flwr_clientapp
    from flwr.supernode.runtime import run_clientapp

    run_clientapp.install_from_fab = install_once(run_clientapp.install_from_fab)
    return flwr_clientapp()
