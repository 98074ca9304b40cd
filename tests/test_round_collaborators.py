"""The collaborators a strategy's round machinery is composed of (issue 63), and the pure functions they use.

`RoundBook` (a round's bookkeeping), `ReplyGate` (the reply checks), `UpdateMean` (the mean of updates), the node
table's `partition_of`, and the relay's and FedAvg's pure functions. Each collaborator reads the strategy's
settings when it runs, so a value changed after construction is the one used.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from server_app.strategies.base import TooManyFailedRounds
from server_app.strategies.fedavg import FedAvg, parameter_change
from server_app.strategies.node_table import NodeInfo, NodeTable
from server_app.strategies.relay import bounded_model, moved_too_far, relay_reply_metrics
from server_app.strategies.reply_gate import max_reply_bytes


def reply_from(node_id: int, metrics: dict) -> SimpleNamespace:
    """What `partition_of` and the weights read of a reply: its sender and its metrics."""
    return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node_id),
                           content=SimpleNamespace(metric_records={"metrics": metrics}))


def test_the_round_book_counts_short_rounds_and_raises_after_max_failed_rounds():
    strategy = FedAvg(min_nodes=2, max_failed_rounds=2)
    book = strategy.round_book
    assert book.begin(1, []) == [] and strategy.last_round == 1 and book.trained_this_round()
    assert book.enough_replies(1, 1) is False and strategy.failed_in_a_row == 1
    assert book.enough_replies(2, 2) is True and strategy.failed_in_a_row == 0
    book.enough_replies(3, 0)
    with pytest.raises(TooManyFailedRounds, match="min-nodes=2 nodes answered in 2 rounds in a row"):
        book.enough_replies(4, 1)


def test_the_round_book_reads_the_strategys_settings_when_it_runs():
    strategy = FedAvg(min_nodes=1)
    strategy.min_nodes = 5  # changed after construction
    assert strategy.round_book.enough_replies(1, 3) is False
    strategy.completed_rounds = 3  # restored from a checkpoint
    assert [strategy.round_book.is_active(r) for r in (2, 3, 4)] == [False, False, True]


def test_a_skipped_round_sends_nothing_and_evaluates_nothing():
    strategy = FedAvg()
    strategy.round_book.begin(1, [])
    assert strategy.round_book.skip() == [] and not strategy.round_book.trained_this_round()
    assert strategy.round_book.evaluation_carried is None


def test_partition_of_is_the_table_entrys_else_the_replys_own():
    table = NodeTable([NodeInfo(node_id=7, partition_id=2), NodeInfo(node_id=9, partition_id=0)])
    assert table.partition_of(reply_from(7, {"partition-id": 5})) == 2
    assert table.partition_of(reply_from(8, {"partition-id": 5})) == 5
    assert table.partition_of(reply_from(8, {})) == 0


def test_the_update_means_weights_follow_the_rule_and_the_weighing_metric():
    weighted = FedAvg(weighted_by_key="samples")
    replies = [reply_from(1, {"samples": 10}), reply_from(2, {"samples": 30})]
    assert weighted.update_mean.weights(replies) == [10.0, 30.0] and not weighted.update_mean.bounds_on()
    uniform = FedAvg(aggregation="uniform")
    assert uniform.update_mean.weights(replies) == [1.0, 1.0]
    uniform.aggregation = "weighted"  # read when it runs
    assert uniform.update_mean.weights([reply_from(1, {"num-examples": 4})]) == [4.0]


def test_a_reply_above_three_models_and_a_mebibyte_is_refused_before_it_is_decoded():
    current = {"w": np.zeros(10, dtype=np.float32), "b": np.zeros(2, dtype=np.float64)}
    assert max_reply_bytes(current) == 3 * (40 + 16) + (1 << 20)
    assert max_reply_bytes({}) == 1 << 20


def test_parameter_change_covers_the_trainable_parameters_only():
    current = {"w": np.ones(2, dtype=np.float32), "bn.running_mean": np.zeros(2, dtype=np.float32)}
    new = {"w": np.array([3.0, 0.5], dtype=np.float32), "bn.running_mean": np.ones(2, dtype=np.float32)}
    change = parameter_change(new, current, ["w"])
    assert list(change) == ["w"] and change["w"].tolist() == [2.0, -0.5] and change["w"].dtype == np.float32


def test_a_relayed_model_is_clipped_to_the_bound_and_a_far_one_refused():
    last = {"w": np.zeros(2, dtype=np.float32)}
    model = {"w": np.array([3.0, 4.0], dtype=np.float32)}  # a step of norm 5
    clipped = bounded_model(model, last, 1.0)
    assert np.isclose(np.linalg.norm(clipped["w"]), 1.0) and clipped["w"].dtype == np.float32
    assert bounded_model(model, last, 0.0) is model  # no bound: the model as sent
    assert "moved by 5 " in moved_too_far(model, last, 1.0)
    assert moved_too_far(model, last, 5.5) is None


def test_the_relays_round_metrics_are_the_nodes_own_accuracies():
    metrics = [{"train-loss": 1.0, "num-examples": 10, "num-test-examples": 5, "local-test-accuracy": 0.2},
               {"train-loss": 3.0, "num-examples": 10, "num-test-examples": 5, "local-test-accuracy": 0.6}]
    out = relay_reply_metrics(metrics, 1.0)
    assert out["train-loss"] == 2.0 and np.isclose(out["node-accuracy-mean"], 0.4)
    assert (out["node-accuracy-min"], out["node-accuracy-max"]) == (0.2, 0.6)
    assert relay_reply_metrics([], 1.0) == {}
