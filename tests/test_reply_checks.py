"""Every field of every reply is checked before use: property tests with random malformed replies.

The reply checks (server_app/reply_checks.py) and the round's reply sorting and
aggregation (the strategies' `aggregate_train`) are fed random malformed
replies: none raises, and none is averaged in.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.run.config import parse_run_config
from common.records import from_record, model_weights, to_record
from common.run.task import make_model
from tests.replies import collect_replies
from server_app.registry import SERVER_STRATEGIES, build_strategy
from server_app.reply_checks import (
    check_evaluate_metrics,
    check_handshake_metrics,
    check_train_metrics,
    is_number,
)
from server_app.strategies.base import checked_evaluate_metrics, evaluate_messages
from server_app.strategies.fedavg import aggregate_metrics
from server_app.strategies.node_table import NodeInfo

# Anything a Mapping may hold (the checks take any mapping), and what a MetricRecord may hold (a reply's record).
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.text(max_size=5),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(min_value=-5, max_value=10**6), max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
    st.lists(st.text(max_size=2), max_size=2),
)
RECORD_VALUE = st.one_of(
    st.integers(min_value=-(2**62), max_value=2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(min_value=-5, max_value=10**6), max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
)
TRAIN_KEYS = ["num-examples", "partition-id", "train-loss", "num-test-examples", "local-test-accuracy",
              "local-test-loss", "local-steps", "stat-cog-time", "own-model-round", "synthetic-examples"]
HANDSHAKE_KEYS = ["partition-id", "num-partitions", "num-train-examples", "num-test-examples"]


def valid_train(pid: int = 1, n: int = 40) -> dict:
    return {"num-examples": n, "partition-id": pid, "train-loss": 0.7, "local-steps": 3,
            "num-test-examples": 10, "local-test-accuracy": 0.5, "local-test-loss": 1.2}


def corrupted(base: dict, keys: list[str], values) -> st.SearchStrategy[dict]:
    """`base` with one to three keys removed or replaced by a random value."""
    def apply(changes):
        out = dict(base)
        for key, value, drop in changes:
            if drop:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    return st.lists(st.tuples(st.sampled_from(keys), values, st.booleans()), min_size=1, max_size=3).map(apply)


def train_fields_are_usable(m: dict, pid: int, limit: int) -> bool:
    """What the server reads of an accepted train reply, checked independently of the code under test."""
    ok = (type(m.get("num-examples")) is int and 1 <= m["num-examples"] <= limit
          and m.get("partition-id") == pid and type(m.get("partition-id")) is int
          and is_number(m.get("train-loss")) and all(is_number(v) for v in m.values()))
    if ok and "num-test-examples" in m:
        ok = (type(m["num-test-examples"]) is int and m["num-test-examples"] >= 0
              and 0 <= m.get("local-test-accuracy", -1) <= 1 and m.get("local-test-loss", -1) >= 0)
    return ok


@settings(max_examples=400, deadline=None)
@given(corrupted(valid_train(), TRAIN_KEYS + ["junk"], ANY_VALUE))
def test_train_check_never_raises_and_accepts_only_usable_metrics(metrics):
    reason = check_train_metrics(metrics, partition_id=1, max_examples=40)
    assert reason is None or isinstance(reason, str)
    if reason is None:
        assert train_fields_are_usable(metrics, 1, 40)
        # what the server computes from an accepted reply does not raise
        aggregate_metrics([SimpleNamespace(content=RecordDict({"metrics": MetricRecord(metrics)}))], 0.5)


@settings(max_examples=300, deadline=None)
@given(corrupted({"num-examples": 10, "partition-id": 1, "local-test-accuracy": 0.5, "local-test-loss": 1.0},
                 ["num-examples", "partition-id", "local-test-accuracy", "local-test-loss", "junk"], ANY_VALUE))
def test_evaluate_check_never_raises_and_accepts_only_usable_metrics(metrics):
    reason = check_evaluate_metrics(metrics, partition_id=1, max_examples=10)
    if reason is None:
        assert type(metrics["num-examples"]) is int and 0 <= metrics["num-examples"] <= 10
        assert 0 <= metrics["local-test-accuracy"] <= 1 and math.isfinite(metrics["local-test-loss"])


@settings(max_examples=300, deadline=None)
@given(corrupted({"partition-id": 1, "num-partitions": 3, "num-train-examples": 5, "num-test-examples": 2},
                 HANDSHAKE_KEYS + ["junk"], ANY_VALUE))
def test_handshake_check_never_raises_and_accepts_only_usable_metrics(metrics):
    reason = check_handshake_metrics(metrics)
    if reason is None:
        assert all(is_number(v) for v in metrics.values())
        assert type(metrics["partition-id"]) is int and metrics["partition-id"] >= 0
        for key in ("num-train-examples", "num-test-examples"):
            assert type(metrics[key]) is int and metrics[key] >= 0
        if "num-partitions" in metrics:  # absent where nodes hold their own data (partition = node)
            assert type(metrics["num-partitions"]) is int and 0 <= metrics["partition-id"] < metrics["num-partitions"]


@pytest.mark.parametrize("metrics, words", [
    (None, ["lacks the 'metrics'"]),
    ({k: v for k, v in valid_train().items() if k != "train-loss"}, ["'train-loss'"]),
    ({k: v for k, v in valid_train().items() if k != "local-test-accuracy"}, ["'local-test-accuracy'"]),
    ({**valid_train(), "train-loss": [0.1, 0.2]}, ["'train-loss'", "finite number"]),
    ({**valid_train(), "num-examples": 10**12}, ["exceeds", "handshake"]),
    ({**valid_train(), "partition-id": 0}, ["partition 1"]),
    ({**valid_train(), "train-loss": float("nan")}, ["'train-loss'"]),
])
def test_train_check_names_the_field(metrics, words):
    reason = check_train_metrics(metrics, partition_id=1, max_examples=40)
    assert reason is not None and all(w in reason for w in words), reason


def test_handshake_without_metrics_and_evaluate_without_accuracy_are_refused():
    assert "lacks" in check_handshake_metrics(None)
    assert "'local-test-accuracy'" in check_evaluate_metrics({"num-examples": 3, "partition-id": 0, "local-test-loss": 1.0})


# ----- the round: random malformed replies among honest ones ----------------------------------------

@pytest.fixture(scope="module")
def strategy_setup():
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    cfg = parse_run_config({"model": "mlp"}, SERVER_STRATEGIES)
    nodes = [NodeInfo(1000 + p, p, 40, 10, (40,)) for p in range(3)]
    weights = model_weights(make_model(cfg, seeded=True))
    return cfg, nodes, weights


def round_messages(cfg, nodes, weights):
    strategy = build_strategy(cfg, nodes)
    sent = list(strategy.configure_train(1, to_record(weights), ConfigRecord({"lr": 0.1}), None))
    for number, message in enumerate(sent):  # ids as a grid gives them when it pushes (replies are matched by them)
        message.metadata.__dict__["_message_id"] = f"m{number}"
    return strategy, sent


def honest_reply(message: Message, weights, pid: int, scale: float) -> Message:
    moved = {k: (v + scale).astype(np.float32) for k, v in weights.items()}
    return Message(RecordDict({"arrays": to_record(moved), "metrics": MetricRecord(valid_train(pid, 40))}),
                   reply_to=message)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corrupted(valid_train(2, 40), TRAIN_KEYS, RECORD_VALUE))
def test_random_malformed_reply_is_dropped_and_never_averaged_in(strategy_setup, metrics):
    cfg, nodes, weights = strategy_setup
    if train_fields_are_usable(metrics, 2, 40):
        return  # the corruption left a usable reply
    strategy, sent = round_messages(cfg, nodes, weights)
    replies = [honest_reply(sent[0], weights, 0, 0.01), honest_reply(sent[1], weights, 1, -0.02)]
    bad = honest_reply(sent[2], weights, 2, 100.0)
    bad.content["metrics"] = MetricRecord(metrics)
    outcome = collect_replies(strategy, sent, replies + [bad])
    assert [f["partition"] for f in outcome.failures] == [2]
    arrays, _ = strategy._aggregate_good(1, outcome.good)

    reference, sent_ref = round_messages(cfg, nodes, weights)
    expected, _ = reference._aggregate_good(1, collect_replies(reference, sent_ref, [
        honest_reply(sent_ref[0], weights, 0, 0.01), honest_reply(sent_ref[1], weights, 1, -0.02)]).good)
    for name, value in from_record(expected).items():
        np.testing.assert_array_equal(from_record(arrays)[name], value)


def test_reply_claiming_more_examples_than_its_handshake_is_dropped(strategy_setup):
    cfg, nodes, weights = strategy_setup
    strategy, sent = round_messages(cfg, nodes, weights)
    greedy = honest_reply(sent[0], weights, 0, 5.0)
    greedy.content["metrics"] = MetricRecord({**valid_train(0, 40), "num-examples": 10**12})
    outcome = collect_replies(strategy, sent, [greedy, honest_reply(sent[1], weights, 1, 0.0)])
    assert outcome.failures[0]["partition"] == 0 and "handshake" in outcome.failures[0]["reason"]


def test_duplicate_and_unsolicited_replies_are_ignored(strategy_setup):
    cfg, nodes, weights = strategy_setup
    strategy, sent = round_messages(cfg, nodes, weights)
    first = honest_reply(sent[0], weights, 0, 0.0)
    outcome = collect_replies(strategy, sent, [first, honest_reply(sent[0], weights, 0, 9.0)])
    assert outcome.good == [first]


def test_final_evaluation_skips_malformed_replies(strategy_setup):
    cfg, nodes, weights = strategy_setup
    strategy = build_strategy(cfg, nodes)
    sent = evaluate_messages(1, to_record(weights), ConfigRecord({}), nodes)
    for number, message in enumerate(sent):
        message.metadata.__dict__["_message_id"] = f"e{number}"
    good = {"num-examples": 10, "partition-id": 0, "local-test-accuracy": 0.8, "local-test-loss": 0.5}
    replies = [
        Message(RecordDict({"metrics": MetricRecord(good)}), reply_to=sent[0]),
        Message(RecordDict({"metrics": MetricRecord({"num-examples": 10, "partition-id": 1})}), reply_to=sent[1]),
        Message(RecordDict({}), reply_to=sent[2]),
    ]
    assert len(checked_evaluate_metrics(nodes, replies)) == 1
    assert strategy.aggregate_evaluate(1, replies)["local-test-accuracy"] == pytest.approx(0.8)
