"""The server's send-and-receive: push once, pull at the configured interval, stop at all replies or the timeout."""

from __future__ import annotations

import time

import pytest
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from server_app.messaging import match_replies, send_and_receive


class ScriptedGrid(Grid):
    """A Flower Grid whose replies become available at given times after the push."""

    def __init__(self, delays: dict[int, float]) -> None:
        self.delays = delays  # destination node -> seconds until its reply exists (absent: never)
        self.pulls: list[float] = []
        self.pushed_at = 0.0
        self.outgoing: dict[str, Message] = {}

    def create_message(self, *args, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError

    def set_run(self, run_id: int) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover - not used
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.delays)

    def push_messages(self, messages):
        self.pushed_at = time.monotonic()
        ids = []
        for number, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{number}"
            self.outgoing[f"m{number}"] = message
            ids.append(f"m{number}")
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        self.pulls.append(now - self.pushed_at)
        ready = []
        for message_id in sorted(message_ids):
            message = self.outgoing[message_id]
            delay = self.delays.get(message.metadata.dst_node_id)
            if delay is not None and now - self.pushed_at >= delay:
                ready.append(Message(RecordDict(), reply_to=message))
        return ready

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - Flower's, 3 s polls
        raise AssertionError("the server must not use Grid.send_and_receive")


def messages_to(nodes):
    from flwr.supercore.task_identity import TaskIdentity

    # messages take their run id from the process's task identity, as in a ServerApp process
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    return [Message(RecordDict(), dst_node_id=node, message_type="train") for node in nodes]


def test_collects_every_reply_once_and_notices_the_last_within_the_interval():
    grid = ScriptedGrid({1: 0.0, 2: 0.12, 3: 0.3})
    start = time.monotonic()
    replies = send_and_receive(grid, messages_to([1, 2, 3]), timeout=5.0, poll_interval=0.02)
    elapsed = time.monotonic() - start
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    # Flower's deployment grid would take up to 3 s more; the margin is for a busy machine
    assert 0.3 <= elapsed < 0.3 + 0.5
    assert all(b - a < 0.5 for a, b in zip(grid.pulls, grid.pulls[1:]))


def test_stops_at_the_timeout_with_the_replies_that_came():
    grid = ScriptedGrid({1: 0.0, 2: None})  # node 2 never answers
    start = time.monotonic()
    replies = send_and_receive(grid, messages_to([1, 2]), timeout=0.25, poll_interval=0.05)
    elapsed = time.monotonic() - start
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.25 <= elapsed < 0.25 + 0.5


def test_all_replies_at_once_need_a_single_pull():
    grid = ScriptedGrid({1: 0.0, 2: 0.0})
    replies = send_and_receive(grid, messages_to([1, 2]), timeout=None, poll_interval=1.0)
    assert len(replies) == 2 and len(grid.pulls) == 1


# ----- matching replies to what was sent ------------------------------------------------------


def sent_with_ids(nodes):
    messages = messages_to(nodes)
    for number, message in enumerate(messages):
        message.metadata.__dict__["_message_id"] = f"m{number}"
    return messages


def superlink_answer_for_lost_node(message):
    """The reply the SuperLink itself makes when `message`'s node stopped sending heartbeats."""
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    return create_message_error_unavailable_res_message(message.metadata, "node_unavail")


def test_replies_pair_with_the_message_they_answer_not_their_sender():
    from flwr.app import Message as FlowerMessage

    sent = sent_with_ids([11, 12, 13])
    lost = superlink_answer_for_lost_node(sent[1])
    assert lost.metadata.src_node_id == 1  # the SuperLink, not node 12
    node_reply = FlowerMessage(RecordDict(), reply_to=sent[0])
    stray = FlowerMessage(RecordDict(), reply_to=sent_with_ids([99])[0])
    stray.metadata.__dict__["_reply_to_message_id"] = "not-ours"
    pairs, unanswered = match_replies(sent, [lost, stray, node_reply, node_reply])
    assert [(m.metadata.dst_node_id, r) for m, r in pairs] == [(11, node_reply), (12, lost)]
    assert [m.metadata.dst_node_id for m in unanswered] == [13]


def test_matching_needs_message_ids():
    with pytest.raises(ValueError, match="message id"):
        match_replies(messages_to([1, 2]), [])


def test_a_node_lost_mid_round_is_one_failure_with_its_partition_and_reason():
    from common.run.config import parse_run_config
    from server_app.registry import SERVER_STRATEGIES, build_strategy
    from server_app.strategies.node_table import NodeInfo
    from tests.replies import collect_replies

    nodes = [NodeInfo(node_id=n, partition_id=p, num_train_examples=10, num_test_examples=5)
             for p, n in enumerate([11, 12, 13])]
    strategy = build_strategy(parse_run_config({}, SERVER_STRATEGIES), nodes)
    strategy.reply_gate.check_reply = lambda reply: None
    sent = sent_with_ids([11, 12, 13])
    from flwr.app import MetricRecord

    good = RecordDict({"metrics": MetricRecord({"num-examples": 10, "partition-id": 0, "train-loss": 0.5})})
    replies = [Message(good, reply_to=sent[0]), superlink_answer_for_lost_node(sent[1])]
    outcome = collect_replies(strategy, sent, replies)
    assert len(outcome.good) == 1
    assert [(f["node"], f["partition"]) for f in outcome.failures] == [(12, 1), (13, 2)]
    assert "Node Unavailable" in outcome.failures[0]["reason"] and outcome.failures[1]["reason"] == "timeout"
