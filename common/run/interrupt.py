"""Ctrl-C and SIGTERM end a run cleanly: stop at the next poll, record where it stopped, keep the checkpoint.

Python turns SIGINT into a KeyboardInterrupt in the main thread only. Under
`fedsynth run` the main thread runs Flower's simulation engine and the
ServerApp runs in another thread, so the exception lands in the engine and the
ServerApp keeps waiting for replies (by default for 3 x `round-timeout`).
`install_handlers` (called by the CLI in its main thread) replaces that: the
first SIGINT or SIGTERM sets `STOP`; the ServerApp checks it at every reply
poll, between rounds and in the handshake wait (`raise_if_stopped`), and
raises `RunInterrupted`. The run recorder then checkpoints its last finished
round, `RunResults` writes summary.json with status `interrupted`, the
ServerApp's thread ends, Flower stops its engine, and the CLI exits 128 + the
signal's number (130 for SIGINT, 143 for SIGTERM) after printing the command
that resumes the run.

Shutting down Flower's engine waits for the ClientApps still training, which
may take a whole round. So once the run has recorded where it stopped
(`record_stopped`, called when summary.json is written), the process waits
`settle_s` seconds for a normal exit and then ends itself with the same code,
after the CLI's `on_expiry` printed its report. A second signal, or a run that
has not recorded its stop `grace_s` seconds after the first signal, ends the
process at once (the checkpoint on disk is whole: it is written atomically).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STOP = threading.Event()
STOPPED = threading.Event()  # the run wrote its interrupted summary
_received: list[int] = []
_stopped_at: dict[str, Any] = {}


class RunInterrupted(RuntimeError):
    """The run was asked to stop by a signal; it stopped after `last_round` finished rounds."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal_name(signum)}")
        self.signum = signum
        self.last_round: int | None = None
        self.folder: Path | None = None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """The shell's code for a process ended by a signal: 128 + its number (SIGINT 130, SIGTERM 143)."""
    return 128 + signum


def request_stop(signum: int) -> None:
    """Ask the run in this process to stop (what the signal handler does)."""
    if not _received:
        _received.append(signum)
    STOP.set()


def raise_if_stopped() -> None:
    """Raise RunInterrupted when a stop was requested (the ServerApp calls this wherever it waits)."""
    if STOP.is_set():
        raise RunInterrupted(_received[0] if _received else signal.SIGINT)


def record_stopped(folder: Path, last_round: int) -> None:
    """The interrupted run's folder and last finished round (its summary is written)."""
    _stopped_at.update({"folder": folder, "last-round": last_round})
    STOPPED.set()


def stopped_at() -> dict[str, Any]:
    """{"folder", "last-round"} of the interrupted run, once recorded."""
    return dict(_stopped_at)


def reset() -> None:
    """Forget a stop request (for a process that runs several runs, and for tests)."""
    STOP.clear()
    STOPPED.clear()
    _received.clear()
    _stopped_at.clear()


def install_handlers(on_expiry: Callable[[int], None] | None = None, grace_s: float = 30.0,
                     settle_s: float = 3.0) -> dict[int, Any]:
    """SIGINT and SIGTERM request a stop; the process ends itself `settle_s` s after the run recorded it.

    A second signal, or no record within `grace_s` s, ends it at once. `on_expiry(signum)` runs just before
    a forced end (the CLI prints where the run stopped). Call from the main thread. Returns the previous
    handlers (for `restore_handlers`).
    """

    def force_exit(signum: int) -> None:
        if on_expiry is not None:
            try:
                on_expiry(signum)
            except Exception:  # noqa: BLE001 - the report is best effort: the exit must happen
                pass
        os._exit(exit_code(signum))

    def watchdog(signum: int) -> None:
        if STOPPED.wait(grace_s):
            time.sleep(settle_s)  # the engine's own shutdown, when it is quick
        force_exit(signum)

    def handler(signum: int, frame: Any) -> None:
        if STOP.is_set():
            force_exit(_received[0] if _received else signum)
        request_stop(signum)
        threading.Thread(target=watchdog, args=(signum,), daemon=True).start()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_handlers(previous: dict[int, Any]) -> None:
    """Put back what `install_handlers` replaced."""
    for sig, old in previous.items():
        signal.signal(sig, old)
