"""The ledger of a study: one JSON line per finished run, the study's portable memory.

Each entry holds the run's key, cell, phase, seed, grid point, config, exit
code, scores and a thinned curve: a few KB, small enough to commit beside the
report. A study run again skips every key in its ledger, so a killed study
finishes the rest, and a committed ledger lets another machine continue the
study or remake its report without the runs' folders. Lines are appended and
flushed one at a time; a line cut short by a kill is ignored on reading.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_CURVE_POINTS = 200


def thin(points: list[list[float]], limit: int = MAX_CURVE_POINTS) -> list[list[float]]:
    """At most `limit` points of a curve, evenly spaced, the last one always kept."""
    if len(points) <= limit:
        return points
    step = len(points) / limit
    picked = [points[int(i * step)] for i in range(limit - 1)]
    return [*picked, points[-1]]


class Ledger:
    """An append-only JSON-lines file of finished runs, keyed by run key (the last entry of a key wins)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            for entry in self._read():
                self.entries[entry["key"]] = entry

    def _read(self) -> Iterator[dict[str, Any]]:
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the tail of a line cut by a kill
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                yield entry

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def append(self, entry: dict[str, Any]) -> None:
        """Record a finished run: written and flushed to disk before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, sort_keys=True, allow_nan=True)
        with open(self.path, "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.entries[entry["key"]] = entry
