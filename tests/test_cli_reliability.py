"""`fedsynth run` exit codes and early refusals (docs/reliability.md).

The refusals need no simulation engine and take seconds; the two runs in
Flower's simulation engine (marked slow) check that a diverging run exits
non-zero and that a second run on a folder in use is refused at once while
the first one's results stay intact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsynth.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, main

REPO = Path(__file__).resolve().parent.parent


def run_config(tmp_path: Path, data_dir: Path, **extra) -> str:
    values = {
        "data-dir": f'"{data_dir}"', "cache-dir": f'"{tmp_path / "cache"}"', "results-dir": f'"{tmp_path / "results"}"',
        "run-name": '"run"', "num-server-rounds": 2, "local-steps": 2, "batch-size": 16, "model": '"mlp"',
        "node-wait-timeout": 600.0, **extra,
    }
    return " ".join(f"{k}={v}" for k, v in values.items())


def cli(tmp_path: Path, data_dir: Path, nodes: int = 2, engine: bool = False, **extra) -> list[str]:
    """`fedsynth run`'s arguments: Flower's simulation engine, or fedsynth's in-process one (`engine=True`)."""
    return ["run", "--app-dir", str(REPO), "--num-supernodes", str(nodes), *(["--engine", "inprocess"] * engine),
            "--run-config", run_config(tmp_path, data_dir, **extra)]


@pytest.mark.parametrize("extra, words", [
    ({"data-dir": '"/nonexistent/data"'}, ["'data-dir'", "/nonexistent/data"]),
    ({"num-server-round": 3}, ["did you mean 'num-server-rounds'"]),
    ({"min-nodes": 5}, ["'min-nodes' = 5"]),
])
def test_bad_input_is_refused_before_the_engine_starts(tmp_path, tiny_data_dir, capsys, extra, words):
    started = time.monotonic()
    assert main(cli(tmp_path, tiny_data_dir, **extra)) == EXIT_BAD_INPUT
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_reused_run_name_is_refused_before_the_engine_starts(tmp_path, tiny_data_dir, capsys):
    folder = tmp_path / "results" / "run"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    assert main(cli(tmp_path, tiny_data_dir)) == EXIT_BAD_INPUT
    assert "already holds a run" in capsys.readouterr().err
    assert (folder / "summary.json").read_text() == "{}"


@pytest.mark.slow
def test_diverging_run_exits_non_zero_with_one_line(tmp_path, tiny_data_dir, capsys):
    assert main(cli(tmp_path, tiny_data_dir, lr=1e300)) == EXIT_FAILED
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedsynth:")]
    assert len(err) == 1 and "no round was aggregated" in err[0], err
    assert not (tmp_path / "results" / "run" / "model.safetensors").exists()


@pytest.mark.slow
def test_second_run_with_the_same_name_is_refused_at_once_and_the_first_is_intact(tmp_path, tiny_data_dir, capsys):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # the folder's lock is the driver's, whichever engine runs the nodes: the in-process engine spares Ray's start
    first = subprocess.Popen([sys.executable, "-m", "fedsynth.cli", *cli(tmp_path, tiny_data_dir, engine=True)], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    lock = tmp_path / "results" / "run" / ".lock"
    try:
        deadline = time.monotonic() + 120
        while not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline, "the first run did not take its folder"
            time.sleep(0.1)
        started = time.monotonic()
        assert main(cli(tmp_path, tiny_data_dir, engine=True)) == EXIT_BAD_INPUT
        assert time.monotonic() - started < 10
        assert "in use by another run" in capsys.readouterr().err
    finally:
        _, err = first.communicate(timeout=600)
    assert first.returncode == EXIT_OK, err.decode()[-3000:]
    folder = tmp_path / "results" / "run"
    assert [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert json.loads((folder / "summary.json").read_text())["status"] == "ok"
    assert (folder / "model.safetensors").is_file()


def test_an_app_dir_without_an_app_is_named(tmp_path):
    """The hostile probe's find: `--app-dir /nowhere` exited 1 saying "use --app-dir", the option just given."""
    with pytest.raises(SystemExit) as stop:
        main(["run", "--engine", "inprocess", "--app-dir", str(tmp_path / "nowhere")])
    assert str(stop.value.code) == (f"fedsynth: --app-dir {tmp_path / 'nowhere'}: no Flower app there or in a folder "
                                    "above it (a pyproject.toml with [tool.flwr.app])")
