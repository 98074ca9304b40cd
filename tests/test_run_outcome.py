"""A failed run fails, and no results are ever overwritten (in-process runs, seconds each).

Exit status of a run (summary `status`, `RunFailed`), the results folder's lock,
refusal to reuse a run-name without resume, overwrite/resume for re-running a
killed run, unique default folders, and checkpoint validation before anything
in the folder is rewritten.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.run.config import parse_run_config
from common.run.results import ResultsFolderError, RunResults, reserve_run_folder
from fedsynth.inprocess import InProcessGrid, run_federation
from fedsynth.cli import main as cli_main
from server_app.checkpoint import CheckpointError
from server_app.outcome import STATUS_FAILED, STATUS_FAILED_ROUNDS, STATUS_OK, RunFailed, run_outcome
from server_app.registry import SERVER_STRATEGIES

REPO = Path(__file__).resolve().parent.parent


def config(tmp_path: Path, data_dir: Path, name: str = "run", **extra) -> dict:
    return {
        "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
        "run-name": name, "num-server-rounds": 2, "local-steps": 2, "batch-size": 16, "model": "mlp",
        "checkpoint-every": 1, **extra,
    }


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


# ----- exit status ---------------------------------------------------------------------------------

def test_outcome_of_rounds_and_model():
    import numpy as np

    finite, nan = {"w": np.zeros(2, np.float32)}, {"w": np.array([0.0, np.nan], np.float32)}
    assert run_outcome([{"round": 0}, {"round": 1}, {"round": 2}], finite)[0] == STATUS_OK
    assert run_outcome([{"round": 1}, {"round": 2, "skipped": True}], finite)[0] == STATUS_FAILED_ROUNDS
    assert run_outcome([{"round": 1, "skipped": True}], finite)[0] == STATUS_FAILED
    assert run_outcome([{"round": 1, "below-min-nodes": True}], finite)[0] == STATUS_FAILED
    status, reason = run_outcome([{"round": 1}], nan)
    assert status == STATUS_FAILED and "not finite" in reason


def test_diverging_run_fails_and_saves_no_model(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, lr=1e300)
    with pytest.raises(RunFailed, match="no round was aggregated"):
        run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "run"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == STATUS_FAILED and summary["failed-rounds"] == 2
    assert not (folder / "model.safetensors").exists()


def test_run_stopped_by_failed_rounds_leaves_a_failed_summary(tmp_path, tiny_data_dir):
    from server_app.strategies.base import TooManyFailedRounds

    raw = config(tmp_path, tiny_data_dir, **{"num-server-rounds": 3, "max-failed-rounds": 1, "round-timeout": 5.0})
    grid = InProcessGrid(2, raw)
    grid.faults[(0, 2, "train")] = grid.faults[(1, 2, "train")] = "raise"
    with pytest.raises(TooManyFailedRounds):
        run_federation(raw, grid)
    summary = json.loads((tmp_path / "results" / "run" / "summary.json").read_text())
    assert summary["status"] == STATUS_FAILED and "TooManyFailedRounds" in summary["status-reason"]


def test_run_with_a_failed_round_completes_with_that_status(tmp_path, tiny_data_dir, capsys):
    raw = config(tmp_path, tiny_data_dir, **{"num-server-rounds": 3, "round-timeout": 5.0})
    grid = InProcessGrid(2, raw)
    grid.faults[(0, 2, "train")] = grid.faults[(1, 2, "train")] = "timeout"
    summary = run_federation(raw, grid)
    assert summary["status"] == STATUS_FAILED_ROUNDS and summary["failed-rounds"] == 1
    assert "rounds [2]" in summary["status-reason"]
    assert (tmp_path / "results" / "run" / "model.safetensors").is_file()
    # `fedsynth status` shows what `flwr ls` hides (it says finished:completed): the status and the lost round
    code = cli_main(["status", str(tmp_path / "results" / "run")])
    out = capsys.readouterr().out.splitlines()
    assert code == 3 and out[0].startswith("status: completed-with-failed-rounds (1 of 3 round(s) failed")
    assert "failed rounds (fewer than min-nodes usable replies): 2" in out
    assert [line for line in out if line.startswith("dropped replies: round 2: ")] and "round 1" not in " ".join(out)


def test_fedsynth_status_exit_codes_say_how_a_run_ended(tmp_path, tiny_data_dir, capsys):
    raw = config(tmp_path, tiny_data_dir, **{"num-server-rounds": 1})
    run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "run"
    assert cli_main(["status", str(folder)]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["status: ok", "rounds recorded: 1"]
    (folder / "summary.json").rename(folder / "summary.json.bak")  # as while the run is still going
    assert cli_main(["status", str(folder)]) == 4
    assert "not finished (no summary.json yet; last round recorded: 1)" in capsys.readouterr().out
    (folder / "summary.json").write_text(json.dumps({"status": "interrupted", "status-reason": "SIGTERM"}))
    assert cli_main(["status", str(folder)]) == 1
    assert cli_main(["status", str(tmp_path / "nowhere")]) == 2
    assert "is not a run's results folder" in capsys.readouterr().err


def test_fedsynth_status_names_a_damaged_summary_instead_of_a_traceback(tmp_path, capsys):
    """The hostile probe's find: a summary.json that is not JSON ended `fedsynth status` with a JSONDecodeError."""
    folder = tmp_path / "run"
    folder.mkdir()
    for text, why in (("{not json", "JSONDecodeError"), ("[1, 2]", "list")):
        (folder / "summary.json").write_text(text)
        assert cli_main(["status", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedsynth status: {folder / 'summary.json'} is not a run summary (a JSON object): ")
        assert why in err


def test_fedsynth_status_names_the_sites_a_round_waited_for(tmp_path):
    from fedsynth.status import run_status

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"status": "ok"}))
    (folder / "nodes.json").write_text(json.dumps([{"name": "site-b", "partition-id": 1, "node-id": 77}]))
    waits = [{"node": 77, "partition": 1, "waited": 39.2, "outcome": "back: message sent again"},
             {"node": 5, "partition": None, "waited": 120.0, "outcome": "not back within node-return-wait"}]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"round": 1, "failures": []}, {"round": 2, "failures": [], "node-returns": waits}]) + "\n")
    code, lines = run_status(folder)
    assert code == 0 and lines[0] == "status: ok"
    assert ("waited for a node to come back: round 2: site-b: 39.2 s, back: message sent again; node 5: 120.0 s, "
            "not back within node-return-wait") in lines


