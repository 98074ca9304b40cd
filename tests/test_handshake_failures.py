"""Nodes lost before round 1 are failures, recorded with their reason (issue 34, server_app/handshake.py)."""

from __future__ import annotations

import json
import time

import pytest
from flwr.app import Message, MetricRecord, RecordDict

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
