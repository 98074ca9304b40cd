"""fedsynth's strategies take Flower's FedAvg parameters with Flower's meaning, or refuse them naming the
parameter to use; reply metrics fedsynth does not read are averaged into `Result` as Flower's FedAvg averages
them; an unknown keyword names the class and the nearest parameter; the grouped values import without torch.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from common.errors import ConfigError
from common.records import from_record, to_record
from fedsynth import strategies
from fedsynth.strategies import FedAvg, FedProx, ReplyContractError
from tests.library_grid import ClientAppGrid

MODEL = {"w": np.zeros((2, 2), dtype=np.float32)}
CLASSES = [getattr(strategies, name) for name in strategies.__all__
           if isinstance(getattr(strategies, name), type) and hasattr(getattr(strategies, name), "configure_train")]


def _metrics(pid: int) -> dict:
    return {"num-examples": 10 * (pid + 1), "train-loss": 0.5, "my-score": float(pid), "my-count": pid + 3}


def _train(msg: Message, context) -> Message:
    """A developer's client: the model plus one, its own metrics beside Flower's required ones."""
    pid = context.node_config["partition-id"]
    model = {name: value + 1.0 for name, value in from_record(msg.content.array_records["arrays"]).items()}
    return Message(RecordDict({"arrays": to_record(model), "metrics": MetricRecord(_metrics(pid))}), reply_to=msg)


def _evaluate(msg: Message, context) -> Message:
    pid = context.node_config["partition-id"]
    metrics = {"num-examples": 5 * (pid + 1), "eval_acc": 0.5, "eval_loss": 1.0, "my-eval": float(pid)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_flowers_parameters_are_taken_or_refused_naming_the_one_to_use(cls) -> None:
    strategy = cls(min_available_nodes=2, weighted_by_key="num-examples", arrayrecord_key="arrays",
                   configrecord_key="config", train_metrics_aggr_fn=aggregate_metricrecords,
                   evaluate_metrics_aggr_fn=None)
    assert strategy.min_available_nodes == 2
    assert (strategy.arrayrecord_key, strategy.configrecord_key) == ("arrays", "config")
    assert strategy.train_metrics_aggr_fn is aggregate_metricrecords and strategy.evaluate_metrics_aggr_fn is None
    name = cls.__name__
    with pytest.raises(TypeError, match=rf"^{name}: parameter 'min_train_nodes' is Flower's .* use "
                                        r"fraction_train and min_nodes"):
        cls(min_train_nodes=2)
    with pytest.raises(TypeError, match=rf"^{name}: parameter 'min_evaluate_nodes' .* use fraction_evaluate"):
        cls(min_evaluate_nodes=2)
    with pytest.raises(ConfigError, match=rf"^{name}: parameter arrayrecord_key = 'model' is invalid"):
        cls(arrayrecord_key="model")
    with pytest.raises(ConfigError, match=rf"^{name}: parameter train_metrics_aggr_fn = 3 is invalid"):
        cls(train_metrics_aggr_fn=3)
    with pytest.raises(TypeError, match=rf"^{name}: unknown parameter 'min_nodez'; did you mean 'min_nodes'"):
        cls(min_nodez=2)
    assert "min_train_nodes: refused" in cls.__doc__ and "train_metrics_aggr_fn (default: None)" in cls.__doc__


def test_an_unknown_keyword_names_the_class_and_lists_its_parameters() -> None:
    with pytest.raises(TypeError, match=r"FedProx: unknown parameter 'proximal_mue'; did you mean 'proximal_mu'"):
        FedProx(proximal_mue=0.1)
    with pytest.raises(TypeError, match=r"FedAvg: unknown parameter 'zzz'; FedAvg's parameters: fraction_train, "):
        FedAvg(zzz=1)


def test_reply_metrics_fedsynth_does_not_read_are_averaged_into_result_as_flowers_fedavg_does() -> None:
    ours = FedAvg(fraction_evaluate=0.0).start(ClientAppGrid(2, _train), to_record(MODEL), num_rounds=1, timeout=10)
    flowers = FlowerFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2).start(
        ClientAppGrid(2, _train), to_record(MODEL), num_rounds=1, timeout=10)
    mine, theirs = ours.train_metrics_clientapp[1], flowers.train_metrics_clientapp[1]
    assert mine["my-score"] == pytest.approx(20 / 30) and mine["my-count"] == pytest.approx((3 * 10 + 4 * 20) / 30)
    for key in ("my-score", "my-count", "train-loss"):
        assert mine[key] == pytest.approx(theirs[key]), key
    assert from_record(ours.arrays)["w"].tolist() == from_record(flowers.arrays)["w"].tolist()


def test_a_metric_a_node_names_never_overwrites_a_field_of_the_rounds_record() -> None:
    """fedsynth's round log (and so metrics.jsonl) keeps a node-named mean under "reply-": a node that reports
    "answered", "central-accuracy" or "clipped-updates" changes none of the round's own fields."""
    def forging(msg: Message, context) -> Message:
        reply = _train(msg, context)
        reply.content.metric_records["metrics"].update({"answered": 99.0, "central-accuracy": 1.0,
                                                         "clipped-updates": 7.0})
        return reply

    strategy = FedAvg(fraction_evaluate=0.0,
                      aggregation=strategies.Bounded("weighted", strategies.BoundedInfluence(weight_share=0.9)))
    result = strategy.start(ClientAppGrid(2, forging), to_record(MODEL), num_rounds=1, timeout=10)
    record = strategy.round_log.latest.as_record()
    assert record["answered"] == 2 and record["clipped-updates"] == 0 and "central-accuracy" not in record
    assert record["reply-central-accuracy"] == 1.0 and record["reply-my-score"] == pytest.approx(20 / 30)
    assert "my-score" not in record
    metrics = result.train_metrics_clientapp[1]
    assert metrics["my-score"] == pytest.approx(20 / 30) and metrics["clipped-updates"] == 0  # the strategy's wins


