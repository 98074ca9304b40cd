"""Bounded influence: no client owns a mean, whatever counts, metrics and arrays it sends (issue 34).

The share cap (server_app/influence.py) against hand-computed values; then
hypothesis over one hostile reply among three honest ones, for every
registered algorithm, through the strategies' own reply checks and
aggregation on a tiny model: nothing raises, and the global model, the
algorithm's records and the round's local test accuracy move at most by the
documented bound. Last, the lying-handshake client of the issue, end to end.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.run.config import parse_run_config
from common.protocol import DYNAMIC_CORRECTION, PERTURBATION_DUAL, SCAFFOLD_CONTROL_DELTA
from common.records import from_record, to_record
from common.run.task import make_model
from fedsynth.inprocess import InProcessGrid, run_federation
from server_app.strategies.relay import DecentralizedRelay, relay_reply_metrics
from server_app.influence import bounded_weights, capped_counts, capped_mean, capped_shares
from tests.diffusion_tiny import TINY_DIFFUSION
from tests.replies import collect_replies
from server_app.registry import SERVER_STRATEGIES, build_strategy
from server_app.robust import update_norm
from server_app.strategies.node_table import NodeInfo

# ----- the cap, by hand -----------------------------------------------------------------------------------


def test_a_huge_claim_is_capped_and_the_rest_keep_their_proportions():
    assert capped_shares([1e12, 1, 1, 1, 1], 0.5) == [0.5, 0.125, 0.125, 0.125, 0.125]
    assert capped_shares([6, 3, 1], 0.5) == pytest.approx([0.5, 0.375, 0.125])
    # capping 0.5 -> 0.4 pushes the second over the cap too: both at 0.4, the third gets the rest
    assert capped_shares([5, 4, 1], 0.4) == pytest.approx([0.4, 0.4, 0.2])


def test_shares_below_the_cap_are_left_as_they_are():
    assert capped_shares([3, 2, 2], 0.5) == pytest.approx([3 / 7, 2 / 7, 2 / 7])
    assert bounded_weights([3, 2, 2], 0.5) == [3.0, 2.0, 2.0]  # untouched: the mean stays bitwise the same
    assert capped_shares([9, 1], 1.0) == pytest.approx([0.9, 0.1])


def test_the_cap_holds_at_every_n_above_one_as_the_uniform_mean_where_it_is_at_most_1_over_n():
    # issue 47: before, the cap applied only to means of more than 1/share clients (0.2 with 3 nodes capped
    # nothing, so the global model equalled a liar's); now max(share, 1/n) caps every mean of n > 1
    assert capped_shares([3, 1], 0.5) == [0.5, 0.5]
    assert capped_shares([1e12, 1], 0.4) == [0.5, 0.5]
    assert capped_shares([5, 1, 1], 0.3) == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert capped_shares([1e12, 1, 1], 0.2) == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert capped_shares([1e12, 1, 1], 1e-300) == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert capped_shares([1e12, 1, 1], 0.4) == pytest.approx([0.4, 0.3, 0.3])  # the default at three nodes
    assert bounded_weights([3, 1], 0.4) == [0.5, 0.5]
    assert bounded_weights([1, 1], 0.4) == [1.0, 1.0]  # within the cap: as they came
    assert capped_shares([7], 0.5) == [1.0]
    assert capped_shares([0, 0], 0.5) == [0.5, 0.5]


def test_capped_counts_lower_only_the_largest():
    assert capped_counts([1e12, 100, 100, 100, 100], 0.5) == pytest.approx([400, 100, 100, 100, 100])
    assert capped_counts([5, 4, 1], 0.4) == pytest.approx([2, 2, 1])
    assert capped_counts([3, 1], 0.5) == [1.0, 1.0]  # the cap makes two uniform: no count above the smallest
    assert capped_counts([1e12, 100, 50], 0.3) == [50.0, 50.0, 50.0]
    assert capped_counts([3, 2, 2], 0.5) == [3.0, 2.0, 2.0]
    assert capped_mean([0.0, 1.0, 1.0, 1.0, 1.0], [1e12, 1, 1, 1, 1], 0.5) == pytest.approx(0.5)


# ----- one hostile reply among honest ones, every algorithm ---------------------------------------------

CENTRALIZED = [a for a, cls in SERVER_STRATEGIES.items() if not issubclass(cls, DecentralizedRelay)]
DECENTRALIZED = [a for a, cls in SERVER_STRATEGIES.items() if issubclass(cls, DecentralizedRelay)]
UPDATE_BOUND, RECORD_BOUND, HONEST, SHARE = 0.5, 0.25, 2, 0.4
EXTRA_RECORDS = (SCAFFOLD_CONTROL_DELTA, DYNAMIC_CORRECTION, PERTURBATION_DUAL)


DIFFUSION = ("fedddpm", "fedddpm+")


# The diffusion strategies build their run's model once per strategy (its parameter names): the tests' small
# U-Net (tests/diffusion_tiny.py), not the paper's, which took 90% of these tests' time (0.27 s for each of the
# ~400 strategies a test builds). The replies' arrays are TINY either way: neither model's names are read.
TINY_UNET = {key: TINY_DIFFUSION[key] for key in ("model", "image-size")}


def round_config(algorithm: str, share: float) -> dict:
    return {"algorithm": algorithm, "max-update-norm": UPDATE_BOUND, "max-record-norm": RECORD_BOUND,
            "max-weight-share": share, "trajectory-rounds": 50, "checkpoint-every": 0,
            **(TINY_UNET if algorithm in DIFFUSION else {"model": "mlp"})}


def _mlp_weights() -> dict[str, np.ndarray]:
    """The mlp's array names (FedLESAM-D and FedSMOO read them) with three floats each."""
    cfg = parse_run_config({"model": "mlp"}, SERVER_STRATEGIES)
    return {name: np.full(3, 0.1 * i, dtype=np.float32) for i, (name, _) in enumerate(make_model(cfg).named_parameters())}


