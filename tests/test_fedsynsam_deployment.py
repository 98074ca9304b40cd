"""FedSynSAM with a compressed uplink in Flower's deployment engine: a SuperLink and 2 SuperNodes on loopback.

Every ClientApp message runs in a new `flwr-clientapp` process there, so the
synthetic set the server distils after round R reaches a node's later rounds
only through `Context.state`. The run checks it: the server sends D_syn once
(round R + 1), and in round R + 2 both nodes still report holding it.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_fedsynsam_with_qsgd_on_two_supernodes(tmp_path, tiny_data_dir, flower_app, two_node_federation):
    results = tmp_path / "results"
    config = " ".join([
        'algorithm="fedsynsam"', 'model="mlp"', "num-server-rounds=3", "local-steps=3", "batch-size=16",
        'compression="qsgd"', "levels=17", 'qsgd-scope="model"', "trajectory-rounds=1", "distill-iterations=5", "synthetic-ipc=2",
        f'data-dir="{tiny_data_dir}"', f'cache-dir="{tmp_path / "cache"}"', f'results-dir="{results}"',
        'run-name="run"', "round-timeout=240.0", "node-wait-timeout=120.0", "checkpoint-every=0",
    ])
    run = two_node_federation.run(flower_app, config)
    summary_path = results / "run" / "summary.json"
    assert summary_path.is_file(), run.stdout[-3000:] + run.stderr[-3000:] + two_node_federation.log_tails()
    summary = json.loads(summary_path.read_text())
    assert summary["algorithm"] == "fedsynsam" and summary["num-nodes"] == 2
    rounds = [json.loads(line) for line in (results / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for record in rounds[1:]:
        assert record["answered"] == 2 and record["failed"] == 0
        # the paper's 4-bit qsgd, one payload per update: 6 bits per coordinate, close to 32/6 = 5.33x float32
        assert 5.2 < record["uplink-float32-bytes"] / record["uplink-bytes"] < 32 / 6
    assert rounds[1]["distill-loss-end"] < rounds[1]["distill-loss-start"]
    # D_syn goes down once (round 2) and both nodes still hold it in round 3, read from Context.state
    assert rounds[2]["downlink-bytes"] > rounds[3]["downlink-bytes"]
    assert rounds[2]["synthetic-holders"] == 2 and rounds[3]["synthetic-holders"] == 2
    assert 5.2 < summary["uplink-float32-bytes"] / summary["uplink-bytes"] < 32 / 6
