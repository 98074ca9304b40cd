"""Provenance (common/run/provenance.py): every results folder says which commit, versions and device made it."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess

import pytest

from common.run import provenance
from common.run.config import parse_run_config
from common.run.provenance import commit_label, gather, git_state
from common.run.results import PROVENANCE_FILE, RunResults
from server_app.registry import SERVER_STRATEGIES

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(root)})


@needs_git
def test_a_checkout_gives_its_commit_and_whether_a_tracked_file_changed(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("not part of the code\n")
    assert git_state(tmp_path) == {"commit": head, "dirty": False, "git": "ok"}  # untracked files do not count
    (tmp_path / "a.py").write_text("x = 2\n")
    state = git_state(tmp_path)
    assert (state["commit"], state["dirty"]) == (head, True)
    assert commit_label(state) == head[:7] + "+dirty"


def test_a_folder_that_is_not_a_checkout_says_so_without_asking_an_enclosing_repository(tmp_path):
    state = git_state(tmp_path / "site-packages")
    assert state["commit"] == "unknown" and state["dirty"] is None and "not a git checkout" in state["git"]
    assert commit_label(state) == "unknown"


def test_no_git_on_the_machine_gives_unknown_not_an_error(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.setattr(provenance.shutil, "which", lambda name: None)
    assert git_state(tmp_path) == {"commit": "unknown", "dirty": None, "git": "git is not installed"}


@needs_git
def test_a_broken_checkout_gives_unknown(tmp_path):
    (tmp_path / ".git").write_text("gitdir: /nowhere\n")  # a worktree whose repository is gone
    state = git_state(tmp_path)
    assert state["commit"] == "unknown" and state["dirty"] is None and "failed" in state["git"]


def test_the_record_names_the_versions_and_the_device(tmp_path):
    record = gather("cpu", root=tmp_path)
    assert record["python"] == platform.python_version()
    import flwr
    import torch

    assert record["flwr"] == flwr.__version__ or record["flwr"].startswith(flwr.__version__)
    assert record["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert record["device"] == "cpu"
    assert record["commit"] == "unknown"
    assert commit_label(None) == "not recorded"


def test_a_results_folder_holds_the_full_config_and_the_provenance(tmp_path):
    cfg = parse_run_config({"results-dir": str(tmp_path), "run-name": "r", "lr": 0.01}, SERVER_STRATEGIES)
    with RunResults(cfg) as results:
        folder = results.path
    config = json.loads((folder / "config.json").read_text())
    assert config == cfg.as_dict() and config["lr"] == 0.01
    assert "max-weight-share" in config and "aggregation" in config  # keys the user never gave, resolved
    record = json.loads((folder / PROVENANCE_FILE).read_text())
    for key in ("fedsynth-version", "commit", "dirty", "python", "flwr", "torch", "device"):
        assert key in record
    assert record["commit"] == git_state()["commit"]


def test_a_resumed_run_keeps_its_start_and_adds_each_resume(tmp_path):
    raw = {"results-dir": str(tmp_path), "run-name": "r"}
    with RunResults(parse_run_config(raw, SERVER_STRATEGIES)) as results:
        folder = results.path
    started = json.loads((folder / PROVENANCE_FILE).read_text())
    (folder / "checkpoint.safetensors").write_bytes(b"")  # what resume = true looks for; restore_rounds follows it
    with RunResults(parse_run_config({**raw, "resume": True}, SERVER_STRATEGIES)) as resumed:
        resumed.restore_rounds([{"round": 1, "central-accuracy": 0.5}])
    record = json.loads((folder / PROVENANCE_FILE).read_text())
    assert {k: v for k, v in record.items() if k != "resumed"} == started
    assert len(record["resumed"]) == 1 and record["resumed"][0]["commit"] == started["commit"]
