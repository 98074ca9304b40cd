"""A reply whose update alone would make the global model non-finite is refused before any mean, naming the node and
the round (server_app/reply_checks.py `model_overflow`): under the plain mean, a robust mean and with a codec, a
qsgd payload of norm 3e38 or top-k values of 1e30 no longer reach the model and sink the next round on every node."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedsynth import strategies as s
from server_app.reply_checks import FLOAT32_MAX, model_overflow
from tests.conftest import BENCHMARKS
from tests.test_hostile_probe import probe  # noqa: F401 - registers the module `hostile_probe` its families import

sys.path.insert(0, str(BENCHMARKS))
import hostile_probe_replies as replies  # noqa: E402 - the probe's in-process nodes and hostile replies


def test_model_overflow_against_hand_computed_values() -> None:
    current = {"w": np.array([1.0, 2.0], np.float32), "steps": np.array(3, np.int64)}
    assert model_overflow(current, {"w": np.array([0.5, -1.0], np.float32), "steps": np.array(9, np.int64)}) is None
    # 1.5e19 and 1.0e19: squares 2.25e38 + 1e38 = 3.25e38 <= 3.40e38, kept; 1.5e19 and 1.3e19 overflow
    assert model_overflow({"w": np.zeros(2, np.float32)}, {"w": np.array([1.5e19, 1e19], np.float32)}) is None
    reason = model_overflow({"w": np.zeros(2, np.float32)}, {"w": np.array([1.5e19, 1.3e19], np.float32)})
    assert reason is not None and "squared L2 norm 3.94e+38 overflow float32" in reason
    # 3e38 + 1e38 exceeds float32's range once the model is added
    beyond = model_overflow({"w": np.array([1e38], np.float32)}, {"w": np.array([3e38], np.float32)})
    assert beyond is not None and "non-finite in float32 (array 'w')" in beyond
    assert "array 'w'" in model_overflow(current, {"w": np.array([np.nan, 0.0], np.float32)})
    # a global model that overflowed already (a factory's 1e30 weights) is not blamed on the reply
    assert model_overflow({"w": np.full(2, 1e30, np.float32)}, {"w": np.array([1.0, 1.0], np.float32)}) is None
    assert FLOAT32_MAX == pytest.approx(3.4028235e38)


def start(strategy, push: float | None):
    """`strategy.start()` for one round on the hostile probe's three in-process nodes (its replies family), node 902
    replying with a model whose first four weights are `push` (None: honest)."""
    def train(msg, node_id):
        reply = replies.honest_train(msg, node_id)
        return replies.pushed(push)(msg, reply) if node_id == replies.HOSTILE and push is not None else reply

    return strategy.start(grid=replies.Grid(train, replies.honest_evaluate),
                          initial_arrays=ArrayRecord(replies.net().state_dict()), num_rounds=1, timeout=10,
                          train_config=ConfigRecord({"lr": 0.1}))


@pytest.mark.parametrize("make, push", [
    (lambda: s.FedAvg(), 3e38),                                        # the plain mean
    (lambda: s.FedAvg(aggregation="uniform"), 1e30),
    (lambda: s.FedAvg(aggregation="median"), 3e38),                    # a robust mean
    (lambda: s.FedAvg(codec=s.QSGD(bits=4)), 1e38),                    # a qsgd payload of norm 2e38
    (lambda: s.FedAvg(codec=s.TopK(topk_ratio=0.25)), 1e30),                # top-k values of 1e30
    (lambda: s.FedSynSAM(codec=s.QSGD(bits=4), distillation=s.DistillationSettings(trajectory_rounds=5)), 1e30),
])
def test_the_node_whose_update_would_overflow_the_model_is_named_and_refused(make, push: float) -> None:
    strategy = make()
    result = start(strategy, push)
    final = {k: v.numpy() for k, v in result.arrays.items()}
    assert all(np.isfinite(v).all() and np.abs(v).max() < 10 for v in final.values())
    failures = [f.as_record() for f in strategy.round_log.latest.failures]
    assert [f["node"] for f in failures] == [replies.HOSTILE], failures
    assert failures[0]["reason"].startswith("round 1: its update would make the global model"), failures


def test_a_huge_server_lr_is_not_blamed_on_the_nodes() -> None:
    """`server_lr` is the server's own step: honest replies count, and the step's non-finite model is recorded."""
    strategy = s.FedAvg(server_lr=1e300)
    result = start(strategy, None)
    assert not strategy.round_log.latest.failures
    assert result.train_metrics_clientapp[1]["non-finite-model"] > 0
