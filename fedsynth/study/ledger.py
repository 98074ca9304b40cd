"""The ledger of a study: one JSON line per finished run, the study's portable memory.

Each entry holds the run's key, cell, phase, seed, grid point, config, exit
code, scores and a thinned curve: a few KB, small enough to commit beside the
report. A study run again skips every key in its ledger, so a killed study
finishes the rest, and a committed ledger lets another machine continue the
study or remake its report without the runs' folders. Lines are appended and
flushed one at a time; a line cut short by a kill is ignored on reading.

Several study processes may share one ledger (hosts on shared storage, or two
processes on one host): every append holds an exclusive `fcntl.flock` on the
side file `ledger.jsonl.lock`, re-reads what the others appended and first
repairs a torn last line (a process killed mid-write), so the next line never
glues onto it and no whole entry is lost. On NFS, Linux takes flock as an NFS
byte-range lock, so it holds across hosts; the torn fragment is kept in
`ledger.jsonl.torn`.

An entry whose fields have the wrong types (a hand-edited or damaged line,
e.g. `"scores": "x"`) is left out and listed in `malformed` with its line and
reason, so the report never crashes on it and its run counts as not done.

A ledger checks itself on every read: an entry whose key is not the digest of
what it records (its effective config and run inputs, or for old entries what
their key version digested: `fedsynth.study.effective.key_problem`) was edited
after its run; it is left out the same way (never reused, never in a report)
and named in `malformed`. `Ledger(path, check_keys=False)` reads the file alone,
for tests of the file's mechanics.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedsynth.study.effective import key_problem

MAX_CURVE_POINTS = 200


def thin(points: list[list[float]], limit: int = MAX_CURVE_POINTS) -> list[list[float]]:
    """At most `limit` points of a curve, evenly spaced, the last one always kept."""
    if len(points) <= limit:
        return points
    step = len(points) / limit
    picked = [points[int(i * step)] for i in range(limit - 1)]
    return [*picked, points[-1]]


class LedgerError(ValueError):
    """The ledger's path holds something that is not a ledger file (a directory, a device): named, not read as empty."""


class Ledger:
    """An append-only JSON-lines file of finished runs, keyed by run key (the last entry of a key wins).

    A path that does not exist yet is an empty ledger; a path that exists but is
    not a regular file raises LedgerError naming it (reading it as empty would
    run the whole study again and append to nothing).
    """

    def __init__(self, path: Path, check_keys: bool = True) -> None:
        self.path = Path(path)
        self.check_keys = check_keys
        self.entries: dict[str, dict[str, Any]] = {}
        self.malformed: list[str] = []  # "line N: reason" of each entry left out
        self.reload()

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @property
    def torn_path(self) -> Path:
        return self.path.with_name(self.path.name + ".torn")

    def reload(self) -> None:
        """Read the file again: the entries other processes appended since."""
        self.entries = {}
        self.malformed = []
        if self.path.exists() and not self.path.is_file():
            kind = "a directory" if self.path.is_dir() else "not a regular file"
            raise LedgerError(f"the ledger path {self.path} is {kind}; a study's ledger is a JSON-lines file "
                              "(ledger.jsonl): move what is there, or pass another --out")
        if self.path.is_file():
            for entry in self._read():
                self.entries[entry["key"]] = entry

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the ledger's lock (exclusive, waiting for it): no other process appends meanwhile."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def repair(self) -> str | None:
        """Mend a last line without its newline (call holding the lock); what was done, or None when intact.

        A whole entry that only lacks its newline gets it; a fragment (a write
        cut short) moves to `ledger.jsonl.torn` and the file is cut back to its
        last whole line.
        """
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return None
        with open(self.path, "rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) == b"\n":
                return None
            handle.seek(0)
            data = handle.read()  # the position is now the end, where a missing newline goes
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            if _is_entry(tail):
                handle.write(b"\n")
                _sync(handle)
                return "its last entry lacked its newline; added"
            with open(self.torn_path, "ab") as torn:
                torn.write(tail + b"\n")
            handle.truncate(cut)
            _sync(handle)
        return f"a line cut short by a kill ({len(tail)} bytes) was moved to {self.torn_path}"

    def _read(self) -> Iterator[dict[str, Any]]:
        """The file's entries; every line that is not one is recorded in `malformed` (line number and why), except a
        last line without its newline that is not JSON: the tail of a write cut by a kill (`repair` moves it)."""
        data = self.path.read_bytes()
        lines = data.splitlines()
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.malformed.append(f"line {number}: not UTF-8 text")
                continue
            except json.JSONDecodeError:
                if number == len(lines) and not data.endswith(b"\n"):
                    continue  # the tail of a line cut by a kill
                self.malformed.append(f"line {number}: not JSON")
                continue
            if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)):
                self.malformed.append(f"line {number}: not a ledger entry (a JSON object with a text 'key')")
                continue
            reason = malformed_reason(entry)
            if reason is not None:
                self.malformed.append(f"line {number}: {reason}")
                continue
            reason = key_problem(entry) if self.check_keys else None
            if reason is not None:
                self.malformed.append(f"line {number}: entry {entry['key']} ({entry.get('cell')} {entry.get('phase')} "
                                      f"seed {entry.get('seed')}): {reason}; refused for reuse and left out of reports")
                continue
            yield entry

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def append(self, entry: dict[str, Any]) -> None:
        """Record a finished run under the lock: written and flushed to disk before returning."""
        with self.locked():
            self.append_locked(entry)

    def append_locked(self, entry: dict[str, Any]) -> None:
        """`append` for a caller that holds the lock; the other processes' entries are read in too."""
        self.repair()
        self.reload()
        line = json.dumps(entry, sort_keys=True, allow_nan=True)
        with open(self.path, "a") as handle:
            handle.write(line + "\n")
            _sync(handle)
        self.entries[entry["key"]] = entry


_DICT_FIELDS = ("scores", "curves", "config", "grid-point")
_NUMBER_FIELDS = ("seconds", "rounds", "seed")


def malformed_reason(entry: dict[str, Any]) -> str | None:
    """Why a ledger entry cannot be used (a field of the wrong type), or None when it can."""
    for name in _DICT_FIELDS:
        if name in entry and not isinstance(entry[name], dict):
            return f"{name!r} must be a table, not {type(entry[name]).__name__}"
    for metric, scores in entry.get("scores", {}).items():
        if not isinstance(scores, dict):
            return f"scores of {metric!r} must be a table, not {type(scores).__name__}"
        for name, value in scores.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                return f"score {metric}/{name} must be a number or null, not {value!r}"
    for metric, points in entry.get("curves", {}).items():
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            return f"curve {metric!r} must be a list of [round, value] pairs"
    if "exit-code" in entry and (isinstance(entry["exit-code"], bool) or not isinstance(entry["exit-code"], int)):
        return f"'exit-code' must be an integer, not {entry['exit-code']!r}"
    for name in _NUMBER_FIELDS:
        if name in entry and entry[name] is not None and (isinstance(entry[name], bool)
                                                           or not isinstance(entry[name], (int, float))):
            return f"{name!r} must be a number, not {entry[name]!r}"
    return None


def _is_entry(raw: bytes) -> bool:
    try:
        entry = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(entry, dict) and isinstance(entry.get("key"), str)


def _sync(handle: Any) -> None:
    handle.flush()
    os.fsync(handle.fileno())
