"""The library path checks what the app checks (issue 54): a reply's sender, and the weighting key against
`num-examples`. Each dropped reply is a failure in the round log (`strategy.round_log`), never counted as another node's."""

from __future__ import annotations

import numpy as np
from flwr.app import Message, MessageType, MetricRecord, RecordDict

from fedsynth.strategies import FedAvg, NodeInfo
from common.records import to_record
from server_app.messaging import match_replies
from tests.replies import collect_replies

MODEL = {"w": np.zeros((2, 2), dtype=np.float32)}


def sent_to(node_ids):
    from flwr.supercore.task_identity import TaskIdentity

    # messages take their run id from the process's task identity, as in a ServerApp process
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    messages = []
    for number, node_id in enumerate(node_ids):
        message = Message(RecordDict({"arrays": to_record(MODEL)}),
                          dst_node_id=node_id, message_type=MessageType.TRAIN)
        message.metadata.__dict__["_message_id"] = f"m{number}"  # as the grid sets it when it pushes
        messages.append(message)
    return messages


def reply(to: Message, value: float, metrics: dict | None = None, src: int | None = None) -> Message:
    content = RecordDict({"arrays": to_record({"w": np.full((2, 2), value, dtype=np.float32)}),
                          "metrics": MetricRecord(metrics or {"num-examples": 10, "train-loss": 0.5})})
    answer = Message(content, reply_to=to)
    if src is not None:  # a node answering another node's message id
        answer.metadata.__dict__["_src_node_id"] = src
    return answer


def library_strategy(**kwargs) -> FedAvg:
    """A FedAvg as a Flower developer builds it (no handshake), whose node table holds nodes 11, 12 and 13."""
    strategy = FedAvg(**kwargs)
    strategy.node_table.nodes = [NodeInfo(node_id=n, partition_id=p) for p, n in enumerate([11, 12, 13])]
    strategy.current = dict(MODEL)
    return strategy


def test_a_reply_to_another_nodes_message_is_dropped_with_a_record_and_the_real_reply_counts():
    strategy, sent = library_strategy(), sent_to([11, 12, 13])
    impostor = reply(sent[1], 100.0, src=11)  # node 11 answers node 12's message first
    replies = [reply(sent[0], 1.0), impostor, reply(sent[1], 2.0), reply(sent[2], 3.0)]
    outcome = collect_replies(strategy, sent, replies)
    assert [r.metadata.src_node_id for r in outcome.good] == [11, 12, 13]
    assert impostor not in outcome.good
    assert [(f["node"], f["partition"]) for f in outcome.failures] == [(11, 0)]
    assert "reply from node 11 answers the message sent to node 12" in outcome.failures[0]["reason"]


def test_a_reply_from_another_node_is_not_counted_as_the_silent_nodes():
    strategy, sent = library_strategy(), sent_to([11, 12])
    outcome = collect_replies(strategy, sent, [reply(sent[0], 1.0), reply(sent[1], 100.0, src=11)])
    assert [r.metadata.src_node_id for r in outcome.good] == [11]
    assert [(f["node"], f["partition"]) for f in outcome.failures] == [(12, 1)]
    assert outcome.failures[0]["reason"] == "reply from node 11 answers the message sent to node 12: dropped"


def test_the_superlinks_error_reply_for_a_lost_node_still_counts_for_that_node():
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    strategy, sent = library_strategy(), sent_to([11, 12])
    lost = create_message_error_unavailable_res_message(sent[1].metadata, "node_unavail")
    assert lost.metadata.src_node_id == 1  # from the SuperLink, not from node 12
    outcome = collect_replies(strategy, sent, [reply(sent[0], 1.0), lost])
    assert [(f["node"], f["partition"]) for f in outcome.failures] == [(12, 1)]
    assert outcome.failures[0]["reason"].startswith("error: ")


