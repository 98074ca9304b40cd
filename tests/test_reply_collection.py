"""The reply collection (server_app/strategies/reply_collection.py): a round's replies paired with the messages
they answer and sorted into good ones and failures, each failure with its node, partition and reason."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Error, Message, MessageType, MetricRecord, RecordDict

from common.records import message_array_bytes, to_record
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.reply_collection import collect_replies, failure, pair_replies

NODES = [NodeInfo(node_id=n, partition_id=p) for p, n in enumerate([11, 12, 13])]
MODEL = {"w": np.zeros(3, dtype=np.float32)}  # 12 bytes


@pytest.fixture(autouse=True)
def task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


def sent_to(node_ids, pushed: bool = True) -> list[Message]:
    messages = []
    for number, node_id in enumerate(node_ids):
        message = Message(RecordDict({"arrays": to_record(MODEL)}), dst_node_id=node_id,
                          message_type=MessageType.TRAIN)
        if pushed:  # as the grid sets the id when it pushes
            message.metadata.__dict__["_message_id"] = f"m{number}"
        messages.append(message)
    return messages


def reply(to: Message, loss: float = 0.5, src: int | None = None) -> Message:
    answer = Message(RecordDict({"arrays": to_record(MODEL), "metrics": MetricRecord({"num-examples": 10,
                                                                                      "train_loss": loss})}),
                     reply_to=to)
    if src is not None:
        answer.metadata.__dict__["_src_node_id"] = src
    return answer


def accept(reply: Message, node: NodeInfo) -> str | None:
    return None


def test_good_replies_come_in_sent_order_with_their_node_table_index_and_flowers_names_read_as_ours():
    sent = sent_to([13, 11])
    outcome = collect_replies(sent, [reply(sent[1], 0.1), reply(sent[0], 0.3)], NODES, accept)
    assert [(index, r.metadata.src_node_id) for index, r in outcome.good] == [(2, 13), (0, 11)]
    assert outcome.failures == []
    assert [r.content["metrics"]["train-loss"] for _, r in outcome.good] == [0.3, 0.1]  # Flower's train_loss
    assert outcome.uplink_bytes == sum(message_array_bytes(r) for _, r in outcome.good) >= 2 * 12
    assert outcome.uplink_float32_bytes == 0  # no size function given


def test_each_kind_of_failure_names_its_node_partition_and_reason():
    sent = sent_to([11, 12, 13, 14])

    def check(reply: Message, node: NodeInfo) -> str | None:
        if node.partition_id == 1:
            return "reply lacks the 'metrics' record"
        raise KeyError("w")

    error = Message(Error(code=1, reason="node crashed"), reply_to=sent[0])
    outcome = collect_replies(sent, [error, reply(sent[1]), reply(sent[2]), reply(sent[3])], NODES, check)
    assert outcome.good == []
    assert outcome.failures == [
        {"node": 11, "partition": 0, "reason": "error: node crashed"},
        {"node": 12, "partition": 1, "reason": "reply lacks the 'metrics' record"},
        {"node": 13, "partition": 2, "reason": "malformed reply (KeyError: 'w')"},
        {"node": 14, "partition": None, "reason": "reply from a node that is not in the node table"},
    ]


def test_an_unanswered_message_is_a_timeout_and_another_nodes_reply_is_never_the_nodes_own():
    sent = sent_to([11, 12])
    outcome = collect_replies(sent, [reply(sent[0]), reply(sent[1], src=11)], NODES, accept)
    assert [r.metadata.src_node_id for _, r in outcome.good] == [11]
    assert outcome.failures == [
        {"node": 12, "partition": 1, "reason": "reply from node 11 answers the message sent to node 12: dropped"}]
    outcome = collect_replies(sent, [reply(sent[0])], NODES, accept)
    assert outcome.failures == [{"node": 12, "partition": 1, "reason": "timeout"}]


def test_messages_never_pushed_are_paired_by_node_id_and_the_float32_size_is_summed():
    sent = sent_to([11, 12], pushed=False)
    answers = [Message(RecordDict({"arrays": to_record(MODEL), "metrics": MetricRecord({"num-examples": 1})}),
                       dst_node_id=0, message_type=MessageType.TRAIN) for _ in sent]
    for answer, node_id in zip(answers, [12, 11]):
        answer.metadata.__dict__["_src_node_id"] = node_id
    pairs, unanswered = pair_replies(sent, answers)
    assert [(m.metadata.dst_node_id, r.metadata.src_node_id) for m, r in pairs] == [(11, 11), (12, 12)]
    assert unanswered == []
    outcome = collect_replies(sent, answers, NODES, accept, float32_bytes=lambda r: 100)
    assert len(outcome.good) == 2 and outcome.uplink_float32_bytes == 200


def test_a_failure_outside_the_node_table_has_no_partition():
    assert failure(NODES, 12, "timeout") == {"node": 12, "partition": 1, "reason": "timeout"}
    assert failure(NODES, 99, "timeout") == {"node": 99, "partition": None, "reason": "timeout"}
