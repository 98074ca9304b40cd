"""Each public strategy stays near the size of Flower's own FedAvg (issue 52).

For every class `fedsynth.strategies` exports this lists its constructor parameters, its public methods (own and
inherited, names without a leading underscore) and its depth below Flower's `Strategy`, and fails past the
targets below. Flower 1.42's `flwr.serverapp.strategy.FedAvg` has 10 parameters, 6 public methods (`start`,
`configure_train`, `aggregate_train`, `configure_evaluate`, `aggregate_evaluate`, `summary`), depth 1, and
`help()` of 120 lines; the test measures Flower's numbers too, so a Flower upgrade that changes them shows here.

The targets, beside Flower's FedAvg:
- parameters: FedAvg at most 15 (Flower: 10): the codec, bounded influence and the robust means are one value
  each; a class whose nodes read their own settings adds those (FedSAM's `sam_rho`, ...), at most 18; the
  classes whose server trains a model itself take that training's settings too (FedSynSAM and DynaFed 30,
  FedDDPM 27, FedDDPM+ 35: the distillation's and the diffusion task's keys);
- public methods: Flower's 6, `state_dict` / `load_state_dict` (a resumable run) and the three documented hooks an
  app around `start()` calls (`run_summary`, `check_restored`, `evaluate_on_every_node`), 11 (FedDDPM's also
  `warmup`, for a developer's own round loop: 12);
- depth below `Strategy`: at most 4 (FedAvg 2: FedAvg -> RoundStrategy -> Strategy; Flower: 1);
- `help(FedAvg)`: at most 1.5x Flower's lines.
"""

from __future__ import annotations

import inspect
import pydoc

import pytest
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Strategy

import fedsynth.strategies as public

FLOWER = {"parameters": 10, "public methods": 6, "depth": 1, "help lines": 120}  # Flower 1.42's FedAvg
SERVER_TRAINS_A_MODEL = {"FedSynSAM": 30, "DynaFed": 30, "FedDDPM": 27, "FedDDPMPlus": 35}
MAX_PARAMETERS = {"FedAvg": 15, **SERVER_TRAINS_A_MODEL}
MAX_PARAMETERS_OTHERWISE = 18
MAX_PUBLIC_METHODS = {"FedDDPM": 12, "FedDDPMPlus": 12}
MAX_PUBLIC_METHODS_OTHERWISE = 11
MAX_DEPTH = 4
MAX_HELP_RATIO = 1.5

CLASSES = [getattr(public, name) for name in public.__all__
           if isinstance(getattr(public, name), type) and issubclass(getattr(public, name), Strategy)]


def public_methods(cls: type) -> list[str]:
    """The methods (and properties) a user sees: own and inherited, no leading underscore."""
    return sorted(name for name, value in inspect.getmembers(cls)
                  if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))


def size(cls: type) -> dict[str, int]:
    return {"parameters": len(inspect.signature(cls).parameters), "public methods": len(public_methods(cls)),
            "depth": cls.__mro__.index(Strategy)}


def help_lines(cls: type) -> int:
    return len(pydoc.render_doc(cls, renderer=pydoc.plaintext).splitlines())


def listing() -> str:
    rows = [f"{'class':14s} {'parameters':>10s} {'public methods':>14s} {'depth':>5s}",
            f"{'flwr FedAvg':14s} {FLOWER['parameters']:10d} {FLOWER['public methods']:14d} {FLOWER['depth']:5d}"]
    for cls in CLASSES:
        measured = size(cls)
        rows.append(f"{cls.__name__:14s} {measured['parameters']:10d} {measured['public methods']:14d} "
                    f"{measured['depth']:5d}")
    return "\n".join(rows)


def test_flowers_fedavg_is_the_size_the_targets_are_set_against():
    assert size(FlowerFedAvg) == {k: FLOWER[k] for k in ("parameters", "public methods", "depth")}
    assert public_methods(FlowerFedAvg) == ["aggregate_evaluate", "aggregate_train", "configure_evaluate",
                                            "configure_train", "start", "summary"]
    assert abs(help_lines(FlowerFedAvg) - FLOWER["help lines"]) <= 10


def test_the_listing_covers_one_class_per_algorithm():
    from common.algorithm_table import ALGORITHMS

    assert {cls.__name__ for cls in CLASSES} == {algorithm.strategy_name for algorithm in ALGORITHMS.values()}
    print("\n" + listing())


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_strategy_is_within_its_targets(cls):
    measured = size(cls)
    name = cls.__name__
    assert measured["parameters"] <= MAX_PARAMETERS.get(name, MAX_PARAMETERS_OTHERWISE), listing()
    assert measured["public methods"] <= MAX_PUBLIC_METHODS.get(name, MAX_PUBLIC_METHODS_OTHERWISE), (
        public_methods(cls))
    assert measured["depth"] <= MAX_DEPTH, [c.__name__ for c in cls.__mro__]
    # Flower's five Strategy methods, and the resumable state, are public on every class
    assert {"start", "configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate",
            "state_dict", "load_state_dict"} <= set(public_methods(cls))


def test_help_of_fedavg_is_at_most_one_and_a_half_flowers():
    ours, flowers = help_lines(public.FedAvg), help_lines(FlowerFedAvg)
    assert ours <= MAX_HELP_RATIO * flowers, (ours, flowers)


def test_fedavgs_parameters_are_flowers_size_with_the_grouped_options():
    parameters = list(inspect.signature(public.FedAvg).parameters)
    assert len(parameters) <= MAX_PARAMETERS["FedAvg"]
    assert {"codec", "bounded_influence", "aggregation"} <= set(parameters)
    assert not set(parameters) & {"compression", "bits", "levels", "qsgd_scope", "qsgd_bucket", "topk_ratio",
                                  "error_feedback", "max_weight_share", "max_update_norm", "max_update_norm_ratio",
                                  "update_norm_action", "trim_fraction", "byzantine_nodes"}