def test_matching_prefers_the_addressed_node_then_an_error_then_another_node():
    sent = sent_to([11])
    impostor, own = reply(sent[0], 9.0, src=12), reply(sent[0], 1.0)
    assert match_replies(sent, [impostor, own])[0] == [(sent[0], own)]
    assert match_replies(sent, [impostor])[0] == [(sent[0], impostor)]  # paired, so that it is dropped by name


def test_a_weight_that_disagrees_with_num_examples_is_dropped_with_a_record():
    strategy, sent = library_strategy(weighted_by_key="weight"), sent_to([11, 12])
    honest = reply(sent[0], 1.0, {"num-examples": 10, "weight": 10, "train-loss": 0.5})
    inflated = reply(sent[1], 100.0, {"num-examples": 10, "weight": 10**9, "train-loss": 0.5})
    outcome = collect_replies(strategy, sent, [honest, inflated])
    assert outcome.good == [honest]
    assert [(f["node"], f["partition"]) for f in outcome.failures] == [(12, 1)]
    assert outcome.failures[0]["reason"] == ("reply metric 'weight' (weighted_by_key) = 1000000000 disagrees with "
                                             "'num-examples' = 10")


def test_a_weight_equal_to_num_examples_is_used():
    strategy, sent = library_strategy(weighted_by_key="weight"), sent_to([11, 12])
    replies = [reply(sent[0], 1.0, {"num-examples": 10, "weight": 10.0, "train-loss": 0.5}),
               reply(sent[1], 3.0, {"num-examples": 30, "weight": 30, "train-loss": 0.5})]
    outcome = collect_replies(strategy, sent, replies)
    assert len(outcome.good) == 2 and outcome.failures == []
    assert strategy.update_mean.weights(outcome.good) == [10.0, 30.0]  # no cap: the plain weights


def test_a_second_reply_of_a_node_and_a_reply_to_no_message_are_dropped_with_a_record():
    """The hostile probe's find: a node's second reply to its message was left out without a trace."""
    strategy, sent = library_strategy(), sent_to([11, 12])
    first, second = reply(sent[0], 1.0), reply(sent[0], 100.0)
    stray = reply(sent[1], 5.0)
    stray.metadata.__dict__["_reply_to_message_id"] = "no-such-message"
    outcome = collect_replies(strategy, sent, [first, second, reply(sent[1], 2.0), stray])
    assert [r.metadata.src_node_id for r in outcome.good] == [11, 12] and second not in outcome.good
    assert [(f["node"], f["reason"]) for f in outcome.failures] == [
        (11, "a second reply to the message sent to node 11: dropped (the first counts)"),
        (12, "reply to no message of this round: dropped")]


def one_round(strategy: FedAvg):
    """Flower's `start()` for one round on two in-process nodes that each add 1 to every weight."""
    from flwr.app import ConfigRecord

    from tests.library_grid import ClientAppGrid

    def train(msg, context):
        arrays = {k: v.numpy() + 1.0 for k, v in msg.content["arrays"].items()}
        return Message(RecordDict({"arrays": to_record(arrays),
                                   "metrics": MetricRecord({"num-examples": 5, "train-loss": 0.1})}), reply_to=msg)

    return strategy.start(grid=ClientAppGrid(2, train), initial_arrays=to_record(MODEL), num_rounds=1,
                          train_config=ConfigRecord({"lr": 0.1}))


def test_a_server_step_that_makes_the_model_non_finite_is_recorded_in_the_rounds_train_metrics(caplog):
    """Honest replies and `server_lr=1e300` overflow float32: the library path says so (issue 54), as the app's
    outcome does at the end."""
    result = one_round(FedAvg(server_lr=1e300, fraction_evaluate=0.0))
    assert result.train_metrics_clientapp[1]["non-finite-model"] == 1
    assert "lower lr or server_lr (1e+300)" in caplog.text


def test_a_finite_server_step_adds_no_non_finite_record():
    result = one_round(FedAvg(fraction_evaluate=0.0))
    assert "non-finite-model" not in result.train_metrics_clientapp[1]
    np.testing.assert_array_equal(result.arrays.to_numpy_ndarrays()[0], np.ones((2, 2), dtype=np.float32))
