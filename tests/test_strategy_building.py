"""Strategies are built from their own typed parameters; fedsynth's app builds them from its run config.

No strategy holds a run config: the app reads each parameter of a strategy class from the run-config key of
the same name (server_app/registry.py `build_strategy`), and a public class built by hand sends its nodes the
same settings as the app's strategy for the same values.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import fedsynth.strategies as public
from common.algorithm_table import ALGORITHMS
from common.run.config import RunConfig, parse_run_config
from server_app.registry import SERVER_RULES, build_strategy, strategy_arguments
from server_app.strategies.node_table import NodeInfo

NODES = [NodeInfo(node_id=10 + i, partition_id=i, num_train_examples=20, num_test_examples=5) for i in range(4)]
# keys build_strategy fills from the run rather than from a run-config key of the same name
FROM_THE_RUN = {"fraction_evaluate", "nodes", "lr_schedule", "node_settings", "parameter_names", "task",
                "weighted_by_key", "min_available_nodes"}


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


@pytest.mark.parametrize("rule", sorted(SERVER_RULES))
def test_every_parameter_of_a_server_strategy_is_a_run_config_key_or_comes_from_the_run(rule: str) -> None:
    """A parameter the app could not fill would silently keep its default in every `fedsynth run`."""
    keys = {f.name for f in dataclasses.fields(RunConfig)}
    for name in inspect.signature(SERVER_RULES[rule]).parameters:
        assert name in keys or name in FROM_THE_RUN, (rule, name)


def test_build_strategy_takes_each_parameter_from_the_key_of_its_name() -> None:
    cfg = config_of("fedsmoo", **{"server-lr": 0.5, "fraction-train": 0.5, "compression": "qsgd", "bits": 8,
                                  "sam-rho": 0.2, "dyn-alpha": 0.3, "max-record-norm": 7.0, "seed": 3})
    arguments = strategy_arguments(SERVER_RULES["fedsmoo"], cfg, NODES)
    assert arguments["server_lr"] == 0.5 and arguments["fraction_train"] == 0.5 and arguments["seed"] == 3
    assert arguments["fraction_evaluate"] == 0.0 and arguments["nodes"] is NODES
    assert arguments["lr_schedule"](3) == cfg.lr * cfg.lr_decay ** 2
    strategy = build_strategy(cfg, NODES)
    assert (strategy.server_lr, strategy.sam_rho, strategy.dyn_alpha, strategy.max_record_norm) == (0.5, 0.2, 0.3, 7.0)
    sent = strategy.client_config()
    assert sent["compression"] == "qsgd" and sent["bits"] == 8 and sent["sam-rho"] == 0.2 and sent["dyn-alpha"] == 0.3


@pytest.mark.parametrize(("name", "algorithm", "values"), [
    ("FedAvg", "fedavg", {}),
    ("FedSAM", "fedsam", {"sam_rho": 0.2, "compression": "topk", "topk_ratio": 0.25}),
    ("FedCOG", "fedcog", {"cog_start_round": 4}),
    ("MoFedSAM", "mofedsam", {"sam_rho": 0.2, "mofedsam_alpha": 0.3}),
    ("FedLESAM", "fedlesam", {"sam_rho": 0.2}),
    ("FedLESAMD", "fedlesam-d", {"sam_rho": 0.2, "dyn_alpha": 0.3}),
    ("FedSMOO", "fedsmoo", {"sam_rho": 0.2, "dyn_alpha": 0.3}),
    ("FedSynSAM", "fedsynsam", {"sam_rho": 0.2, "synsam_beta": 0.5, "compression": "qsgd", "bits": 4}),
    ("Scaffold", "scaffold", {"error_feedback": True, "compression": "qsgd"}),
])
def test_a_public_class_sends_its_nodes_what_the_app_sends(name: str, algorithm: str, values: dict) -> None:
    """The same values, by hand or from the run config: the same train-message settings (one definition)."""
    by_hand = getattr(public, name)(**values)
    from_config = build_strategy(config_of(algorithm, **{k.replace("_", "-"): v for k, v in values.items()}), NODES)
    assert by_hand.client_config() == from_config.client_config()


@pytest.mark.parametrize(("sam", "algorithm"), [(False, "oledfl-sgd"), (True, "oledfl-sam")])
def test_oledfl_sends_the_relays_nodes_what_the_app_sends(sam: bool, algorithm: str) -> None:
    by_hand = public.OledFL(sam=sam, ole_beta=0.8, sam_rho=0.2)
    from_config = build_strategy(config_of(algorithm, **{"ole-beta": 0.8, "sam-rho": 0.2}), NODES)
    assert by_hand.node_settings == from_config.node_settings == (
        {"ole-beta": 0.8, "sam-rho": 0.2} if sam else {"ole-beta": 0.8})
