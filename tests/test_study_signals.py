"""A study passes SIGINT/SIGTERM to its workers, starts no new run, and never leaves a worker behind (issue 34)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.run import interrupt
from common.run.interrupt import RunInterrupted
from fedsynth.study.ledger import Ledger
from fedsynth.study.runner import RunOutcome, StudyPaths, run_study
from fedsynth.workers import live_workers, run_worker, signal_workers

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# a stand-in for a run: exits 143 on SIGTERM, as `fedsynth run` does after stopping cleanly
SLEEPER = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(60)"


@pytest.fixture(autouse=True)
def no_stop_left_over():
    interrupt.reset()
    yield
    interrupt.reset()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie (exited, not yet reaped by pid 1) counts as gone
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split(")")[-1].split()[0] == "Z"


def test_a_signal_to_the_study_reaches_its_worker():
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(run_worker([sys.executable, "-c", SLEEPER], env=ENV)))
    thread.start()
    deadline = time.monotonic() + 20
    while not live_workers():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # the worker has installed its handler
    assert signal_workers(signal.SIGTERM) == 1
    thread.join(timeout=10)
    assert codes == [143] and not live_workers()


def test_a_worker_whose_study_is_killed_stops_itself(tmp_path):
    pid_file = tmp_path / "worker.pid"
    worker = ("import os, sys, time; from fedsynth.workers import stop_when_parent_dies; stop_when_parent_dies(0.2); "
              f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    study = ("import subprocess, sys, time; "
             f"subprocess.Popen([sys.executable, '-c', {worker!r}], start_new_session=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", study], env=ENV, cwd=REPO)
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()):
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    worker_pid = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)  # the study dies outright
    parent.wait()
    deadline = time.monotonic() + 5
    while not gone(worker_pid):
        assert time.monotonic() < deadline, "the worker outlived its study"
        time.sleep(0.1)


def test_a_signalled_study_records_no_interrupted_run_and_starts_no_new_one(tmp_path, tiny_data_dir):
    from test_study import tiny_study

    study = tiny_study(tmp_path, tiny_data_dir)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    calls: list = []

    def executor(spec, overrides, log_path):
        calls.append(spec.key)
        interrupt.request_stop(signal.SIGINT)  # the study got Ctrl-C while this run was under way
        return RunOutcome(130, 1.0)  # the worker stopped cleanly, keeping its checkpoint

    with pytest.raises(RunInterrupted):
        run_study(study, paths, executor, write=lambda line: None)
    assert len(calls) == 1  # no run started after the signal
    assert len(Ledger(paths.ledger).entries) == 0  # an interrupted run is not a result: it runs again next time
