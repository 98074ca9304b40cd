"""Progress of a long phase in Flower's log: a line every tenth of the work, or every 30 s, whichever comes first.

The server's long phases (the final FID's sampling, FedDDPM's auxiliary-set sampling, FedSynSAM's and
DynaFed's distillation) would otherwise run for minutes without a line. Each says first how much it will do
(`start`), then how far it is (`advance`), so an operator sees the phase move and can judge its length.
"""

from __future__ import annotations

import time
from logging import INFO
from typing import Callable

from flwr.common.logger import log


class Progress:
    """Counts `total` units of a phase named `label` and logs how far it is, at most every tenth or `seconds`."""

    def __init__(self, label: str, total: int, unit: str, *, seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, emit: Callable[..., None] = log) -> None:
        self.label, self.total, self.unit = label, max(int(total), 0), unit
        self.seconds, self.clock, self.emit = seconds, clock, emit
        self.done = 0
        self.started = self.last_logged = clock()
        self.next_tenth = 1

    def start(self, detail: str = "") -> None:
        """Say what the phase will do: '{label}: {total} {unit}{detail}'."""
        self.emit(INFO, "%s: %d %s%s", self.label, self.total, self.unit, detail)

    def advance(self, units: int) -> None:
        """`units` more are done: log when a new tenth is reached or `seconds` passed since the last line."""
        self.done = min(self.done + int(units), self.total)
        now = self.clock()
        tenth = (10 * self.done) // self.total if self.total else 10
        if tenth >= self.next_tenth or now - self.last_logged >= self.seconds:
            self.next_tenth = tenth + 1
            self.last_logged = now
            self.emit(INFO, "%s: %d/%d %s (%d%%), %.0f s", self.label, self.done, self.total, self.unit,
                      100 * self.done // max(self.total, 1), now - self.started)