# One array of three floats: the strategies never look at array names except FedLESAM-D and FedSMOO (the mlp's
# parameter names). Flower's record machinery costs per array, and the tests run thousands of rounds.
NAMES_READ = ("fedlesam-d", "fedsmoo")
TINY = {"w": np.array([0.0, 0.1, 0.2], dtype=np.float32)}
MLP = _mlp_weights()


class Replies:
    """The global model and the honest replies' records for one weight layout, built once."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.model = to_record(weights)
        self.honest = [self.shifted(0.01 * (p + 1)) for p in range(HONEST)]
        self.extra = to_record({k: np.full_like(v, 0.01) for k, v in weights.items()})

    def shifted(self, scale: float):
        return to_record({k: (v + scale).astype(np.float32) for k, v in self.weights.items()})


LAYOUTS = {"tiny": Replies(TINY), "mlp": Replies(MLP)}


def layout(algorithm: str) -> Replies:
    return LAYOUTS["mlp" if algorithm in NAMES_READ else "tiny"]


@st.composite
def hostile_fields(draw) -> dict:
    """A hostile node's handshake claims and reply: half of them within the checks (so they are aggregated
    and the bound is what holds), half with any value (so they are dropped, and nothing raises)."""
    big = st.one_of(st.integers(1, 10**12), st.sampled_from([1, 40, 10**9, 10**12]))
    claim_train, claim_test = draw(big), draw(st.one_of(st.integers(0, 10**12), st.sampled_from([0, 10, 10**9])))
    fields = {
        "claim-train": claim_train, "claim-test": claim_test,
        "num-examples": draw(st.integers(1, claim_train)), "num-test-examples": draw(st.integers(0, claim_test)),
        "accuracy": draw(st.floats(0, 1)), "train-loss": draw(st.floats(-1e30, 1e30)),
        "scale": draw(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([1e6, -1e6, 0.0]))),
        "record-scale": draw(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([1e6, 0.0]))),
        "partition-id": HONEST, "drop-record": False,
    }
    if draw(st.booleans()):  # out of the checks' bounds
        fields.update(draw(st.fixed_dictionaries({}, optional={
            "num-examples": st.one_of(big, st.integers(-5, 0)),
            "num-test-examples": st.one_of(st.integers(-5, 10**12), st.just(10**9)),
            "accuracy": st.one_of(st.floats(-1, 2), st.sampled_from([math.nan, math.inf])),
            "train-loss": st.sampled_from([math.inf, math.nan, -math.inf]),
            "partition-id": st.sampled_from([0, 99, -1]),
            "drop-record": st.booleans(),
        })))
    return fields


def make_reply(message: Message, arrays, extra, metrics: dict, drop_record: bool = False) -> Message:
    """A reply with the model record `arrays`, and `extra` under every algorithm-specific record name."""
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)})
    if not drop_record:
        for name in EXTRA_RECORDS:
            content[name] = extra
    return Message(content, reply_to=message)


def honest_metrics(pid: int, accuracy: float) -> dict:
    return {"num-examples": 40, "partition-id": pid, "train-loss": 0.5, "num-test-examples": 10,
            "local-test-accuracy": accuracy, "local-test-loss": 1.0}


def run_round(algorithm: str, share: float, hostile: dict | None):
    """One round of the strategy on the tiny model: (new model, round metrics, strategy, failures)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    cfg = parse_run_config(round_config(algorithm, share), SERVER_STRATEGIES)
    # the reference round (hostile None) has the same nodes: the hostile node is sampled but does not answer
    claims = (40, 10) if hostile is None else (hostile["claim-train"], hostile["claim-test"])
    nodes = [NodeInfo(1000 + p, p, 40, 10, (40,)) for p in range(HONEST)] + [NodeInfo(1000 + HONEST, HONEST, *claims)]
    strategy = build_strategy(cfg, nodes)
    strategy.warmed_up = True  # FedDDPM: one aggregation without the warm-up (its auxiliary set stays empty)
    records = layout(algorithm)
    sent = list(strategy.configure_train(1, records.model, ConfigRecord({"lr": 0.1}), None))
    for number, message in enumerate(sent):
        message.metadata.__dict__["_message_id"] = f"m{number}"
    replies = [make_reply(sent[p], records.honest[p], records.extra, honest_metrics(p, 0.2 * p)) for p in range(HONEST)]
    if hostile is not None:
        metrics = {"num-examples": hostile["num-examples"], "partition-id": hostile["partition-id"],
                   "train-loss": hostile["train-loss"], "num-test-examples": hostile["num-test-examples"],
                   "local-test-accuracy": hostile["accuracy"], "local-test-loss": 1.0}
        extra = to_record({k: np.full_like(v, hostile["record-scale"]) for k, v in records.weights.items()})
        replies.append(make_reply(sent[HONEST], records.shifted(hostile["scale"]), extra, metrics, hostile["drop-record"]))
    outcome = collect_replies(strategy, sent, replies)
    arrays, round_metrics = strategy._aggregate_good(1, outcome.good)
    return from_record(arrays), dict(round_metrics), strategy, outcome.failures


