"""What produced a result: the project's version and commit, the library versions and the device.

Every results folder (`provenance.json`, common/run/results.py) and every study
ledger entry (fedsynth/study/runner.py) carry this record beside the full
effective config (`config.json`), so a number can be traced to the code and the
machine that made it. The commit comes from the checkout the code was imported
from: `git rev-parse HEAD` and `git status --porcelain --untracked-files=no`
(is a tracked file modified?), each with a short timeout. An install that is
not a git checkout, a machine without git, or a git that fails or hangs gives
commit "unknown" and `dirty` None with the reason in `git`: the record is
never a guess, and gathering it never fails a run.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

UNKNOWN = "unknown"
GIT_TIMEOUT_S = 5.0
# The checkout this code was imported from: common/run/provenance.py -> the repository root.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def package_version(name: str) -> str:
    """The installed distribution's version, or "unknown" when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def _git(root: Path, *args: str) -> str | None:
    """git's stdout in `root`, or None when git is missing, fails or takes longer than GIT_TIMEOUT_S."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(root: Path = SOURCE_ROOT) -> dict[str, Any]:
    """{"commit": full hash or "unknown", "dirty": a tracked file differs from it (None: unknown), "git": why unknown}.

    Only a folder with its own `.git` (a directory, or a worktree's file) is asked,
    so an install inside some other repository (a site-packages under a user's
    project) never reports that repository's commit.
    """
    if not (root / ".git").exists():
        return {"commit": UNKNOWN, "dirty": None, "git": f"{root} is not a git checkout (an installed package)"}
    if shutil.which("git") is None:
        return {"commit": UNKNOWN, "dirty": None, "git": "git is not installed"}
    head = _git(root, "rev-parse", "HEAD")
    if head is None or not head.strip():
        return {"commit": UNKNOWN, "dirty": None, "git": f"git rev-parse HEAD failed in {root}"}
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": head.strip(), "dirty": None if status is None else bool(status.strip()),
            "git": "ok" if status is not None else f"git status failed in {root}"}


def describe_device(requested: str = "auto") -> str:
    """The device a run on this machine uses for `device = requested`: "cpu" or "cuda:N (its name)"."""
    import torch

    if requested == "cpu" or not torch.cuda.is_available():
        return "cpu" if requested in ("auto", "cpu") else f"{requested} (not available on this machine)"
    index = int(requested.split(":", 1)[1]) if requested.startswith("cuda:") else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return f"cuda:{index} (not available on this machine)"
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def gather(device: str = "auto", root: Path = SOURCE_ROOT) -> dict[str, Any]:
    """The provenance record of a run started now on this machine with `device` (the run-config key)."""
    return {
        "fedsynth-version": package_version("fedsynth"),
        **git_state(root),
        "python": platform.python_version(),
        "flwr": package_version("flwr"),
        "torch": package_version("torch"),
        "device": describe_device(device),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def commit_label(record: dict[str, Any] | None) -> str:
    """A short label of a record's commit: "ca6f55a", "ca6f55a+dirty", "unknown" or "not recorded"."""
    if not record:
        return "not recorded"
    commit = str(record.get("commit") or UNKNOWN)
    if commit == UNKNOWN:
        return UNKNOWN
    return commit[:7] + ("+dirty" if record.get("dirty") else "")
