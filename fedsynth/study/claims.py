"""Claims on study runs: several `fedsynth study` processes share one study folder and never run a run twice.

A study spread over hosts is one `--out` folder on shared storage and one
`fedsynth study` per host. Before a process starts a run it claims it: holding
the ledger's lock (`Ledger.locked`) it reads the ledger again, and takes the run
only when the run's entry is still what it planned on (absent, or the failed
entry it retries) and nobody holds the run's claim file
`claims/<run key>.claim` (an exclusive `fcntl.flock`, kept for the length of
the run; the file says host, pid and start time, for people). The claimant
records the finished run and drops its claim under the same lock, so another
process sees either the claim or the entry, never neither. A claim dies with
its process (the kernel drops the flock), so a killed host's runs are taken by
the next process that looks: no stale-claim timeouts.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fedsynth.study.ledger import Ledger


@dataclass
class Claim:
    """A run this process holds: its claim file and the open, locked handle on it."""

    key: str
    path: Path
    handle: IO[str]


class Claims:
    """The claims of one study folder, and the ledger they guard."""

    def __init__(self, ledger: Ledger, folder: Path) -> None:
        self.ledger = ledger
        self.folder = Path(folder)

    def claim(self, key: str, planned: dict[str, Any] | None) -> Claim | None:
        """This process's claim on run `key`; None when another process finished, changed or holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.ledger.locked():
            self.ledger.reload()
            if self.ledger.get(key) != planned:
                return None  # recorded (or recorded again) by another process since this one planned
            path = self.folder / f"{key}.claim"
            handle = open(path, "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                return None  # under way in another process
            handle.truncate(0)
            handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                     "since": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
            handle.flush()
            return Claim(key, path, handle)

    def record(self, claim: Claim, entry: dict[str, Any]) -> None:
        """Append the finished run's entry and drop the claim, in one hold of the ledger's lock."""
        with self.ledger.locked():
            self.ledger.append_locked(entry)
            self._drop(claim)

    def release(self, claim: Claim) -> None:
        """Drop a claim without an entry (the run is not a result): any process may take the run again."""
        with self.ledger.locked():
            self._drop(claim)

    def _drop(self, claim: Claim) -> None:
        # Under the ledger's lock, so no process is between opening this file and locking it.
        claim.path.unlink(missing_ok=True)
        claim.handle.close()
