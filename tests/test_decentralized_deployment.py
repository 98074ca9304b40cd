"""Decentralized FL in Flower's deployment engine: a SuperLink and 3 SuperNodes on loopback.

Every ClientApp message runs in a new `flwr-clientapp` process there, so the
only way a node's last model z_i^{t-1} reaches its next round is
`Context.state`. The relay checks it: each node reports the round of the own
model it mixed, and `state-lost` counts nodes whose model was older than the
one they last sent.
"""

from __future__ import annotations

import json

import pytest

from fedsynth.loopback import LoopbackFederation

pytestmark = pytest.mark.slow


def test_oledfl_three_supernodes_keep_state_across_processes(tmp_path, tiny_data_dir, flower_app):
    results = tmp_path / "results"
    config = " ".join([
        'algorithm="oledfl-sgd"', "num-server-rounds=2", "local-steps=3", "batch-size=16", 'topology="ring"',
        f'data-dir="{tiny_data_dir}"', f'cache-dir="{tmp_path / "cache"}"', f'results-dir="{results}"',
        'run-name="run"', "round-timeout=240.0", "node-wait-timeout=120.0", "checkpoint-every=0",
    ])
    with LoopbackFederation(tmp_path, num_nodes=3) as federation:
        run = federation.run(flower_app, config)
        summary_path = results / "run" / "summary.json"
        assert summary_path.is_file(), run.stdout[-3000:] + run.stderr[-3000:] + federation.log_tails()
    summary = json.loads(summary_path.read_text())
    assert summary["algorithm"] == "oledfl-sgd" and summary["num-nodes"] == 3
    rounds = [json.loads(line) for line in (results / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for record in rounds[1:]:
        assert record["answered"] == 3 and record["failed"] == 0
        # every node mixed the model it sent last round, read back from Context.state in a new process
        assert record["state-lost"] == 0
    # in round 2 the Ole direction x_i - z_i^{1} uses the z_i^{1} each node kept in its state
    assert rounds[2]["ole-direction-norm"] > 0
    assert (results / "run" / "model.safetensors").is_file()
