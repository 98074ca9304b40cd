"""A round waits for a node that the SuperLink reports unavailable and sends its message again when it is back.

The grid below plays Flower 1.42's SuperLink as server_app/node_return.py describes it: a message to a node
that is offline is answered by the SuperLink itself ("Node Unavailable", code 5, from node id 1) and
deleted; an offline node is not in `get_node_ids()`; a node that activates again (under the same id, as with
SuperNode authentication) gets the messages pushed from then on.
"""

from __future__ import annotations

import time

from flwr.app import Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

from server_app.messaging import PollingGrid, send_and_receive
from server_app.node_return import NodeReturnWait, is_node_unavailable
from tests.test_messaging import messages_to


class RestartingGrid(Grid):
    """Nodes that are offline between given times; a message pushed while its node is online is answered."""

    def __init__(self, nodes: list[int], offline: dict[int, tuple[float, float]] | None = None,
                 joins: dict[int, float] | None = None) -> None:
        self.start = time.monotonic()
        self.nodes = nodes
        self.offline = offline or {}  # node -> (from, until) seconds after start
        self.joins = joins or {}      # node ids that connect at a time (never sent anything)
        self.pushes: list[tuple[int, str]] = []  # (node, message id) per push, in order
        self.waiting: dict[str, Message] = {}

    def clock(self) -> float:
        return time.monotonic() - self.start

    def is_online(self, node: int) -> bool:
        begin, end = self.offline.get(node, (float("inf"), float("inf")))
        return not begin <= self.clock() < end

    def create_message(self, *args, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError

    def set_run(self, run_id: int) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover - not used
        raise NotImplementedError

    def get_node_ids(self):
        joined = [node for node, at in self.joins.items() if self.clock() >= at]
        return [node for node in self.nodes if self.is_online(node)] + joined

    def push_messages(self, messages):
        ids = []
        for message in messages:
            # Flower's deployment grid: the id is the content hash, so a message pushed again keeps its id
            message.metadata.__dict__["_message_id"] = f"m{message.metadata.dst_node_id}"
            self.pushes.append((message.metadata.dst_node_id, message.metadata.message_id))
            self.waiting[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = []
        for message_id in sorted(message_ids):
            message = self.waiting.get(message_id)
            if message is None:
                continue
            if not self.is_online(message.metadata.dst_node_id):  # the SuperLink answers for it, and forgets it
                replies.append(create_message_error_unavailable_res_message(message.metadata, "node_unavail"))
            else:
                content = RecordDict({"metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5})})
                replies.append(Message(content, reply_to=message))
            del self.waiting[message_id]
        return replies

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - Flower's, 3 s polls
        raise AssertionError("the server must not use Grid.send_and_receive")


def quick(return_wait: float) -> NodeReturnWait:
    """A return wait that looks at the grid's nodes every 20 ms (1 s in a run)."""
    return NodeReturnWait(return_wait, check_interval=0.02)


def test_a_node_reported_unavailable_gets_its_message_again_when_it_is_back_and_its_reply_counts():
    grid = RestartingGrid([11, 12, 13], offline={12: (0.0, 0.3)})  # 12 restarts: away for 0.3 s
    returns = quick(5.0)
    started = time.monotonic()
    replies = send_and_receive(grid, messages_to([11, 12, 13]), timeout=5.0, poll_interval=0.01, returns=returns)
    elapsed = time.monotonic() - started
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m11", "m12", "m13"]
    assert not any(r.has_error() for r in replies)  # 12's own reply, not the SuperLink's answer
    assert [node for node, _ in grid.pushes].count(12) == 2 and returns.resent == 1
    (event,) = returns.take_events()  # what the round's record lists as node-returns
    # waited: from the SuperLink's answer, a moment after the grid's clock started
    assert event["node"] == 12 and event["outcome"] == "back: message sent again" and 0.25 <= event["waited"] < 1.3
    assert 0.3 <= elapsed < 0.3 + 1.0  # sent again within a check of its return, not at the timeout


def test_the_reply_to_the_message_sent_again_counts_for_its_node_in_the_round():
    from common.run.config import parse_run_config
    from server_app.registry import SERVER_STRATEGIES, build_strategy
    from server_app.strategies.node_table import NodeInfo
    from tests.replies import collect_replies

    nodes = [NodeInfo(node_id=n, partition_id=p, num_train_examples=10, num_test_examples=5)
             for p, n in enumerate([11, 12, 13])]
    strategy = build_strategy(parse_run_config({}, SERVER_STRATEGIES), nodes)
    strategy._check_train_reply = lambda reply, node: None
    grid = PollingGrid(RestartingGrid([11, 12, 13], offline={12: (0.0, 0.2)}), poll_interval=0.01)
    grid.returns.check_interval = 0.02
    sent = messages_to([11, 12, 13])
    outcome = collect_replies(strategy, sent, list(grid.send_and_receive(sent, timeout=5.0)))
    assert len(outcome.good) == 3 and outcome.failures == []


def test_a_node_that_stays_away_keeps_the_superlinks_answer_and_is_not_waited_for_again_until_it_answers():
    grid = RestartingGrid([11, 12], offline={12: (0.0, 2.5)})
    returns = quick(1.0)
    started = time.monotonic()
    replies = send_and_receive(grid, messages_to([11, 12]), timeout=5.0, poll_interval=0.01, returns=returns)
    first = time.monotonic() - started
    (lost,) = [r for r in replies if r.has_error()]
    assert is_node_unavailable(lost) and "Node Unavailable" in lost.error.reason
    assert lost.metadata.reply_to_message_id == "m12"
    assert 1.0 <= first < 1.0 + 0.8 and returns.given_up == {12}
    started = time.monotonic()  # the next round: 12 is still away, and answered at once
    replies = send_and_receive(grid, messages_to([11, 12]), timeout=5.0, poll_interval=0.01, returns=returns)
    assert time.monotonic() - started < 0.6 and sum(r.has_error() for r in replies) == 1
    while grid.clock() < 2.5:
        time.sleep(0.05)
    replies = send_and_receive(grid, messages_to([11, 12]), timeout=5.0, poll_interval=0.01, returns=returns)
    assert not any(r.has_error() for r in replies) and returns.given_up == set()  # back: waited for again


def test_without_a_return_wait_the_superlinks_answer_is_the_reply_at_once():
    grid = RestartingGrid([11, 12], offline={12: (0.0, 60.0)})
    started = time.monotonic()
    for returns in (None, quick(0.0)):
        replies = send_and_receive(grid, messages_to([11, 12]), timeout=5.0, poll_interval=0.01, returns=returns)
        assert sum(is_node_unavailable(r) for r in replies) == 1 and len(replies) == 2
    assert time.monotonic() - started < 1.5 and len(grid.pushes) == 4  # waiting would take the 5 s timeout


def test_the_wait_ends_at_the_rounds_timeout():
    grid = RestartingGrid([11, 12], offline={12: (0.0, 60.0)})
    started = time.monotonic()
    returns = quick(30.0)
    replies = send_and_receive(grid, messages_to([11, 12]), timeout=0.3, poll_interval=0.01, returns=returns)
    assert 0.3 <= time.monotonic() - started < 0.3 + 1.0
    assert [(e["node"], e["outcome"]) for e in returns.take_events()] == [(12, "round-timeout reached")]
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m11", "m12"]
    assert sum(is_node_unavailable(r) for r in replies) == 1


def test_a_node_id_never_seen_before_ends_the_wait():
    # without SuperNode authentication a restarted SuperNode comes back under a new id: the old one will not
    grid = RestartingGrid([11, 12], offline={12: (0.0, 60.0)}, joins={77: 0.2})
    started = time.monotonic()
    replies = send_and_receive(grid, messages_to([11, 12]), timeout=5.0, poll_interval=0.01, returns=quick(30.0))
    assert 0.2 <= time.monotonic() - started < 0.2 + 1.5  # not the 5 s timeout
    assert sum(is_node_unavailable(r) for r in replies) == 1 and len(replies) == 2


def test_a_run_without_a_lost_node_sends_each_message_once():
    grid = RestartingGrid([11, 12, 13])
    returns = quick(5.0)
    replies = send_and_receive(grid, messages_to([11, 12, 13]), timeout=5.0, poll_interval=0.01, returns=returns)
    assert len(replies) == 3 and len(grid.pushes) == 3 and returns.resent == 0


def test_a_connected_node_that_was_not_sampled_does_not_end_the_wait():
    grid = PollingGrid(RestartingGrid([11, 12, 13], offline={12: (0.0, 0.2)}), poll_interval=0.01)
    grid.returns.check_interval = 0.02
    replies = list(grid.send_and_receive(messages_to([11, 12]), timeout=5.0))  # 13 is connected, not asked
    assert len(replies) == 2 and not any(r.has_error() for r in replies) and grid.returns.resent == 1


# ----- who ended a lost node's session ------------------------------------------------------------------------

def test_session_end_reads_the_answer_against_the_heartbeat_deadline():
    from server_app.node_return import session_end

    assert session_end(100.0, 130.0).startswith("the SuperNode ended its session itself (deactivated 30 s before")
    assert session_end(131.0, 130.0).startswith("the SuperLink ended its session: no heartbeat within 2 x")
    assert "not known" in session_end(100.0, None)


class DeadlineGrid(RestartingGrid):
    """RestartingGrid whose `get_nodes()` lists each online node's heartbeat deadline, as Flower's grids do:
    `deadline` seconds from now (a node that deactivates itself goes offline long before it)."""

    def __init__(self, nodes, offline, deadline: float) -> None:
        super().__init__(nodes, offline)
        self.deadline = deadline

    def get_nodes(self):
        from flwr.proto.node_pb2 import NodeInfo

        return [NodeInfo(node_id=node, online_until=time.time() + self.deadline) for node in self.get_node_ids()]


def test_the_answer_for_a_node_that_deactivated_itself_says_so():
    grid = PollingGrid(DeadlineGrid([11, 12], offline={12: (0.05, 99.0)}, deadline=60.0), poll_interval=0.01,
                       node_return_wait=0.0)
    assert list(grid.get_node_ids()) == [11, 12]  # as the strategy samples the round's nodes: 60 s deadlines
    time.sleep(0.06)  # then 12 stops
    (lost,) = [r for r in grid.send_and_receive(messages_to([11, 12]), timeout=5.0) if r.has_error()]
    assert is_node_unavailable(lost)
    assert lost.error.reason.startswith("Node Unavailable: the SuperNode ended its session itself"), lost.error.reason


def test_the_answer_for_a_node_whose_heartbeats_stopped_says_so():
    grid = PollingGrid(DeadlineGrid([11, 12], offline={12: (0.05, 99.0)}, deadline=0.01), poll_interval=0.01,
                       node_return_wait=0.0)
    assert list(grid.get_node_ids()) == [11, 12]
    time.sleep(0.06)  # the deadline its last heartbeat set had passed when the SuperLink answered
    (lost,) = [r for r in grid.send_and_receive(messages_to([11, 12]), timeout=5.0) if r.has_error()]
    assert lost.error.reason.startswith("Node Unavailable: the SuperLink ended its session: no heartbeat"), \
        lost.error.reason
