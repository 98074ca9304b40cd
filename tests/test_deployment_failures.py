"""A SuperNode lost mid-run in Flower's deployment engine (3 SuperNodes on loopback), and the ClientApp's threads.

When a node stops sending heartbeats, the SuperLink itself answers the message
it had for that node with a "Node Unavailable" error whose sender is the
SuperLink (node id 1). Each round must record the lost node once, under its own
node id and partition, with that reason -- not once as "node 1, no partition"
and again as a timeout. The same run checks that node config `torch-threads`
reaches `torch.get_num_threads()` in the deployed ClientApp processes (they
report it as `stat-torch-threads`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedsynth.loopback import LoopbackFederation

pytestmark = pytest.mark.slow
LOST = 2  # the partition whose SuperNode is killed after round 1
THREADS = 2


def read_rounds(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


@pytest.fixture(scope="module")
def rounds(tmp_path_factory: pytest.TempPathFactory, tiny_data_dir: Path, flower_app: Path) -> list[dict]:
    work = tmp_path_factory.mktemp("lost-node")
    results = work / "results"
    config = " ".join([
        "num-server-rounds=2", "local-steps=5", "batch-size=16", f'data-dir="{tiny_data_dir}"',
        f'cache-dir="{work / "cache"}"', f'results-dir="{results}"', 'run-name="run"', "round-timeout=240.0",
        "node-wait-timeout=120.0", "checkpoint-every=0",
        "node-return-wait=5.0",  # the killed node never comes back: its round waits 5 s for it, not 120
    ])
    metrics = results / "run" / "metrics.jsonl"
    with LoopbackFederation(work, num_nodes=3, node_config=f"torch-threads={THREADS}") as federation:
        run = federation.start_run(flower_app, config)
        try:
            deadline = time.monotonic() + 420
            while not any(r["round"] >= 1 for r in read_rounds(metrics)):
                assert run.poll() is None, run.stdout.read()[-3000:] + federation.log_tails()
                assert time.monotonic() < deadline, "round 1 did not end" + federation.log_tails()
                time.sleep(0.2)
            federation.kill_node(LOST)
            output, _ = run.communicate(timeout=600)
        finally:
            run.kill()
        assert (results / "run" / "summary.json").is_file(), output[-3000:] + federation.log_tails()
    return read_rounds(metrics)


def test_a_node_killed_mid_run_is_one_record_per_round_with_its_partition_and_reason(rounds):
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[1]["failed"] == 0 and rounds[1]["answered"] == 3
    for record in rounds[2:]:
        assert record["sampled"] == 3 and record["answered"] == 2 and record["failed"] == 1, record
        (failure,) = record["failures"]
        assert failure["partition"] == LOST and failure["node"] != 1, failure
        assert "Node Unavailable" in failure["reason"], failure  # the SuperLink's answer, not a timeout


def test_node_config_torch_threads_reach_the_deployed_clientapp(rounds):
    assert rounds[1]["stat-torch-threads"] == THREADS and rounds[1]["stat-torch-threads-max"] == THREADS