def test_the_metric_aggregation_functions_add_their_record_to_the_rounds_metrics() -> None:
    def highest(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
        scores = [record.metric_records["metrics"]["my-score"] for record in records]
        return MetricRecord({"my-score-max": max(scores), "weighted-by": len(weighted_by_key)})

    def evaluated(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
        return MetricRecord({"my-eval-sum": sum(r.metric_records["metrics"]["my-eval"] for r in records)})

    strategy = FedAvg(fraction_evaluate=1.0, train_metrics_aggr_fn=highest, evaluate_metrics_aggr_fn=evaluated)
    result = strategy.start(ClientAppGrid(2, _train, _evaluate), to_record(MODEL), num_rounds=1, timeout=10)
    train = result.train_metrics_clientapp[1]
    assert train["my-score-max"] == 1.0 and train["weighted-by"] == len("num-examples")
    assert train["my-score"] == pytest.approx(20 / 30)  # fedsynth's means stay beside the function's record
    evaluate = result.evaluate_metrics_clientapp[1]
    assert evaluate["my-eval-sum"] == 1.0 and evaluate["num-nodes"] == 2


def test_an_aggregation_function_that_returns_no_metric_record_is_named() -> None:
    strategy = FedAvg(fraction_evaluate=0.0, train_metrics_aggr_fn=lambda records, key: {"not": "a record"})
    with pytest.raises(TypeError, match=r"'<lambda>' \(train_metrics_aggr_fn or evaluate_metrics_aggr_fn\) returned a "
                                        r"dict, not a flwr.app.MetricRecord"):
        strategy.start(ClientAppGrid(1, _train), to_record(MODEL), num_rounds=1, timeout=10)


def test_a_reply_with_too_many_metrics_is_dropped_naming_the_count() -> None:
    def flooding(msg: Message, context) -> Message:
        reply = _train(msg, context)
        reply.content.metric_records["metrics"].update({f"m{i}": 1.0 for i in range(300)})
        return reply

    strategy = FedAvg(fraction_evaluate=0.0)
    grid = ClientAppGrid(1, flooding)
    with pytest.raises(ReplyContractError):  # every reply of the first round broke the contract
        strategy.start(grid, to_record(MODEL), num_rounds=1, timeout=10)
    assert "metrics, more than 256" in strategy.round_log.latest.failures[0].reason


# the classes a strategy's parameters are built from live in these packages (the rest are Flower's or Python's)
OWN_PACKAGES = ("common", "server_app", "client_app", "fedsynth")


def _own_types(hint: object) -> set[type]:
    """The classes of fedsynth's packages an annotation names, through unions, optionals and containers."""
    found = {hint} if isinstance(hint, type) and hint.__module__.split(".")[0] in OWN_PACKAGES else set()
    return found.union(*(_own_types(arg) for arg in typing.get_args(hint)))


def constructor_hints(cls: type) -> list[Any]:
    """The annotations of `cls`'s keyword parameters: its lineage's settings groups' fields (a constructor made
    from a group, `with_settings`, carries no annotations of its own), then the first written constructor's."""
    hints: list[Any] = []
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        group = getattr(init, "settings_group", None)
        if group is not None:
            hints += list(typing.get_type_hints(group).values()) if dataclasses.is_dataclass(group) else []
        elif init is not None:
            return hints + [hint for name, hint in typing.get_type_hints(init).items() if name != "return"]
    return hints


def grouped_types() -> dict[str, type]:
    """Every class of fedsynth's packages that a public strategy's constructor takes a value of, and those the
    grouped values hold (AppWiring's NodeInfo), by name."""
    classes = [getattr(strategies, name) for name in strategies.__all__
               if isinstance(getattr(strategies, name), type) and hasattr(getattr(strategies, name), "start")]
    found = {own for cls in classes for hint in constructor_hints(cls) for own in _own_types(hint)}
    found |= {own for value in list(found) if dataclasses.is_dataclass(value)
              for hint in typing.get_type_hints(value).values() for own in _own_types(hint)}
    return {cls.__name__: cls for cls in found}


def test_every_grouped_value_a_strategy_takes_is_exported_by_fedsynth_strategies() -> None:
    grouped = grouped_types()
    assert {"AppWiring", "Bounded", "BoundedInfluence", "CodecSettings", "CogSettings", "Gossip", "Krum", "NodeInfo", "ServerTask",
            "TrimmedMean"} <= set(grouped)  # the groups of the codec, the aggregation, the bounds, FedCOG, ...
    for name, cls in grouped.items():
        assert getattr(strategies, name, None) is cls, f"fedsynth.strategies does not export {name}"
        assert name in strategies.__all__, name


def test_every_grouped_value_imports_from_fedsynth_strategies_without_torch() -> None:
    classes = {name for name in strategies.__all__ if hasattr(getattr(strategies, name), "start")}
    names = sorted(set(strategies.__all__) - classes)  # every exported value but the strategy classes
    assert set(grouped_types()) | {"BOUNDED_INFLUENCE", "LocalRecipe"} <= set(names)
    code = (f"import sys\nfrom fedsynth.strategies import {', '.join(names)}\n"
            "assert 'torch' not in sys.modules, 'torch loaded'\n"
            "print(CogSettings(gen_budget=8).cog_config()['gen-budget'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "8"
