"""Reading a results folder the way a monitor beside a live run must: safely, boundedly, tolerantly.

Every file is opened relative to the results root, one path component at a time with `O_NOFOLLOW`, so a symlink
anywhere under the root (to another user's files, to /etc) is refused and nothing outside the root is read;
only regular files are read (a FIFO would block), and at most `MAX_FILE_BYTES` of each (a JSON-lines file past
that is read from its end). A JSON-lines file may be being written: a last line without its newline is
half-written and waits for the next read, a line that is not a JSON object is skipped and counted, never
fatal. A file replaced by a run's restart or resume (a new inode) is read afresh: reads are cached by
(inode, size, modification time).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

MAX_FILE_BYTES = 32 * 1024 * 1024   # per file: a 300-round run's metrics.jsonl is well under 1 MB
MAX_LINE_BYTES = 4 * 1024 * 1024    # a longer JSON line is skipped as malformed
MAX_DEPTH = 3                       # how deep under the root run folders and studies are looked for
MAX_ENTRIES = 20_000                # directory entries looked at per scan (a diffusion run keeps a grid per round)
MAX_FOLDERS = 200                   # run folders and studies shown

RUN_MARKERS = ("config.json", "metrics.jsonl", "summary.json")  # a folder holding one of them is a run's
STUDY_MARKER = "ledger.jsonl"                                   # a study's --out


class Unreadable(Exception):
    """A results file the monitor refuses or cannot read: a symlink, not a regular file, too big, no permission."""


def _open_under(root: str, rel: PurePosixPath, directory: bool = False) -> int:
    """An fd of root/rel opened without following any symlink below the root; raises Unreadable."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        parts = rel.parts
        for i, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise Unreadable(f"{rel}: not a plain path under the results folder")
            last = i == len(parts) - 1
            extra = (os.O_DIRECTORY if (directory or not last) else os.O_NONBLOCK)
            try:
                child = os.open(part, flags | extra, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as err:  # ELOOP: a symlink; ENOTDIR, EACCES: not a folder, another user's
                raise Unreadable(f"{rel}: {err.strerror} (symlinks are not followed)") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def scan(root: str) -> list[tuple[str, str]]:
    """(kind, relative path) of each run folder ("run") and study ("study") under root, root first.

    Symlinked and hidden directories are not entered; at most MAX_DEPTH levels, MAX_ENTRIES entries and
    MAX_FOLDERS folders. A study's own runs (under its `runs/`) are runs of the list too.
    """
    found: list[tuple[str, str]] = []
    seen = 0
    queue: list[PurePosixPath] = [PurePosixPath(".")]
    while queue and len(found) < MAX_FOLDERS:
        rel = queue.pop(0)
        try:
            fd = _open_under(root, PurePosixPath(*rel.parts), directory=True) if rel.parts else \
                os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (Unreadable, OSError):
            continue
        try:
            with os.scandir(fd) as entries:
                names: dict[str, bool] = {}  # name -> is a real directory
                for entry in entries:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        break
                    names[entry.name] = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        finally:
            os.close(fd)
        key = rel.as_posix()
        if STUDY_MARKER in names and not names[STUDY_MARKER]:
            found.append(("study", key))
        elif any(marker in names and not names[marker] for marker in RUN_MARKERS):
            found.append(("run", key))
            continue  # a run folder holds no other runs
        if len(rel.parts) < MAX_DEPTH:
            queue += [rel / name for name, is_dir in sorted(names.items()) if is_dir and not name.startswith(".")]
    return found


@dataclass
class JsonLines:
    """A JSON-lines file's objects, and what was left out: malformed lines (counted) and a half-written tail."""

    records: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    partial: bool = False     # the last line had no newline yet
    truncated: bool = False   # the file was longer than MAX_FILE_BYTES: its first part was not read


def parse_json_lines(data: bytes, truncated: bool = False) -> JsonLines:
    """Objects of a JSON-lines text; a line that is not a JSON object is counted in `malformed`."""
    result = JsonLines(truncated=truncated)
    lines = data.split(b"\n")
    if truncated:
        lines = lines[1:]  # the read began inside a line
    if lines and lines[-1]:
        result.partial = True  # a round being written: its line comes whole on a later read
    for line in lines[:-1]:
        if not line.strip():
            continue
        try:
            value = json.loads(line) if len(line) <= MAX_LINE_BYTES else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            value = None
        if isinstance(value, dict):
            result.records.append(value)
        else:
            result.malformed += 1
    return result


class FolderReader:
    """Reads files under one results root, caching each parse until the file changes (inode, size, mtime)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int, int], Any]] = {}
        self._lock = threading.Lock()

    def _read(self, rel: str, kind: str) -> Any:
        """The parsed file (kind "json", "jsonl" or "text"); raises Unreadable, or FileNotFoundError when absent."""
        fd = _open_under(self.root, PurePosixPath(rel))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Unreadable(f"{rel}: not a regular file")
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            with self._lock:
                cached = self._cache.get((rel, kind))
            if cached is not None and cached[0] == key:
                return cached[1]
            truncated = info.st_size > MAX_FILE_BYTES
            if truncated and kind != "jsonl":
                raise Unreadable(f"{rel}: {info.st_size} bytes, more than the monitor reads ({MAX_FILE_BYTES})")
            if truncated:
                os.lseek(fd, info.st_size - MAX_FILE_BYTES, os.SEEK_SET)
            data = _read_all(fd, MAX_FILE_BYTES)
        finally:
            os.close(fd)
        if kind == "jsonl":
            value: Any = parse_json_lines(data, truncated)
        elif kind == "json":
            try:
                value = json.loads(data)
            except (ValueError, UnicodeDecodeError, RecursionError) as err:
                value = Unreadable(f"{rel}: not JSON ({type(err).__name__})")
        else:
            value = data.decode("utf-8", errors="replace")
        with self._lock:
            self._cache[(rel, kind)] = (key, value)
        return value

    def json(self, rel: str) -> Any:
        """A JSON file's value; None when absent; an Unreadable (returned, not raised) naming why it cannot be used."""
        try:
            value = self._read(rel, "json")
        except FileNotFoundError:
            return None
        except Unreadable as err:
            return err
        return value

    def json_lines(self, rel: str) -> JsonLines:
        """A JSON-lines file's objects (empty when absent or refused)."""
        try:
            return self._read(rel, "jsonl")
        except (FileNotFoundError, Unreadable):
            return JsonLines()

    def text(self, rel: str) -> str | None:
        """A text file, None when absent or refused."""
        try:
            return self._read(rel, "text")
        except (FileNotFoundError, Unreadable):
            return None

    def names(self, rel: str) -> list[str]:
        """The entries of a directory under the root (empty when absent or refused)."""
        try:
            fd = _open_under(self.root, PurePosixPath(rel), directory=True)
        except (FileNotFoundError, Unreadable):
            return []
        try:
            return sorted(os.listdir(fd))[:MAX_ENTRIES]
        finally:
            os.close(fd)

    def lock_held(self, rel: str) -> bool | None:
        """Whether a process holds the run's `.lock` (a run is writing the folder); None when it cannot be told.

        Read from /proc/locks (the kernel's table of held locks) by the lock file's device and inode: the
        monitor never takes the lock itself, which could make a starting run refuse its folder.
        """
        try:
            fd = _open_under(self.root, PurePosixPath(rel) / ".lock")
        except (FileNotFoundError, Unreadable):
            return False
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            with open("/proc/locks") as handle:
                table = handle.read(MAX_FILE_BYTES)
        except OSError:
            return None
        device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}"
        for line in table.splitlines():
            fields = line.split()  # "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF"; "->": a waiter
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == f"{device}:{info.st_ino}":
                return True
        return False


def _read_all(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = os.read(fd, min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
