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


def _checkout(tmp_path, name):
    root = tmp_path / name
    root.mkdir()
    _git(root, "init", "-q")
    (root / "a.py").write_text("x = 1\n")
    (root / "gone.py").write_text("old\n")
    (root / ".gitignore").write_text("*.log\n")
    _git(root, "add", "a.py", "gone.py", ".gitignore")
    _git(root, "commit", "-q", "-m", "one")
    return root


@needs_git
def test_a_checkout_gives_its_commit_and_whether_a_tracked_file_changed(tmp_path):
    root = _checkout(tmp_path, "run")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (root / "ignored.log").write_text("a file git ignores\n")
    assert git_state(root) == {"commit": head, "dirty": False, "git": "ok"}  # ignored files do not count
    (root / "a.py").write_text("x = 2\n")
    state = git_state(root)
    assert (state["commit"], state["dirty"]) == (head, True)
    assert commit_label(state) == head[:7] + "+dirty"


@needs_git
def test_an_untracked_file_a_run_could_import_makes_the_tree_dirty(tmp_path):
    root = _checkout(tmp_path, "run")
    (root / "helper.py").write_text("y = 2\n")
    assert git_state(root)["dirty"] is True


@needs_git
def test_a_changed_tree_keeps_the_patch_that_rebuilds_it_untracked_files_included(tmp_path):
    root = _checkout(tmp_path, "run")
    def staged():
        return subprocess.run(["git", "-C", str(root), "ls-files", "--stage"], capture_output=True, text=True).stdout

    index_before = staged()
    (root / "a.py").write_text("x = 2\n")
    (root / "gone.py").unlink()
    (root / "pkg").mkdir()
    (root / "pkg" / "new.py").write_text("z = 3\n")
    (root / "blob.bin").write_bytes(bytes(range(256)))
    (root / "run.log").write_text("ignored: not part of the code\n")
    folder = tmp_path / "results"
    folder.mkdir()
    record = provenance.write_source_diff(git_state(root), folder, root=root)
    assert record["dirty"] is True and record["source-diff"]["file"] == "source.diff"
    patch = (folder / "source.diff").read_bytes()
    import hashlib
    assert record["source-diff"]["sha256"] == hashlib.sha256(patch).hexdigest()
    assert staged() == index_before  # the checkout's own index holds what it held: nothing was added to it
    assert git_state(root)["dirty"] is True and b"run.log" not in patch
    rebuilt = _checkout(tmp_path, "rebuilt")  # the same commit elsewhere, the patch applied
    subprocess.run(["git", "-C", str(rebuilt), "apply", str(folder / "source.diff")], check=True)
    for name in ("a.py", "pkg/new.py", "blob.bin"):
        assert (rebuilt / name).read_bytes() == (root / name).read_bytes(), name
    assert not (rebuilt / "gone.py").exists()


@needs_git
def test_a_patch_too_large_to_keep_is_named_not_written(tmp_path, monkeypatch):
    root = _checkout(tmp_path, "run")
    (root / "data.bin").write_bytes(b"x" * 2048)
    monkeypatch.setattr(provenance, "MAX_DIFF_BYTES", 1024)
    record = provenance.write_source_diff(git_state(root), tmp_path, root=root)
    assert record["source-diff"]["file"] is None and "over 1024: not kept" in record["source-diff"]["why"]
    assert not (tmp_path / "source.diff").exists()
    clean = _checkout(tmp_path, "clean")
    assert "source-diff" not in provenance.write_source_diff(git_state(clean), tmp_path, root=clean)


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