# ----- results are never lost ----------------------------------------------------------------------

def test_reusing_a_run_name_without_resume_is_refused_and_leaves_the_results(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir)
    run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "run"
    before = folder_files(folder)
    changed = {**raw, "lr": 0.01}
    with pytest.raises(ResultsFolderError) as info:
        run_federation(changed, InProcessGrid(2, changed))
    message = str(info.value)
    assert "already holds a run" in message and "resume = true" in message and "run-name" in message
    assert folder_files(folder) == before


def test_overwrite_starts_a_leftover_folder_over(tmp_path, tiny_data_dir):
    folder = tmp_path / "results" / "run"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"round": 1}\n')  # a run killed before its first checkpoint
    raw = config(tmp_path, tiny_data_dir, overwrite=True)
    run_federation(raw, InProcessGrid(2, raw))
    rounds = [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2]


def test_resume_with_overwrite_resumes_when_a_checkpoint_exists_else_starts_over(tmp_path, tiny_data_dir):
    raw = {**config(tmp_path, tiny_data_dir, **{"num-server-rounds": 3}), "resume": True, "overwrite": True}
    summary = run_federation(raw, InProcessGrid(2, raw))  # no folder yet: a fresh run
    assert summary["status"] == STATUS_OK
    folder = tmp_path / "results" / "run"
    before = json.loads((folder / "summary.json").read_text())
    again = run_federation(raw, InProcessGrid(2, raw))  # the checkpoint of round 3: nothing left to run
    assert again["final-central-accuracy"] == before["final-central-accuracy"]
    rounds = [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3]


