"""The child-process environment shared by study runs and sharpness measurements."""

import os
from pathlib import Path

from fedsynth.app_process import app_process_env


def test_app_dir_goes_first_and_keeps_the_callers_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    env = app_process_env(Path("/apps"), threads=3)
    assert env["PYTHONPATH"].split(os.pathsep) == ["/apps", "/already/there"]


def test_threads_default_only_when_the_caller_set_none(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = app_process_env(Path("/apps"), threads=0)
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONPATH"] == "/apps"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert app_process_env(Path("/apps"), threads=2)["OMP_NUM_THREADS"] == "4"


def test_the_callers_environment_is_not_changed(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    app_process_env(Path("/apps"), threads=2)
    assert os.environ["PYTHONPATH"] == "/already/there"