@pytest.fixture
def quiet_flower_log(caplog):
    """Thousands of dropped replies: their warnings are checked elsewhere, formatting them here costs time."""
    caplog.set_level(logging.ERROR, logger="flwr")


def distance(a, b) -> float:
    return update_norm({k: a[k].astype(np.float64) - b[k] for k in a})


@pytest.mark.parametrize("algorithm", CENTRALIZED)
def test_one_hostile_reply_moves_model_records_and_metrics_at_most_by_the_bound(algorithm, quiet_flower_log):
    share = SHARE
    honest_model, honest_metrics_, honest_strategy, _ = run_round(algorithm, share, None)
    largest_honest = 0.03 * math.sqrt(sum(v.size for v in layout(algorithm).weights.values()))
    cfg = parse_run_config(round_config(algorithm, share), SERVER_STRATEGIES)
    # the hostile update enters the mean with a share <= s and a norm <= max-update-norm; moving the others'
    # shares moves the mean by at most s times their largest update. FedLESAM-D and FedSMOO add (1/N) of the
    # node's bounded correction divided by alpha (h), FedAvgM's first step is the mean's.
    bound = cfg.server_lr * share * (UPDATE_BOUND + largest_honest) + (RECORD_BOUND / cfg.dyn_alpha + UPDATE_BOUND) / (HONEST + 1)

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(hostile_fields())
    def check(hostile):
        model, metrics, strategy, failures = run_round(algorithm, share, hostile)
        assert distance(model, honest_model) <= bound + 1e-6
        if "local-test-accuracy" in metrics:
            assert abs(metrics["local-test-accuracy"] - honest_metrics_["local-test-accuracy"]) <= share + 1e-9
        control = getattr(strategy, "control", None)
        if control is not None:  # SCAFFOLD's c moves by (1/N) of one bounded c_i+ - c_i
            assert distance(control, honest_strategy.control) <= RECORD_BOUND / (HONEST + 1) + 1e-6
        if failures:
            assert all(isinstance(f["reason"], str) for f in failures)

    check()


