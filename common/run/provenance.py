"""What produced a result: the project's version and commit, the library versions and the device.

Every results folder (`provenance.json`, common/run/results.py) and every study
ledger entry (fedsynth/study/runner.py) carry this record beside the full
effective config (`config.json`), so a number can be traced to the code and the
machine that made it. The commit comes from the checkout the code was imported
from: `git rev-parse HEAD` and `git status --porcelain` (is a tracked file
modified, or a file git does not ignore untracked? a run imports those too),
each with a short timeout. An install that is not a git checkout, a machine
without git, or a git that fails or hangs gives commit "unknown" and `dirty`
None with the reason in `git`: the record is never a guess, and gathering it
never fails a run.

A run from a changed tree keeps the change: `write_source_diff` writes the
tree's difference from its commit as one binary patch beside provenance.json
(`source.diff`, untracked files that git does not ignore included), and the
record names it with its sha256, so `git apply` on a checkout of the commit
rebuilds the tree the run came from. A patch over `MAX_DIFF_BYTES` (untracked
data, say) is not kept, and the record says why.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

UNKNOWN = "unknown"
GIT_TIMEOUT_S = 5.0
# The checkout this code was imported from: common/run/provenance.py -> the repository root.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIFF_FILE = "source.diff"  # a changed tree's patch against its commit, beside provenance.json
MAX_DIFF_BYTES = 16 << 20  # a larger patch (untracked data, a build) is not kept; the record says so
DIFF_TIMEOUT_S = 30.0


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
    status = _git(root, "status", "--porcelain")
    return {"commit": head.strip(), "dirty": None if status is None else bool(status.strip()),
            "git": "ok" if status is not None else f"git status failed in {root}"}


def _git_bytes(root: Path, args: list[str], env: dict[str, str] | None = None, stdin: bytes = b"") -> bytes | None:
    """git's stdout as bytes (None when git fails or takes longer than DIFF_TIMEOUT_S)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run([git, "-C", str(root), *args], capture_output=True, timeout=DIFF_TIMEOUT_S,
                              check=False, input=stdin, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def source_diff(root: Path = SOURCE_ROOT) -> tuple[bytes | None, str]:
    """(the checkout's changes against HEAD as one binary patch, "ok"), or (None, why it cannot be kept).

    Untracked files that git does not ignore are in it: they are marked intent-to-add in a copy of the index
    (the checkout's own index and objects are left as they are), so `git diff HEAD` shows them as new files.
    """
    listed = _git_bytes(root, ["ls-files", "--others", "--exclude-standard", "-z"])
    index = _git(root, "rev-parse", "--git-path", "index")
    if listed is None or index is None:
        return None, f"git could not list the changes in {root}"
    untracked = [name for name in listed.split(b"\0") if name]
    size = sum(os.lstat(os.path.join(root, os.fsdecode(name))).st_size for name in untracked)
    if size > MAX_DIFF_BYTES:
        return None, f"{len(untracked)} untracked file(s) of {size} bytes, over {MAX_DIFF_BYTES}: not kept"
    with tempfile.TemporaryDirectory(prefix="fedsynth-index-") as tmp:
        own_index = Path(tmp) / "index"
        source = Path(index.strip()) if Path(index.strip()).is_absolute() else root / index.strip()
        if source.is_file():
            shutil.copyfile(source, own_index)
        env = {**os.environ, "GIT_INDEX_FILE": str(own_index)}
        if untracked and _git_bytes(root, ["add", "--intent-to-add", "--pathspec-from-file=-", "--pathspec-file-nul"],
                                    env, b"\0".join(untracked)) is None:
            return None, f"git could not mark the untracked files in {root}"
        patch = _git_bytes(root, ["diff", "--binary", "HEAD"], env)
    if patch is None:
        return None, f"git diff failed in {root}"
    if len(patch) > MAX_DIFF_BYTES:
        return None, f"the patch is {len(patch)} bytes, over {MAX_DIFF_BYTES}: not kept"
    return patch, "ok"


def write_source_diff(record: dict[str, Any], folder: Path, name: str = SOURCE_DIFF_FILE,
                      root: Path = SOURCE_ROOT) -> dict[str, Any]:
    """The record with `source-diff` added when it is of a changed tree: the patch written to `folder / name` and
    named with its sha256, or why it is not there. A record of a clean tree is returned as it is."""
    if not record.get("dirty"):
        return record
    patch, why = source_diff(root)
    if patch is None:
        return {**record, "source-diff": {"file": None, "why": why}}
    (Path(folder) / name).write_bytes(patch)
    return {**record, "source-diff": {"file": name, "bytes": len(patch), "sha256": hashlib.sha256(patch).hexdigest()}}


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
