"""Warm ClientApp processes in a real deployment: the same messages give bitwise the same model (issue 55).

Training is seeded per node and round, so a run whose ClientApp tasks are forked from a warm server
(fedsynth/warm_clientapp, Flower's `flwr-clientapp` run by `task.run`) must end with exactly the model of
the same run whose tasks are each a new `flwr-clientapp` process, Flower's own way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedsynth.loopback import LoopbackFederation

pytestmark = pytest.mark.slow


def run_config(tiny_data_dir: Path, work: Path) -> str:
    return " ".join([
        f'data-dir="{tiny_data_dir}"', f'cache-dir="{work / "cache"}"', f'results-dir="{work / "results"}"',
        'run-name="run"', 'model="mlp"', "central-eval=false", "num-server-rounds=2", "local-steps=3", "batch-size=16", "node-wait-timeout=120.0",
        "checkpoint-every=0", "save-model=true",
    ])


def final_model(federation: LoopbackFederation, app: Path, tiny_data_dir: Path, work: Path) -> dict[str, np.ndarray]:
    result = federation.run(app, run_config(tiny_data_dir, work))
    folder = work / "results" / "run"
    assert (folder / "model.safetensors").is_file(), result.stdout[-3000:] + federation.log_tails()
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["answered"] for r in rounds if r["round"] >= 1] == [2, 2], rounds
    return load_file(str(folder / "model.safetensors"))


def test_warm_and_cold_clientapp_processes_give_bitwise_the_same_model(tmp_path, tiny_data_dir, flower_app,
                                                                      two_node_federation):
    node_logs = sorted(two_node_federation.logs.glob("supernode-*.log"))
    before = [len(f.read_text()) for f in node_logs]
    warm = final_model(two_node_federation, flower_app, tiny_data_dir, tmp_path / "warm")
    warm_logs = "".join(f.read_text()[start:] for f, start in zip(node_logs, before))
    # Every task was forked: each node's SuperExec (deploy/warm-clientapp/flower-superexec) started its warm
    # server with the node, and a task that came while it was still importing waited for it.
    all_logs = "".join(f.read_text() for f in node_logs)
    assert "no warm server" not in warm_logs and all_logs.count(" ready in ") == 2, all_logs[-3000:]

    with LoopbackFederation(tmp_path / "cold-federation", num_nodes=2, extra_env={"OMP_NUM_THREADS": "1"},
                            warm_clientapp=False) as cold_federation:
        cold = final_model(cold_federation, flower_app, tiny_data_dir, tmp_path / "cold")
        cold_logs = "".join(f.read_text() for f in cold_federation.logs.glob("supernode-*.log"))
    assert "fedsynth warm-clientapp" not in cold_logs

    assert warm.keys() == cold.keys()
    for name in warm:
        assert warm[name].dtype == cold[name].dtype and np.array_equal(warm[name], cold[name]), name
