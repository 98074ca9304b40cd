"""A study's child processes never outlive it, and a signal to the study reaches every one of them.

`fedsynth study` runs each run (and each sharpness measurement) in a process of
its own. Killed with SIGKILL, the study used to leave its worker running under
pid 1, holding the run's folder, so a restarted study was refused "in use by
another run". Two mechanisms, one for each way a study ends:

- The study passes SIGINT and SIGTERM on (`forward_signals`): every live worker
  gets the signal, stops at its next reply poll, checkpoints and exits 130/143
  (common/run/interrupt.py); the study starts no new run and exits the same way.
  Workers run in sessions of their own, so a Ctrl-C in the terminal reaches
  them once, through the study, not twice.
- A worker watches its parent (`stop_when_parent_dies`): when the study is gone
  (SIGKILL, OOM killer, a crash) the worker is re-parented, notices within a
  second and sends itself SIGTERM, which ends it cleanly as above. A polling
  thread rather than Linux's PR_SET_PDEATHSIG, because that fires when the
  *thread* that started the child exits, and study workers are started from a
  pool's threads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

from common.run.interrupt import request_stop

_LIVE: set[subprocess.Popen] = set()
_LOCK = threading.Lock()


def run_worker(command: list[str], **popen_kwargs: Any) -> int:
    """Run `command` to its end as a worker the study can signal; returns its exit code."""
    process = subprocess.Popen(command, start_new_session=True, **popen_kwargs)
    with _LOCK:
        _LIVE.add(process)
    try:
        return process.wait()
    except BaseException:
        process.terminate()  # the study itself is going away: never leave the worker behind
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    finally:
        with _LOCK:
            _LIVE.discard(process)


def live_workers() -> list[subprocess.Popen]:
    with _LOCK:
        return [p for p in _LIVE if p.poll() is None]


def signal_workers(signum: int) -> int:
    """Send `signum` to every live worker; returns how many got it."""
    sent = 0
    for process in live_workers():
        try:
            process.send_signal(signum)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


def forward_signals() -> dict[int, Any]:
    """SIGINT/SIGTERM: request the study's stop and pass the signal to every worker (main thread only).

    A second signal kills the workers at once. Returns the previous handlers.
    """

    def handler(signum: int, frame: Any) -> None:
        from common.run.interrupt import STOP

        if STOP.is_set():
            signal_workers(signal.SIGKILL)
            return
        request_stop(signum)
        signal_workers(signum)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def stop_when_parent_dies(interval_s: float = 1.0, signum: int = signal.SIGTERM) -> threading.Thread:
    """Start a daemon thread that sends this process `signum` once its parent process is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    thread.start()
    return thread
