"""Ctrl-C and SIGTERM end `fedsynth run` cleanly (issue 34, common/run/interrupt.py).

The fast tests drive the round loop in process with a stop request; the slow
ones send SIGINT / SIGTERM to `fedsynth run` in Flower's simulation engine in
the middle of a round and check that it exits within 10 s with 130 / 143,
summary.json `interrupted` with its last finished round, the checkpoint kept,
and the resume command printed, which then finishes the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.run import interrupt
from common.run.interrupt import RunInterrupted
from fedsynth.inprocess import InProcessGrid, run_federation

REPO = Path(__file__).resolve().parent.parent


class StoppingGrid(InProcessGrid):
    """Requests a stop (as the signal handler does) while the given round's replies are out."""

    def __init__(self, *args, stop_in_round: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stop_in_round = stop_in_round

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if messages and messages[0].metadata.message_type == "train" and self._round_of(messages[0]) == self.stop_in_round:
            interrupt.request_stop(signal.SIGTERM)
            interrupt.raise_if_stopped()  # what the poll loop does with a real grid
        return replies


@pytest.fixture(autouse=True)
def no_stop_left_over():
    interrupt.reset()
    yield
    interrupt.reset()


def config(tmp_path: Path, data_dir: Path, **extra) -> dict:
    return {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
            "run-name": "run", "num-server-rounds": 4, "local-steps": 2, "batch-size": 16, "model": "mlp", **extra}


def test_a_stop_mid_round_writes_interrupted_and_checkpoints_the_last_finished_round(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, **{"checkpoint-every": 5})  # no checkpoint of round 2 before the stop
    with pytest.raises(RunInterrupted) as info:
        run_federation(raw, StoppingGrid(2, raw, stop_in_round=3))
    assert info.value.last_round == 2 and info.value.signum == signal.SIGTERM
    folder = tmp_path / "results" / "run"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["last-round"] == 2 and summary["checkpoint"] is True
    assert "resume=true" in summary["resume"]
    assert [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    interrupt.reset()
    resumed = {**raw, "resume": True}
    assert run_federation(resumed, InProcessGrid(2, resumed))["status"] == "ok"
    assert [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_the_resume_command_names_the_folder_and_keeps_the_other_overrides(tmp_path):
    from fedsynth.cli import resume_command

    line = resume_command({"lr": 0.1, "run-name": "x", "model": "mlp", "overwrite": True}, tmp_path / "r" / "x", 3, 1.0, 0.0)
    assert line.startswith("fedsynth run --num-supernodes 3 --cpus-per-client 1 --run-config")
    assert "lr=0.1" in line and "model='mlp'" in line and "run-name='x'" in line and "resume=true" in line
    assert f"results-dir='{tmp_path / 'r'}'" in line and "overwrite" not in line
    assert "--engine" not in line  # the simulation engine is the default
    in_process = resume_command({"lr": 0.1}, tmp_path / "r" / "x", 3, 1.0, 0.0, engine="inprocess")
    assert "--engine inprocess" in in_process  # a run stopped in process resumes in process


def _cli_run(tmp_path: Path, data_dir: Path) -> subprocess.Popen:
    values = {
        "data-dir": f"'{data_dir}'", "cache-dir": f"'{tmp_path / 'cache'}'", "results-dir": f"'{tmp_path / 'results'}'",
        "run-name": "'run'", "num-server-rounds": 50, "local-steps": 400, "batch-size": 16, "model": "'mlp'",
        "checkpoint-every": 1, "node-wait-timeout": 600.0,
    }
    text = " ".join(f"{k}={v}" for k, v in values.items())
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "fedsynth.cli", "run", "--app-dir", str(REPO),
                             "--num-supernodes", "2", "--run-config", text], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_fedsynth_run_stops_within_ten_seconds_of_a_signal_mid_round(tmp_path, tiny_data_dir, signum):
    process = _cli_run(tmp_path, tiny_data_dir)
    metrics = tmp_path / "results" / "run" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):  # round 0 and round 1 written
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
            time.sleep(0.2)
        time.sleep(0.5)  # into round 2
        sent = time.monotonic()
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, err[-3000:]
    assert took < 10, took
    folder = tmp_path / "results" / "run"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["last-round"] >= 1
    assert (folder / "checkpoint.safetensors").is_file()
    assert "resume with: fedsynth run" in err and "resume=true" in err
    assert "Traceback" not in err