@pytest.mark.parametrize("algorithm", DECENTRALIZED)
def test_a_hostile_decentralized_node_moves_its_relayed_model_and_the_metrics_at_most_by_the_bound(
        algorithm, quiet_flower_log):
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    share = SHARE
    cfg = parse_run_config({**round_config(algorithm, share), "topology": "ring"}, SERVER_STRATEGIES)
    records = layout(algorithm)
    weights = records.weights

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(hostile_fields())
    def check(hostile):
        nodes = [NodeInfo(1000 + p, p, 40, 10, (40,)) for p in range(HONEST)]
        nodes.append(NodeInfo(1000 + HONEST, HONEST, hostile["claim-train"], hostile["claim-test"]))
        relay = build_strategy(cfg, nodes)
        sent = list(relay.configure_train(1, to_record(weights), ConfigRecord({"lr": 0.1}), None))
        for number, message in enumerate(sent):
            message.metadata.__dict__["_message_id"] = f"m{number}"
        replies = [make_reply(sent[p], records.honest[0], records.extra, honest_metrics(p, 0.2 * p)) for p in range(HONEST)]
        metrics = {"num-examples": hostile["num-examples"], "partition-id": hostile["partition-id"],
                   "train-loss": hostile["train-loss"], "num-test-examples": hostile["num-test-examples"],
                   "local-test-accuracy": hostile["accuracy"], "local-test-loss": 1.0}
        replies.append(make_reply(sent[HONEST], records.shifted(hostile["scale"]), records.extra, metrics))
        _, round_metrics = relay.aggregate_train(1, replies)
        assert distance(relay.models[HONEST], weights) <= UPDATE_BOUND + 1e-6
        honest = relay_reply_metrics([r.content.metric_records["metrics"] for r in replies[:HONEST]], share)
        if "local-test-accuracy" in round_metrics:
            assert abs(round_metrics["local-test-accuracy"] - honest["local-test-accuracy"]) <= share + 1e-9

    check()


def test_train_reply_claiming_more_test_examples_than_its_handshake_is_dropped():
    hostile = {"claim-train": 40, "claim-test": 10, "num-examples": 40, "num-test-examples": 10**9,
               "accuracy": 0.0, "train-loss": 0.5, "scale": 0.0, "record-scale": 0.0,
               "partition-id": HONEST, "drop-record": False}
    _, _, _, failures = run_round("fedavg", 0.5, hostile)
    assert [f["partition"] for f in failures] == [HONEST]
    assert "'num-test-examples'" in failures[0]["reason"] and "handshake" in failures[0]["reason"]


# ----- the lying-handshake client, end to end ----------------------------------------------------

def lying_handshake(reply: Message) -> Message:
    metrics = reply.content["metrics"]
    assert "label-counts" not in metrics  # the handshake carries no label histogram (docs/own-data.md)
    reply.content["metrics"] = MetricRecord({**dict(metrics), "num-train-examples": 10**12,
                                             "num-test-examples": 10**9})
    return reply


def lying_train(reply: Message) -> Message:
    reply.content["metrics"] = MetricRecord({**dict(reply.content["metrics"]), "num-examples": 10**12,
                                             "num-test-examples": 10**9, "local-test-accuracy": 0.0})
    return reply


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps every train reply's model, by partition."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.models: dict[int, dict] = {}

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for reply in replies:
            if reply.metadata.message_type == "train" and not reply.has_error():
                self.models[int(reply.content["metrics"]["partition-id"])] = from_record(reply.content["arrays"])
        return replies


def test_the_lying_handshake_client_no_longer_owns_the_model_or_the_metric(tmp_path, tiny_data_dir):
    from safetensors.numpy import load_file

    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "r"),
           "run-name": "liar", "num-server-rounds": 1, "local-steps": 3, "batch-size": 16, "model": "mlp",
           "partition": "iid", "checkpoint-every": 0, "central-eval": False, "lr": 0.1, "bounded-influence": True}
    grid = RecordingGrid(5, raw)
    grid.faults[(4, 0, "query")] = lying_handshake
    grid.faults[(4, 1, "train")] = lying_train
    run_federation(raw, grid)
    sent = from_record(next(m for m in grid.sent if m.metadata.message_type == "train").content["arrays"])
    final = load_file(str(tmp_path / "r" / "liar" / "model.safetensors"))
    liar = grid.models[4]
    others = {k: np.mean([grid.models[p][k] for p in range(4)], axis=0) for k in sent}
    # capped at bounded influence's max-weight-share = 0.4: the global model is 0.4 of the way from the others' mean to
    # the liar's (before the cap it was the liar's own model, at distance 1.5e-9; with a 0.5 cap, halfway)
    capped = {k: 0.4 * liar[k] + 0.6 * others[k] for k in sent}
    assert distance(final, capped) <= 1e-4 * distance(liar, others)
    assert distance(final, liar) >= 0.59 * distance(liar, others) > 0
    record = [json.loads(line) for line in (tmp_path / "r" / "liar" / "metrics.jsonl").read_text().splitlines()][-1]
    # the liar reports accuracy 0 on 10^9 test examples: it takes 0.4 of the mean, not all of it (1.7e-8 before)
    assert record["local-test-accuracy"] > 0.05
    assert record["weight-cap-bound"] == 1  # the round says the cap changed a weight
