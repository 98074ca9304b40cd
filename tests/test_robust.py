"""Bounded influence of one client: robust rules equal Flower's, and a 10^6x update cannot take over the model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg, Krum

from common.records import from_record, to_record
from fedsynth.inprocess import InProcessGrid, run_federation
from server_app.robust import clip_update, combine_updates, krum_index, update_norm


def random_updates(n: int = 7, seed: int = 0) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(seed)
    w = {"a": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)}
    deltas = [{k: (rng.normal(size=v.shape) * (1 + i)).astype(np.float32) for k, v in w.items()} for i in range(n)]
    deltas[2] = {k: v * 1e3 for k, v in deltas[2].items()}  # one outlier
    return w, deltas


def flower_replies(w: dict, deltas: list[dict]) -> list[Message]:
    """What Flower's strategies aggregate: the clients' models w + delta_i, with a sample count each."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    replies = []
    for i, delta in enumerate(deltas):
        sent = Message(RecordDict(), dst_node_id=100 + i, message_type=MessageType.TRAIN)
        model = {k: w[k] + delta[k] for k in w}
        replies.append(Message(RecordDict({"arrays": to_record(model), "metrics": MetricRecord({"num-examples": 10})}),
                               reply_to=sent))
    return replies


def flower_model(strategy, w, deltas) -> dict:
    arrays, _ = strategy.aggregate_train(1, flower_replies(w, deltas))
    assert isinstance(arrays, ArrayRecord)
    return from_record(arrays)


@pytest.mark.parametrize("rule, flower", [
    ("median", FedMedian()),
    ("trimmed-mean", FedTrimmedAvg(beta=0.2)),
    ("krum", Krum(num_malicious_nodes=1)),
])
def test_robust_rules_on_updates_equal_flowers_strategies_on_models(rule, flower):
    w, deltas = random_updates()
    ours = combine_updates(deltas, rule, trim_fraction=0.2, num_byzantine=1)
    theirs = flower_model(flower, w, deltas)
    for name in w:
        np.testing.assert_allclose(w[name] + ours[name], theirs[name], rtol=1e-5, atol=1e-5)


def test_krum_never_selects_the_outlier():
    _, deltas = random_updates()
    assert krum_index(deltas, 1) != 2


def test_clip_scales_to_the_bound_and_keeps_short_updates():
    delta = {"a": np.array([3.0, 0.0], np.float32), "b": np.array([4.0], np.float32)}
    assert update_norm(delta) == pytest.approx(5.0)
    clipped = clip_update(delta, 1.0)
    np.testing.assert_allclose(clipped["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped["b"], [0.8], rtol=1e-6)
    assert clip_update(delta, 10.0) is delta


# ----- one of five clients sends a 10^6x update ------------------------------------------------------

def amplify(grid: InProcessGrid, factor: float):
    """A fault turning a node's reply into w + factor * (w_i - w), w being the model it was sent."""
    def fault(reply: Message) -> Message:
        sent = from_record(grid.sent[-1].content.array_records["arrays"])
        model = from_record(reply.content.array_records["arrays"])
        reply.content["arrays"] = to_record({k: sent[k] + factor * (model[k] - sent[k]) for k in model})
        return reply

    return fault


def run_five(tmp_path, data_dir, name: str, attacker: bool, **extra) -> dict:
    raw = {
        "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
        "run-name": name, "num-server-rounds": 3, "local-steps": 5, "batch-size": 16, "model": "mlp",
        "partition": "iid", "lr": 0.1, "checkpoint-every": 0, "eval-every": 0, **extra,
    }
    grid = InProcessGrid(5, raw)
    if attacker:
        for rnd in range(1, 4):
            grid.faults[(4, rnd, "train")] = amplify(grid, 1e6)
    run_federation(raw, grid)
    return json.loads((tmp_path / "results" / name / "summary.json").read_text())


@pytest.fixture(scope="module")
def clean_accuracy(tmp_path_factory, tiny_data_dir):
    return run_five(tmp_path_factory.mktemp("clean"), tiny_data_dir, "clean", attacker=False)["final-central-accuracy"]


def test_without_a_defence_the_attacker_takes_over(tmp_path, tiny_data_dir, clean_accuracy):
    # the default bound relative to the round's median update norm is a defence (issue 47): off here
    summary = run_five(tmp_path, tiny_data_dir, "attacked", attacker=True, **{"max-update-norm-ratio": 0.0})
    assert clean_accuracy > 0.5
    assert summary.get("final-central-accuracy", 0.0) < clean_accuracy - 0.2 or summary["status"] == "failed"


@pytest.mark.parametrize("defence", [
    {"aggregation": "median"},
    {"aggregation": "trimmed-mean"},
    {"aggregation": "krum"},
    {"max-update-norm": 5.0},
    {"max-update-norm": 5.0, "update-norm-action": "refuse"},
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_a_defence_keeps_accuracy_within_two_points_of_the_clean_run(tmp_path, tiny_data_dir, clean_accuracy, defence):
    summary = run_five(tmp_path, tiny_data_dir, "defended", attacker=True, **defence)
    assert summary["final-central-accuracy"] >= clean_accuracy - 0.02, (summary["final-central-accuracy"], clean_accuracy)


# ----- the default bound relative to the round's median update norm (issue 47) ----------------------------

def test_the_median_bound_clips_to_ratio_times_the_lower_median_and_drops_nothing():
    from server_app.robust import bounded_updates, lower_median, median_norm_bound

    deltas = [{"a": np.array([n, 0.0], np.float32)} for n in (1.0, 2.0, 4.0, 1e6)]
    assert lower_median([4.0, 1.0, 1e6, 2.0]) == 2.0 and lower_median([3.0, 1.0]) == 1.0
    assert median_norm_bound(deltas, 1.5) == pytest.approx(3.0)
    bounded = bounded_updates(deltas, 0.0, 1.5)
    assert [float(d["a"][0]) for d in bounded] == pytest.approx([1.0, 2.0, 3.0, 3.0])  # clipped, not dropped
    assert bounded[0] is deltas[0]  # short updates are left as they came
    # the fixed bound first, then the median of what it left: [1, 2, 2, 2] -> lower median 2, bound 3
    assert [float(d["a"][0]) for d in bounded_updates(deltas, 2.0, 1.5)] == pytest.approx([1.0, 2.0, 2.0, 2.0])
    assert bounded_updates(deltas, 0.0, 0.0) is deltas  # off
    assert bounded_updates(deltas[:1], 0.0, 1.5) == deltas[:1]  # one update: nothing to compare with
    two = bounded_updates([deltas[0], deltas[3]], 0.0, 1.5)  # of two, neither exceeds 1.5x the other
    assert float(two[1]["a"][0]) == pytest.approx(1.5)
    empty = [{"a": np.zeros(2, np.float32)}] * 2 + [deltas[3]]
    assert bounded_updates(empty, 0.0, 1.5)[2] is deltas[3]  # a median of 0 erases nothing
