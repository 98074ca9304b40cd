"""Strategies are built from their own typed parameters; fedsynth's app builds them from its run config.

No strategy holds a run config: the app reads each parameter of a strategy class from the run-config key of
the same name (server_app/registry.py `build_strategy`; the grouped values, the codec, bounded influence and the
robust aggregation, from their keys), and a class built by hand sends its nodes the same settings as the app's
strategy built from the same values as run-config keys.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import fedsynth.strategies as public
from common.algorithm_table import ALGORITHMS
from common.run.config import RunConfig, parse_run_config
from server_app.registry import build_strategy, strategy_arguments
from server_app.strategies.catalog import STRATEGY_CLASSES
from server_app.strategies.node_table import NodeInfo

NODES = [NodeInfo(node_id=10 + i, partition_id=i, num_train_examples=20, num_test_examples=5) for i in range(4)]
# keys build_strategy fills from the run rather than from a run-config key of the same name
FROM_THE_RUN = {"fraction_evaluate", "wiring", "gossip", "task",
                "weighted_by_key", "min_available_nodes", "codec", "bounded_influence", "sam", "cog_settings",
                # the trainings the server runs itself, one grouped value each (server_training.py)
                "distillation", "server_training", "diffusion", "correction", "quicktest"}


def config_of(algorithm: str, **keys) -> RunConfig:
    model = {"model": "unet-small"} if algorithm.startswith("fedddpm") else {"model": "mlp"}
    return parse_run_config({"algorithm": algorithm, **model, **keys}, ALGORITHMS)


def holds_a_run_config(obj: object, depth: int = 2) -> bool:
    """Whether `obj`'s attributes (and theirs, `depth` levels down) include a RunConfig."""
    if isinstance(obj, RunConfig):
        return True
    if depth == 0 or not hasattr(obj, "__dict__"):
        return False
    values = list(vars(obj).values())
    values += [v for value in values if isinstance(value, (list, tuple)) for v in value]
    values += [v for value in values if isinstance(value, dict) for v in value.values()]
    return any(holds_a_run_config(value, depth - 1) for value in values)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_no_strategy_of_the_app_holds_a_run_config(algorithm: str) -> None:
    strategy = build_strategy(config_of(algorithm), NODES)
    assert not holds_a_run_config(strategy), algorithm
    assert not hasattr(strategy, "cfg")


def test_no_public_strategy_holds_a_run_config() -> None:
    for name in public.__all__:
        cls = getattr(public, name)
        if isinstance(cls, type) and hasattr(cls, "configure_train"):
            assert not holds_a_run_config(cls()), name


@pytest.mark.parametrize("name", sorted(STRATEGY_CLASSES))
def test_every_parameter_of_a_strategy_is_a_run_config_key_or_comes_from_the_run(name: str) -> None:
    """A parameter the app could not fill would silently keep its default in every `fedsynth run`."""
    keys = {f.name for f in dataclasses.fields(RunConfig)}
    for parameter in inspect.signature(STRATEGY_CLASSES[name]).parameters:
        assert parameter in keys or parameter in FROM_THE_RUN, (name, parameter)


def test_build_strategy_takes_each_parameter_from_the_key_of_its_name() -> None:
    cfg = config_of("fedsmoo", **{"server-lr": 0.5, "fraction-train": 0.5, "compression": "qsgd", "bits": 8,
                                  "sam-rho": 0.2, "dyn-alpha": 0.3, "max-record-norm": 7.0, "seed": 3})
    arguments = strategy_arguments(public.FedSMOO, cfg, NODES)
    assert arguments["server_lr"] == 0.5 and arguments["fraction_train"] == 0.5 and arguments["seed"] == 3
    assert arguments["fraction_evaluate"] == 0.0 and arguments["wiring"].nodes is NODES
    assert arguments["wiring"].lr_schedule(3) == cfg.lr * cfg.lr_decay ** 2
    assert arguments["codec"] == public.QSGD(bits=8) and arguments["aggregation"] == "weighted"  # no bounds
    strategy = build_strategy(cfg, NODES)
    assert (strategy.server_lr, strategy.sam_rho, strategy.dyn_alpha, strategy.max_record_norm) == (0.5, 0.2, 0.3, 7.0)
    sent = strategy.client_config()
    assert sent["compression"] == "qsgd" and sent["bits"] == 8 and sent["sam-rho"] == 0.2 and sent["dyn-alpha"] == 0.3