def test_resume_with_a_changed_config_is_refused_naming_the_keys(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir)
    run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "run"
    before = folder_files(folder)
    changed = {**raw, "resume": True, "lr": 0.01, "alpha": 0.5, "num-server-rounds": 4}
    with pytest.raises(CheckpointError) as info:
        run_federation(changed, InProcessGrid(2, changed))
    message = str(info.value)
    assert "'lr'" in message and "'alpha'" in message and "num-server-rounds" not in message
    assert folder_files(folder) == before  # nothing rewritten before the checkpoint was checked


def test_resume_with_other_nodes_is_refused(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir)
    run_federation(raw, InProcessGrid(2, raw))
    resumed = {**raw, "resume": True}
    with pytest.raises(CheckpointError, match="nodes"):
        run_federation(resumed, InProcessGrid(3, resumed))


def test_checkpoint_with_malformed_metrics_is_refused_before_metrics_are_rewritten(tmp_path, tiny_data_dir):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    raw = config(tmp_path, tiny_data_dir)
    run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "run"
    path = folder / "checkpoint.safetensors"
    with safe_open(str(path), framework="numpy") as handle:
        meta, tensors = dict(handle.metadata()), {k: handle.get_tensor(k) for k in handle.keys()}
    save_file(tensors, str(path), metadata={**meta, "metrics": "[1, 2]"})
    before = folder_files(folder)
    resumed = {**raw, "resume": True}
    with pytest.raises(CheckpointError, match="corrupt"):
        run_federation(resumed, InProcessGrid(2, resumed))
    assert folder_files(folder) == before


def test_default_run_names_never_collide(tmp_path):
    names = {reserve_run_folder(tmp_path, "fedavg-fashion-mnist-iid-20250101-000000").name for _ in range(3)}
    assert names == {"fedavg-fashion-mnist-iid-20250101-000000", "fedavg-fashion-mnist-iid-20250101-000000-2",
                     "fedavg-fashion-mnist-iid-20250101-000000-3"}
    cfg = parse_run_config({"results-dir": str(tmp_path / "r")}, SERVER_STRATEGIES)
    with RunResults(cfg) as first, RunResults(cfg) as second:
        assert first.path != second.path


def test_a_second_run_on_a_folder_in_use_is_refused_at_once_and_the_first_finishes(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, **{"num-server-rounds": 4})
    metrics = tmp_path / "results" / "run" / "metrics.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-m", "fedsynth.inprocess", json.dumps(raw), "2", "1.0"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
            assert first.poll() is None and time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(ResultsFolderError, match="in use by another run"):
            run_federation(raw, InProcessGrid(2, raw))
        assert time.monotonic() - started < 10
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()[-2000:]
    folder = tmp_path / "results" / "run"
    assert [json.loads(line)["round"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert json.loads((folder / "summary.json").read_text())["status"] == STATUS_OK


def test_a_fork_under_another_config_resumes_where_a_plain_resume_is_refused(tmp_path):
    from common.records import model_weights
    from common.run.task import make_model
    from server_app.checkpoint import Checkpoint, fork_checkpoint, load_checkpoint, save_checkpoint

    base = parse_run_config({"model": "mlp"}, SERVER_STRATEGIES)
    fork = parse_run_config({"model": "mlp", "cog": True, "cog-start-round": 3}, SERVER_STRATEGIES)
    weights = model_weights(make_model(base, seeded=True))
    save_checkpoint(tmp_path / "base", base, Checkpoint(2, weights, {}, {}, [{"round": 1}, {"round": 2}]))
    with pytest.raises(CheckpointError, match="'cog'"):
        load_checkpoint(tmp_path / "base", fork, weights)
    fork_checkpoint(tmp_path / "base", tmp_path / "fork", fork)
    assert load_checkpoint(tmp_path / "fork", fork, weights).server_round == 2
