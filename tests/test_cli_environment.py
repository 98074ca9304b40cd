"""A run in this process leaves the process environment as it found it.

Flower's Ray backend writes the driver's `sys.path` into `os.environ["PYTHONPATH"]`.
Left there, every later subprocess inherits the venv's site-packages: in CI this
broke Debian's `/usr/bin/docker-compose` for every test after the first in-process
simulation (`module 'lib' has no attribute 'GEN_EMAIL'`).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from fedsynth.cli import main

REPO = Path(__file__).resolve().parent.parent


def _ray_like_simulation(**_: object) -> None:
    """What `RayBackend.init_ray` does to the environment, without starting Ray."""
    os.environ["PYTHONPATH"] = os.pathsep.join([*sys.path, os.environ.get("PYTHONPATH", "")])


@pytest.mark.parametrize("before", [None, "/opt/site"])
def test_a_run_gives_back_the_pythonpath_it_found(tmp_path, monkeypatch, capsys, before):
    module = importlib.import_module("flwr.simulation.run_simulation")
    monkeypatch.setattr(module, "_run_simulation", _ray_like_simulation)
    if before is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", before)
    main(["run", "--app-dir", str(REPO), "--run-config", f'results-dir="{tmp_path}"'])
    assert os.environ.get("PYTHONPATH") == before
