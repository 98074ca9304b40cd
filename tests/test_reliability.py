"""Checkpoint/resume after a killed server process, fault injection, and malicious replies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from common.run.config import parse_run_config
from common.records import from_record
from server_app.registry import SERVER_STRATEGIES
from server_app.robust import bounded_updates
from server_app.strategies.fedavg import weighted_mean
from tests.conftest import with_fid_classifier
from tests.diffusion_tiny import TINY_DIFFUSION
from fedsynth.inprocess import InProcessGrid, run_federation

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def trained_fid_classifier(tmp_path, fid_classifier) -> None:
    """Each run's cache-dir (tmp_path / "cache") starts with the session's trained FID classifier
    (tests/conftest.py): its training costs most of a tiny diffusion run, and is tested where runs start
    from an empty cache-dir (test_simulation.py's FedDDPM+ case)."""
    with_fid_classifier(tmp_path / "cache", fid_classifier)


def config(tmp_path: Path, data_dir: Path, name: str, **extra) -> dict:
    return {
        "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
        "run-name": name, "num-server-rounds": 6, "local-steps": 4, "batch-size": 16,
        "checkpoint-every": 1, **extra,
    }


def load_model(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def run_and_kill_after_round(raw: dict, nodes: int, kill_after: int, timeout: float = 120) -> None:
    """Start the server in its own process and SIGKILL it once round `kill_after` is in metrics.jsonl."""
    metrics = Path(raw["results-dir"]) / raw["run-name"] / "metrics.jsonl"
    # Same intra-op thread count as this process, so float reductions happen in the same order.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen(
        [sys.executable, "-m", "fedsynth.inprocess", json.dumps(raw), str(nodes), "0.5"], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if metrics.is_file() and any(json.loads(l)["round"] >= kill_after for l in metrics.read_text().splitlines() if l):
                break
            assert process.poll() is None, "the server exited before it could be killed"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


# Test-size settings of the algorithms with server state beyond the model.
RESUME_CASES = {
    "fedavg": {},
    "scaffold": {},
    "fedsynsam": {"model": "mlp", "trajectory-rounds": 2, "distill-iterations": 5, "synthetic-ipc": 2,
                  "compression": "qsgd"},
    "fedddpm": {**TINY_DIFFUSION, "fid-samples": 8},
    # the nodes keep their last model in Context.state; the server hands it back (server_app/strategies/node_models.py)
    "moon": {},
    "fedavg+cog": {"gen-steps": 4, "gen-budget": 24, "cog-start-round": 4},
}


@pytest.mark.parametrize("algorithm", sorted(RESUME_CASES))
def test_killed_run_resumes_to_the_same_final_model(tmp_path, tiny_data_dir, algorithm):
    full = config(tmp_path, tiny_data_dir, "full", algorithm=algorithm, **RESUME_CASES[algorithm])
    run_federation(full, InProcessGrid(3, full))

    interrupted = config(tmp_path, tiny_data_dir, "interrupted", algorithm=algorithm, **RESUME_CASES[algorithm])
    run_and_kill_after_round(interrupted, 3, kill_after=3)
    resumed = {**interrupted, "resume": True}
    # A fresh grid: every node's Context.state is empty, as after a restart in simulation.
    run_federation(resumed, InProcessGrid(3, resumed))

    expected, got = load_model(tmp_path / "results" / "full"), load_model(tmp_path / "results" / "interrupted")
    for name in expected:
        if algorithm != "scaffold":
            # replies are summed in partition order and batches are seeded per round: bitwise equal
            np.testing.assert_array_equal(got[name], expected[name])
        else:
            # SCAFFOLD's c_i is rebuilt on the server from float32 deltas: equal to 1e-6
            np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0)
    rounds = [json.loads(l)["round"] for l in (tmp_path / "results" / "interrupted" / "metrics.jsonl").read_text().splitlines()]
    assert rounds[-6:] == [1, 2, 3, 4, 5, 6]


def test_node_models_are_kept_only_where_a_resume_needs_them():
    from common.run.config import parse_run_config
    from common.protocol import STATE_COG_PREVIOUS_MODEL, STATE_MOON_PREVIOUS_MODEL
    from server_app.registry import SERVER_STRATEGIES, build_strategy
    from server_app.strategies.node_models import NodeModels, kept_model_keys

    def kept(**keys):
        cfg = parse_run_config({"model": "mlp", "checkpoint-every": 1, **keys}, SERVER_STRATEGIES)
        assert build_strategy(cfg, []).node_models.keys == kept_model_keys(cfg)  # what the app gives its strategy
        return kept_model_keys(cfg)

    assert kept(algorithm="moon+cog") == (STATE_MOON_PREVIOUS_MODEL, STATE_COG_PREVIOUS_MODEL)
    assert kept(algorithm="fedprox", cog=True) == (STATE_COG_PREVIOUS_MODEL,)
    assert kept(algorithm="fedavg") == ()  # its nodes keep no model
    assert kept(algorithm="moon", **{"checkpoint-every": 0}) == ()  # no checkpoint, no resume
    assert kept(algorithm="moon", compression="qsgd") == ()  # the reply holds a lossy update, not the model
    moon = kept(algorithm="moon")
    models = NodeModels(moon)
    models.keep(3, {"w": np.ones(2, dtype=np.float32)})
    assert NodeModels().arrays() == {} and not NodeModels().keys  # a strategy built without the app keeps none
    again = NodeModels(moon)
    assert again.load({**models.arrays(), "control": {"c": np.zeros(1)}}).keys() == {"control"}  # the strategy's own
    assert list(again.records(3)) == [STATE_MOON_PREVIOUS_MODEL] and again.records(4) == {}


def test_fault_injection_skips_failures_and_aggregates_only_answering_nodes(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, "faults", **{"num-server-rounds": 3, "round-timeout": 5.0})
    grid = InProcessGrid(5, raw)
    grid.faults[(1, 2, "train")] = "raise"
    grid.faults[(3, 3, "train")] = "timeout"
    replies: dict[int, list] = {}

    def recorder(rnd):
        def keep(reply):
            replies.setdefault(rnd, []).append(reply)
            return reply
        return keep

    for rnd in (2, 3):
        for pid in range(5):
            grid.faults.setdefault((pid, rnd, "train"), recorder(rnd))
    summary = run_federation(raw, grid)
    rounds = {json.loads(l)["round"]: json.loads(l) for l in (tmp_path / "results" / "faults" / "metrics.jsonl").read_text().splitlines()}
    assert rounds[2]["failures"] == [{"node": 1001, "partition": 1, "reason": "error: injected failure"}]
    assert rounds[3]["failures"] == [{"node": 1003, "partition": 3, "reason": "timeout"}]
    assert rounds[2]["answered"] == 4 and rounds[3]["answered"] == 4 and summary["rounds"] == 3

    # The round-3 global model equals the sample-weighted mean of the four answering nodes' updates (bounded as
    # the defaults bound them: at most max-update-norm-ratio times the round's lower-median norm, issue 47).
    sent_round3 = [m for m in grid.sent if m.content.config_records.get("config", {}).get("server-round") == 3]
    start = from_record(sent_round3[0].content.array_records["arrays"])
    good = sorted(replies[3], key=lambda r: r.content.metric_records["metrics"]["partition-id"])
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    deltas = bounded_updates(
        [{k: v - start[k] for k, v in from_record(r.content.array_records["arrays"]).items()} for r in good],
        cfg.max_update_norm, cfg.max_update_norm_ratio)
    weights = [r.content.metric_records["metrics"]["num-examples"] for r in good]
    mean = weighted_mean(deltas, weights)
    final = load_model(tmp_path / "results" / "faults")
    for name in final:
        np.testing.assert_allclose(final[name], start[name] + mean[name], atol=1e-7, rtol=0)


def _replace_first_array(reply, make_bad):
    record = reply.content.array_records["arrays"]
    first = next(iter(record.keys()))
    record[first] = Array(make_bad(record[first].numpy()))
    return reply


def test_malicious_replies_are_rejected_and_the_model_is_the_honest_aggregate(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, "malicious", **{"num-server-rounds": 1})
    honest = {**raw, "run-name": "honest"}
    grid = InProcessGrid(4, raw)
    grid.faults[(1, 1, "train")] = lambda r: _replace_first_array(r, lambda a: np.zeros(a.size + 1, a.dtype))
    grid.faults[(2, 1, "train")] = lambda r: _replace_first_array(r, lambda a: np.full_like(a, np.nan))

    def oversized(reply):
        reply.content["padding"] = ArrayRecord({"x": Array(np.random.default_rng(0).random(3_000_000).astype(np.float32))})
        return reply

    grid.faults[(3, 1, "train")] = oversized
    run_federation(raw, grid)
    failures = json.loads((tmp_path / "results" / "malicious" / "metrics.jsonl").read_text().splitlines()[1])["failures"]
    reasons = {f["partition"]: f["reason"] for f in failures}
    assert "shape" in reasons[1] and "non-finite" in reasons[2] and "oversized" in reasons[3]

    # The honest aggregate: only partition 0 answered correctly.
    honest_grid = InProcessGrid(4, honest)
    for pid in (1, 2, 3):
        honest_grid.faults[(pid, 1, "train")] = "timeout"
    run_federation(honest, honest_grid)
    got, expected = load_model(tmp_path / "results" / "malicious"), load_model(tmp_path / "results" / "honest")
    for name in expected:
        assert np.all(np.isfinite(got[name]))
        np.testing.assert_array_equal(got[name], expected[name])
