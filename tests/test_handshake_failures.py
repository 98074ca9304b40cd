"""Nodes lost before round 1 are failures, recorded with their reason (issue 34, server_app/handshake.py)."""

from __future__ import annotations

import json
import time

import pytest
from flwr.app import Message, MetricRecord

from fedsynth.inprocess import InProcessGrid, run_federation
from server_app.handshake import HandshakeError


def config(tmp_path, data_dir, **extra) -> dict:
    return {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
            "run-name": "run", "num-server-rounds": 1, "local-steps": 2, "batch-size": 16, "model": "mlp",
            "node-wait-timeout": 600.0, **extra}




def with_metrics(**changes):
    def fault(reply: Message) -> Message:
        reply.content["metrics"] = MetricRecord({**dict(reply.content["metrics"]), **changes})
        return reply
    return fault


def summary(tmp_path) -> dict:
    return json.loads((tmp_path / "results" / "run" / "summary.json").read_text())


@pytest.mark.parametrize("fault, words", [
    ("raise", ["injected failure"]),
    (with_metrics(**{"num-train-examples": -3}), ["'num-train-examples'"]),
    (with_metrics(**{"partition-id": 7}), ["'partition-id' = 7"]),
])
def test_a_node_lost_at_the_handshake_fails_the_run_at_once_naming_it(tmp_path, tiny_data_dir, fault, words):
    raw = config(tmp_path, tiny_data_dir)
    grid = InProcessGrid(2, raw)
    grid.faults[(1, 0, "query")] = fault
    started = time.monotonic()
    with pytest.raises(HandshakeError) as info:
        run_federation(raw, grid)
    assert time.monotonic() - started < 60  # not the 600 s node-wait-timeout: every connected node had answered
    assert "1 of 2 partitions" in str(info.value) and "max-missing-nodes" in str(info.value)
    written = summary(tmp_path)
    assert written["status"] == "failed"
    assert [f["node"] for f in written["handshake-failures"]] == [1001]
    assert all(w in written["handshake-failures"][0]["reason"] for w in words), written


def test_max_missing_nodes_lets_the_run_go_on_and_records_the_lost_node(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, **{"max-missing-nodes": 1})
    grid = InProcessGrid(3, raw)
    grid.faults[(2, 0, "query")] = "raise"
    result = run_federation(raw, grid)
    assert result["status"] == "ok" and result["num-nodes"] == 2
    assert [f["node"] for f in summary(tmp_path)["handshake-failures"]] == [1002]


def test_a_node_claiming_a_taken_partition_is_refused_alone(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, **{"max-missing-nodes": 1})
    grid = InProcessGrid(3, raw)
    grid.faults[(2, 0, "query")] = with_metrics(**{"partition-id": 0})
    result = run_federation(raw, grid)  # before: "both hold partition-id 0" aborted the federation
    assert result["status"] == "ok" and result["num-nodes"] == 2
    failure = summary(tmp_path)["handshake-failures"][0]
    assert failure["node"] == 1002 and "already held by node 1000" in failure["reason"]


def test_connected_nodes_get_the_round_timeout_to_answer_even_with_a_short_node_wait(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, **{"node-wait-timeout": 0.5, "round-timeout": 30.0})

    class TimedGrid(InProcessGrid):
        timeouts: list = []

        def send_and_receive(self, messages, *, timeout=None):
            self.timeouts.append(timeout)
            return super().send_and_receive(messages, timeout=timeout)

    grid = TimedGrid(2, raw)
    run_federation(raw, grid)
    assert grid.timeouts[0] >= 30.0  # before: what was left of node-wait-timeout, and "No node answered"


# ----- claims bounded before anything is sized from them (issue 47) -----------------------------------------

def _data_memory_limited(extra_bytes: int):
    """A context in which this process's data segment may grow by at most `extra_bytes` (MemoryError beyond)."""
    import contextlib
    import resource

    @contextlib.contextmanager
    def limited():
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
        in_use = int(status["VmData"].split()[0]) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (in_use + extra_bytes, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))

    return limited()


def test_a_claim_of_a_billion_partitions_is_refused_in_seconds_naming_the_node(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir)
    grid = InProcessGrid(3, raw, node_config=lambda pid: {"partition-id": pid, "num-partitions": 3,
                                                          "name": f"site-{pid}"})
    grid.faults[(1, 0, "query")] = with_metrics(**{"num-partitions": 10**9})
    started = time.monotonic()
    with _data_memory_limited(1 << 30), pytest.raises(HandshakeError) as info:  # before: 18.7 GB, the OOM killer
        run_federation(raw, grid)
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "node 1001 ('site-1')" in message and "'num-partitions' = 1000000000" in message, message
    failure = summary(tmp_path)["handshake-failures"][0]
    assert failure["node"] == 1001 and failure["name"] == "site-1" and "100000" in failure["reason"]


def test_a_node_claiming_more_partitions_than_the_others_is_refused_at_once_by_name(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir, **{"max-missing-nodes": 1})
    grid = InProcessGrid(3, raw, node_config=lambda pid: {"partition-id": pid, "num-partitions": 3,
                                                          "name": f"site-{pid}"})
    grid.faults[(2, 0, "query")] = with_metrics(**{"num-partitions": 5})
    started = time.monotonic()
    result = run_federation(raw, grid)  # before: waited node-wait-timeout for "partitions [3, 4]", naming no node
    assert time.monotonic() - started < 60
    assert result["status"] == "ok" and result["num-nodes"] == 2
    failure = summary(tmp_path)["handshake-failures"][0]
    assert failure["node"] == 1002 and failure["name"] == "site-2"
    assert "claims num-partitions = 5, but 2 node(s) (1000, 1001) claim 3" in failure["reason"]


def test_a_node_name_too_long_to_print_is_refused_by_node_id(tmp_path, tiny_data_dir):
    raw = config(tmp_path, tiny_data_dir)
    grid = InProcessGrid(2, raw, node_config=lambda pid: {"partition-id": pid, "num-partitions": 2,
                                                          "name": "x" * 5000 if pid else "site-0"})
    with pytest.raises(HandshakeError, match=r"node 1001: malformed handshake reply: node name of 5000 characters"):
        run_federation(raw, grid)


def test_the_agreed_partition_count_is_the_majoritys():
    from server_app.handshake import agreed_partition_count, disagreeing_claims

    assert agreed_partition_count([]) is None
    assert agreed_partition_count([3, 5, 3]) == 3
    assert agreed_partition_count([3, 5]) == 5  # a tie waits for the larger, until more nodes have answered
    assert disagreeing_claims({10: 3, 11: 5, 12: 3}, 3) == {
        11: "node 11 claims num-partitions = 5, but 2 node(s) (10, 12) claim 3; give every SuperNode the same "
            "'num-partitions' in --node-config"}