@pytest.mark.parametrize(("name", "algorithm", "values", "keys"), [
    ("FedAvg", "fedavg", {}, {}),
    ("FedSAM", "fedsam", {"sam_rho": 0.2, "codec": public.TopK(topk_ratio=0.25)},
     {"sam-rho": 0.2, "compression": "topk", "topk-ratio": 0.25}),
    ("FedProx", "fedprox", {"proximal_mu": 0.3}, {"proximal-mu": 0.3}),
    ("MOON", "moon", {"moon_mu": 2.0, "moon_tau": 0.7}, {"moon-mu": 2.0, "moon-tau": 0.7}),
    ("FedCOG", "fedcog", {"cog_start_round": 4}, {"cog-start-round": 4}),
    ("MoFedSAM", "mofedsam", {"sam_rho": 0.2, "mofedsam_alpha": 0.3}, {"sam-rho": 0.2, "mofedsam-alpha": 0.3}),
    ("FedLESAM", "fedlesam", {"sam_rho": 0.2}, {"sam-rho": 0.2}),
    ("FedLESAMD", "fedlesam-d", {"sam_rho": 0.2, "dyn_alpha": 0.3}, {"sam-rho": 0.2, "dyn-alpha": 0.3}),
    ("FedSMOO", "fedsmoo", {"sam_rho": 0.2, "dyn_alpha": 0.3}, {"sam-rho": 0.2, "dyn-alpha": 0.3}),
    ("FedSynSAM", "fedsynsam", {"sam_rho": 0.2, "synsam_beta": 0.5, "codec": public.QSGD(bits=4)},
     {"sam-rho": 0.2, "synsam-beta": 0.5, "compression": "qsgd", "bits": 4}),
    ("Scaffold", "scaffold", {"codec": public.QSGD(error_feedback=True, qsgd_scope="bucket", qsgd_bucket=64)},
     {"error-feedback": True, "compression": "qsgd", "qsgd-scope": "bucket", "qsgd-bucket": 64}),
    ("DFedSAM", "dfedsam", {"sam_rho": 0.2}, {"sam-rho": 0.2}),
])
def test_a_class_built_by_hand_sends_its_nodes_what_the_app_sends(name: str, algorithm: str, values: dict,
                                                                   keys: dict) -> None:
    """The same values, as parameters or as run-config keys: the same train-message settings."""
    by_hand = getattr(public, name)(**values)
    from_config = build_strategy(config_of(algorithm, **keys), NODES)
    assert type(from_config) is type(by_hand)
    assert by_hand.client_config() == from_config.client_config()


@pytest.mark.parametrize(("keys", "aggregation", "spelled_out"), [
    ({}, "weighted", ("weighted", 0.2, 1, 1.0, 0.0, 0.0, "clip")),
    ({"bounded-influence": True}, public.Bounded("weighted"), ("weighted", 0.2, 1, 0.4, 0.0, 1.5, "clip")),
    ({"max-weight-share": 0.5, "aggregation": "uniform"},
     public.Bounded("uniform", public.BoundedInfluence(update_norm_ratio=0.0, weight_share=0.5)),
     ("uniform", 0.2, 1, 0.5, 0.0, 0.0, "clip")),
    ({"max-update-norm": 3.0, "update-norm-action": "refuse", "aggregation": "trimmed-mean", "trim-fraction": 0.1},
     public.Bounded(public.TrimmedMean(0.1), public.BoundedInfluence(update_norm_ratio=0.0, weight_share=1.0,
                                                                     update_norm=3.0, action="refuse")),
     ("trimmed-mean", 0.1, 1, 1.0, 3.0, 0.0, "refuse")),
    ({"aggregation": "krum", "byzantine-nodes": 2}, public.Krum(2), ("krum", 0.2, 2, 1.0, 0.0, 0.0, "clip")),
])
def test_the_app_groups_the_run_configs_keys_into_the_values(keys: dict, aggregation, spelled_out) -> None:
    """The mean and its bounds are one `aggregation` value; the strategy spells them out as the attributes the
    round machinery reads, the same whether the app or a user built it."""
    arguments = strategy_arguments(public.FedAvg, config_of("fedavg", **keys), NODES)
    assert arguments["aggregation"] == aggregation and "bounded_influence" not in arguments
    by_hand, built = public.FedAvg(aggregation=aggregation), public.FedAvg(**arguments)
    spelled = ("aggregation", "trim_fraction", "byzantine_nodes", "max_weight_share", "max_update_norm",
               "max_update_norm_ratio", "update_norm_action")
    assert tuple(getattr(built, a) for a in spelled) == tuple(getattr(by_hand, a) for a in spelled) == spelled_out


def test_the_relay_takes_the_run_configs_bounds_alone() -> None:
    """The decentralized relay has no mean: it takes the bounds as `bounded_influence` (its weight share caps
    the metric means, its update norm each node's model change)."""
    cfg = config_of("dfedavg", **{"bounded-influence": True})
    arguments = strategy_arguments(public.DFedAvg, cfg, NODES)
    assert arguments["bounded_influence"] == public.BOUNDED_INFLUENCE and "aggregation" not in arguments
    strategy = build_strategy(cfg, NODES)
    assert (strategy.max_weight_share, strategy.max_update_norm, strategy.update_norm_action) == (0.4, 0.0, "clip")


@pytest.mark.parametrize(("sam", "algorithm"), [(False, "oledfl-sgd"), (True, "oledfl-sam")])
def test_oledfl_sends_the_relays_nodes_what_the_app_sends(sam: bool, algorithm: str) -> None:
    by_hand = public.OledFL(sam=sam, ole_beta=0.8, sam_rho=0.2)
    from_config = build_strategy(config_of(algorithm, **{"ole-beta": 0.8, "sam-rho": 0.2}), NODES)
    assert by_hand.client_config() == from_config.client_config() == (
        {"ole-beta": 0.8, "sam-rho": 0.2} if sam else {"ole-beta": 0.8})
