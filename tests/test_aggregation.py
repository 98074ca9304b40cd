"""Server-side math of the centralized strategies (server_app/strategies), on hand numbers.

Strategies are driven through their Message-API methods: `configure_train` (the
grid argument is unused, so None) builds the instruction messages, and replies
are built the way a ClientApp builds them, `Message(content, reply_to=msg)`.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from common.run.config import parse_run_config
from common.protocol import PREVIOUS_UPDATE, SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA
from common.records import from_record, to_record
from server_app.registry import SERVER_STRATEGIES, build_strategy
from common.records import check_weights
from server_app.strategies.node_table import sample_nodes
from server_app.strategies.fedavg import FedAvg, weighted_mean
from server_app.strategies.node_table import NodeInfo


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Instruction messages take their run id from the process's task identity (as in a ServerApp)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)


def cfg_of(**overrides):
    return parse_run_config({k.replace("_", "-"): v for k, v in overrides.items()}, SERVER_STRATEGIES)


def make_nodes(n: int, examples: int = 1000) -> list[NodeInfo]:
    return [NodeInfo(node_id=1000 + 7 * pid, partition_id=pid, num_train_examples=examples,
                     num_test_examples=2) for pid in range(n)]


def arr(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def start_round(strategy: FedAvg, weights: dict, server_round: int = 1) -> list[Message]:
    return list(strategy.configure_train(server_round, to_record(weights), ConfigRecord({"x": 1}), None))


def node_of(strategy: FedAvg, msg: Message) -> NodeInfo:
    return next(n for n in strategy.node_table.nodes if n.node_id == msg.metadata.dst_node_id)


def make_reply(msg: Message, weights: dict, num_examples: int, partition_id: int,
               train_loss: float = 1.0, extra: dict | None = None) -> Message:
    content = RecordDict({
        "arrays": to_record(weights),
        "metrics": MetricRecord({"num-examples": num_examples, "partition-id": partition_id,
                                 "train-loss": train_loss}),
    })
    for name, record in (extra or {}).items():
        content[name] = record
    return Message(content, reply_to=msg)


# ----- weighted_mean -----------------------------------------------------------------


def test_weighted_mean_hand_weights() -> None:
    values = [{"a": arr(1, 2), "b": arr(0)}, {"a": arr(4, 8), "b": arr(4)}]
    out = weighted_mean(values, [1.0, 3.0])
    # a: 0.25 * [1, 2] + 0.75 * [4, 8] = [3.25, 6.5];  b: 0.75 * 4 = 3
    np.testing.assert_allclose(out["a"], [3.25, 6.5])
    np.testing.assert_allclose(out["b"], [3.0])
    assert out["a"].dtype == np.float32


def test_weighted_mean_normalises_and_uniform() -> None:
    values = [{"a": arr(1)}, {"a": arr(2)}, {"a": arr(6)}]
    np.testing.assert_allclose(weighted_mean(values, [1, 1, 1])["a"], [3.0])
    np.testing.assert_allclose(weighted_mean(values, [100, 100, 100])["a"], [3.0])
    np.testing.assert_allclose(weighted_mean(values, [0, 0, 5])["a"], [6.0])


def test_weighted_mean_accumulates_in_float64() -> None:
    # 1e8 + 1 - 1e8 in float32 loses the 1; the float64 accumulator keeps it.
    values = [{"a": arr(1e8)}, {"a": arr(1.0)}, {"a": arr(-1e8)}]
    np.testing.assert_allclose(weighted_mean(values, [1, 1, 1])["a"], [1.0 / 3.0], rtol=1e-6)


# ----- sample_nodes ------------------------------------------------------------------


@pytest.mark.parametrize("n,p,expected", [
    (10, 0.35, 3), (10, 0.5, 5), (10, 0.09, 1), (10, 0.01, 1), (7, 0.5, 3), (1, 0.5, 1),
    (10, 0.3, 3), (10, 0.7, 7), (100, 0.1, 10),
])
def test_sample_nodes_count_is_floor_n_p_at_least_one(n: int, p: float, expected: int) -> None:
    chosen = sample_nodes(make_nodes(n), p, seed=0, server_round=1)
    assert len(chosen) == expected
    assert len({c.node_id for c in chosen}) == expected  # distinct


@pytest.mark.parametrize("n,p,expected", [(100, 0.29, 29), (100, 0.58, 58)])
def test_sample_nodes_count_for_decimal_fractions(n: int, p: float, expected: int) -> None:
    assert len(sample_nodes(make_nodes(n), p, seed=0, server_round=1)) == expected


def test_sample_nodes_full_participation_returns_all_in_partition_order() -> None:
    nodes = make_nodes(6)
    shuffled = [nodes[i] for i in (3, 0, 5, 1, 4, 2)]
    assert sample_nodes(shuffled, 1.0, seed=0, server_round=1) == nodes
    assert sample_nodes(shuffled, 1.0, seed=9, server_round=7) == nodes


def test_sample_nodes_is_deterministic_and_independent_of_input_order() -> None:
    nodes = make_nodes(20)
    a = sample_nodes(nodes, 0.25, seed=3, server_round=4)
    b = sample_nodes(list(reversed(nodes)), 0.25, seed=3, server_round=4)
    assert a == b
    assert [n.partition_id for n in a] == sorted(n.partition_id for n in a)


def test_sample_nodes_differs_across_rounds_and_seeds() -> None:
    nodes = make_nodes(20)
    by_round = {tuple(n.partition_id for n in sample_nodes(nodes, 0.25, 0, r)) for r in range(1, 11)}
    assert len(by_round) > 1
    assert sample_nodes(nodes, 0.25, 0, 1) != sample_nodes(nodes, 0.25, 0, 2)
    assert sample_nodes(nodes, 0.25, 0, 1) != sample_nodes(nodes, 0.25, 1, 1)
    # every node gets picked sometimes
    seen = {n.partition_id for r in range(1, 41) for n in sample_nodes(nodes, 0.25, 0, r)}
    assert seen == set(range(20))


# ----- check_weights -----------------------------------------------------------------


EXPECTED = {"conv.weight": np.zeros((2, 3), np.float32), "fc.bias": np.zeros(4, np.float32)}


def test_check_weights_accepts_matching() -> None:
    received = {"conv.weight": np.ones((2, 3), np.float32), "fc.bias": np.full(4, -2, np.float32)}
    assert check_weights(received, EXPECTED, "model") is None


@pytest.mark.parametrize("received,words", [
    ({"conv.weight": np.zeros((3, 2), np.float32), "fc.bias": np.zeros(4, np.float32)},
     ["conv.weight", "shape", "(3, 2)"]),
    ({"conv.weight": np.zeros((2, 3), np.float64), "fc.bias": np.zeros(4, np.float32)},
     ["conv.weight", "dtype", "float64"]),
    ({"conv.weight": np.zeros((2, 3), np.float32), "fc.bias": arr(0, np.nan, 0, 0)},
     ["fc.bias", "non-finite"]),
    ({"conv.weight": np.zeros((2, 3), np.float32), "fc.bias": arr(0, 0, np.inf, 0)},
     ["fc.bias", "non-finite"]),
    ({"conv.weight": np.full((2, 3), -np.inf, np.float32), "fc.bias": np.zeros(4, np.float32)},
     ["conv.weight", "non-finite"]),
    ({"conv.weight": np.zeros((2, 3), np.float32)}, ["missing", "fc.bias"]),
    ({**EXPECTED, "extra.param": np.zeros(1, np.float32)}, ["unexpected", "extra.param"]),
])
def test_check_weights_reports_problem_with_array_name(received: dict, words: list[str]) -> None:
    problem = check_weights(received, EXPECTED, "model")
    assert problem is not None
    assert problem.startswith("model")
    for word in words:
        assert word in problem


# ----- FedAvg through the Message API --------------------------------------------------


W0 = {"w": arr(1, 1), "b": arr(0)}


def fedavg_round(strategy: FedAvg, updates: dict[int, tuple[dict, int]], server_round: int = 1):
    """Start a round and answer it: {partition id: (local weights, num-examples)}."""
    messages = start_round(strategy, strategy.current or W0, server_round)
    replies = []
    for msg in messages:
        pid = node_of(strategy, msg).partition_id
        weights, count = updates[pid]
        replies.append(make_reply(msg, weights, count, pid, train_loss=float(pid + 1)))
    for reply in replies:
        assert strategy.reply_gate.check_reply(reply) is None
    return strategy.aggregate_train(server_round, replies)


def test_configure_train_sends_model_and_round_to_each_sampled_node() -> None:
    strategy = build_strategy(cfg_of(fraction_train=0.5, seed=2), make_nodes(6))
    messages = start_round(strategy, W0, server_round=3)
    expected = sample_nodes(make_nodes(6), 0.5, 2, 3)
    assert [m.metadata.dst_node_id for m in messages] == [n.node_id for n in expected]
    for msg in messages:
        assert msg.metadata.message_type == MessageType.TRAIN
        config = msg.content.config_records["config"]
        assert config["server-round"] == 3 and config["x"] == 1
        got = from_record(msg.content.array_records["arrays"])
        assert set(got) == set(W0) and all(np.array_equal(got[k], W0[k]) for k in W0)
    assert set(strategy.current) == set(W0)


# The plain mean's arithmetic by hand: the defaults' bounds on one node's influence (issue 47: two clients are
# averaged uniformly under any cap, and neither update may exceed 1.5x the other's norm) are off here and tested
# in tests/test_influence.py, tests/test_robust.py and tests/test_bounded_influence_runs.py.
PLAIN = {"max_weight_share": 1.0, "max_update_norm_ratio": 0.0}


def test_fedavg_weighted_by_num_examples() -> None:
    strategy = build_strategy(cfg_of(**PLAIN), make_nodes(2))
    record, metrics = fedavg_round(strategy, {
        0: ({"w": arr(2, 2), "b": arr(1)}, 10),   # delta [1, 1], [1]
        1: ({"w": arr(5, -1), "b": arr(-1)}, 30),  # delta [4, -2], [-1]
    })
    # mean delta = (10 * d0 + 30 * d1) / 40 = [3.25, -1.25], [-0.5]
    new = from_record(record)
    np.testing.assert_allclose(new["w"], [4.25, -0.25])
    np.testing.assert_allclose(new["b"], [-0.5])
    assert new["w"].dtype == np.float32
    np.testing.assert_allclose(strategy.current["w"], [4.25, -0.25])
    # train loss weighted by examples: (10 * 1 + 30 * 2) / 40 = 1.75
    assert metrics["train-loss"] == pytest.approx(1.75)
    assert metrics["num-examples"] == 40


def test_fedavg_uniform_aggregation() -> None:
    strategy = build_strategy(cfg_of(aggregation="uniform", **PLAIN), make_nodes(2))
    record, _ = fedavg_round(strategy, {
        0: ({"w": arr(2, 2), "b": arr(1)}, 10),
        1: ({"w": arr(5, -1), "b": arr(-1)}, 30),
    })
    # mean delta = ([1, 1] + [4, -2]) / 2 = [2.5, -0.5]; b: 0
    new = from_record(record)
    np.testing.assert_allclose(new["w"], [3.5, 0.5])
    np.testing.assert_allclose(new["b"], [0.0])


def test_fedavg_server_lr_scales_the_step() -> None:
    strategy = build_strategy(cfg_of(server_lr=0.5, **PLAIN), make_nodes(2))
    record, _ = fedavg_round(strategy, {
        0: ({"w": arr(2, 2), "b": arr(1)}, 10),
        1: ({"w": arr(5, -1), "b": arr(-1)}, 30),
    })
    # w0 + 0.5 * [3.25, -1.25] = [2.625, 0.375]; b: 0.5 * -0.5
    new = from_record(record)
    np.testing.assert_allclose(new["w"], [2.625, 0.375])
    np.testing.assert_allclose(new["b"], [-0.25])


def test_fedavg_result_does_not_depend_on_reply_order() -> None:
    rng = np.random.default_rng(0)
    locals_ = {pid: ({"w": rng.normal(size=2).astype(np.float32), "b": rng.normal(size=1).astype(np.float32)},
                     int(rng.integers(1, 100))) for pid in range(5)}
    results = []
    for order in (list(range(5)), [4, 2, 0, 3, 1]):
        strategy = build_strategy(cfg_of(), make_nodes(5))
        messages = start_round(strategy, W0)
        by_pid = {node_of(strategy, m).partition_id: m for m in messages}
        replies = [make_reply(by_pid[p], *locals_[p], p) for p in order]
        results.append(from_record(strategy.aggregate_train(1, replies)[0]))
    for name in W0:
        assert np.array_equal(results[0][name], results[1][name])  # bitwise


def test_fedavg_only_sampled_nodes_count() -> None:
    strategy = build_strategy(cfg_of(fraction_train=0.5, seed=1), make_nodes(4))
    messages = start_round(strategy, W0)
    assert len(messages) == 2
    replies = [make_reply(m, {"w": arr(3, 3), "b": arr(2)}, 5, node_of(strategy, m).partition_id)
               for m in messages]
    record, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(from_record(record)["w"], [3.0, 3.0])


def test_fedavg_no_replies_returns_none() -> None:
    strategy = build_strategy(cfg_of(), make_nodes(2))
    start_round(strategy, W0)
    assert strategy.aggregate_train(1, []) == (None, None)


def test_fedavgm_velocity_after_two_steps() -> None:
    strategy = build_strategy(cfg_of(algorithm="fedavgm", server_momentum=0.9, server_lr=0.5), make_nodes(1))
    # round 1: delta d1 = [2, 2], [0];  v1 = d1;  w1 = w0 + 0.5 * v1 = [2, 2], [0]
    record, _ = fedavg_round(strategy, {0: ({"w": arr(3, 3), "b": arr(0)}, 10)}, server_round=1)
    np.testing.assert_allclose(strategy.velocity["w"], [2.0, 2.0])
    np.testing.assert_allclose(from_record(record)["w"], [2.0, 2.0])
    # round 2: local [4, 2], [1] -> d2 = [2, 0], [1];  v2 = 0.9 * v1 + d2 = [3.8, 1.8], [1]
    # w2 = w1 + 0.5 * v2 = [3.9, 2.9], [0.5]
    record, _ = fedavg_round(strategy, {0: ({"w": arr(4, 2), "b": arr(1)}, 10)}, server_round=2)
    np.testing.assert_allclose(strategy.velocity["w"], [3.8, 1.8], rtol=1e-6)
    np.testing.assert_allclose(strategy.velocity["b"], [1.0])
    np.testing.assert_allclose(from_record(record)["w"], [3.9, 2.9], rtol=1e-6)
    np.testing.assert_allclose(from_record(record)["b"], [0.5])


def test_fedavgm_velocity_is_per_instance() -> None:
    a = build_strategy(cfg_of(algorithm="fedavgm"), make_nodes(1))
    fedavg_round(a, {0: ({"w": arr(3, 3), "b": arr(0)}, 10)})
    b = build_strategy(cfg_of(algorithm="fedavgm"), make_nodes(1))
    assert b.velocity is None


def test_scaffold_server_control_uses_federation_size() -> None:
    nodes = make_nodes(4)
    strategy = build_strategy(cfg_of(algorithm="scaffold", fraction_train=0.5, seed=0), nodes)
    messages = start_round(strategy, W0)
    assert len(messages) == 2  # sampled n = 2 of N = 4
    for msg in messages:
        c = from_record(msg.content.array_records[SCAFFOLD_CONTROL])
        assert set(c) == set(W0) and all(not v.any() for v in c.values())
    deltas = [{"w": arr(1, 2), "b": arr(4)}, {"w": arr(3, -2), "b": arr(0)}]
    replies = [
        make_reply(msg, {"w": arr(2, 0), "b": arr(1)}, 10 * (i + 1), node_of(strategy, msg).partition_id,
                   extra={SCAFFOLD_CONTROL_DELTA: to_record(d)})
        for i, (msg, d) in enumerate(zip(messages, deltas))
    ]
    for reply in replies:
        assert strategy.reply_gate.check_reply(reply) is None
    record, _ = strategy.aggregate_train(1, replies)
    # c = 0 + (1/4) * ([1, 2] + [3, -2]) = [1, 0];  b: (1/4) * 4 = 1   (not 1/2 * ...)
    np.testing.assert_allclose(strategy.control["w"], [1.0, 0.0])
    np.testing.assert_allclose(strategy.control["b"], [1.0])
    # model = mean as FedAvg (both replies the same model)
    np.testing.assert_allclose(from_record(record)["w"], [2.0, 0.0])
    # the next round sends the updated c
    nxt = start_round(strategy, from_record(record), server_round=2)
    c = from_record(nxt[0].content.array_records[SCAFFOLD_CONTROL])
    np.testing.assert_allclose(c["w"], [1.0, 0.0])


def test_scaffold_rejects_missing_or_bad_control_delta() -> None:
    strategy = build_strategy(cfg_of(algorithm="scaffold"), make_nodes(1))
    (msg,) = start_round(strategy, W0)
    missing = make_reply(msg, W0, 5, 0)
    assert SCAFFOLD_CONTROL_DELTA in strategy.reply_gate.check_reply(missing)
    bad = make_reply(msg, W0, 5, 0, extra={SCAFFOLD_CONTROL_DELTA: to_record({"w": arr(np.nan, 0), "b": arr(0)})})
    problem = strategy.reply_gate.check_reply(bad)
    assert problem is not None and "'w'" in problem and SCAFFOLD_CONTROL_DELTA in problem


def test_previous_update_strategy_sends_last_global_update() -> None:
    strategy = build_strategy(cfg_of(algorithm="mofedsam"), make_nodes(1))
    (msg,) = start_round(strategy, W0)
    assert PREVIOUS_UPDATE not in msg.content.array_records  # round 1: nothing to send
    record, _ = strategy.aggregate_train(1, [make_reply(msg, {"w": arr(3, 0), "b": arr(1)}, 5, 0)])
    (msg2,) = start_round(strategy, from_record(record), server_round=2)
    prev = from_record(msg2.content.array_records[PREVIOUS_UPDATE])
    np.testing.assert_allclose(prev["w"], [2.0, -1.0])
    np.testing.assert_allclose(prev["b"], [1.0])


# ----- check_reply -------------------------------------------------------------------


def test_check_reply_rejects_nan_array_naming_it() -> None:
    strategy = build_strategy(cfg_of(), make_nodes(1))
    (msg,) = start_round(strategy, W0)
    reply = make_reply(msg, {"w": arr(1, np.nan), "b": arr(0)}, 5, 0)
    problem = strategy.reply_gate.check_reply(reply)
    assert problem is not None and "'w'" in problem and "non-finite" in problem


@pytest.mark.parametrize("weights,count,words", [
    ({"w": arr(1, 1)}, 5, ["missing", "b"]),
    ({"w": arr(1, 1), "b": arr(0), "z": arr(0)}, 5, ["unexpected", "z"]),
    ({"w": np.ones(2), "b": arr(0)}, 5, ["'w'", "dtype"]),
    ({"w": arr(1, 1, 1), "b": arr(0)}, 5, ["'w'", "shape"]),
    ({"w": arr(1, 1), "b": arr(np.inf)}, 5, ["'b'", "non-finite"]),
    (W0, 0, ["num-examples"]),
])
def test_check_reply_rejects_bad_replies(weights: dict, count: int, words: list[str]) -> None:
    strategy = build_strategy(cfg_of(), make_nodes(1))
    (msg,) = start_round(strategy, W0)
    problem = strategy.reply_gate.check_reply(make_reply(msg, weights, count, 0))
    assert problem is not None
    for word in words:
        assert word in problem


def test_check_reply_rejects_missing_records_and_float_count() -> None:
    strategy = build_strategy(cfg_of(), make_nodes(1))
    (msg,) = start_round(strategy, W0)
    no_metrics = Message(RecordDict({"arrays": to_record(W0)}), reply_to=msg)
    assert "metrics" in strategy.reply_gate.check_reply(no_metrics)
    float_count = Message(RecordDict({"arrays": to_record(W0),
                                      "metrics": MetricRecord({"num-examples": 5.0})}), reply_to=msg)
    assert "num-examples" in strategy.reply_gate.check_reply(float_count)
    assert strategy.reply_gate.check_reply(make_reply(msg, W0, 5, 0)) is None
    assert isinstance(to_record(W0), ArrayRecord)
