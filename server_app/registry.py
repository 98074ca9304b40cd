"""Server-side registry: algorithm name -> strategy class, and the one function that builds a run's strategy
from its run config.

The algorithms and the strategy class each uses are common/algorithm_table.py's table; this module is the
server's half of it: each row names its class by import path (`strategy`), resolved in
`strategies/catalog.py`. A user's algorithm, `algorithm = "package.module:Name"`
(common/algorithms/plugins.py), is resolved by `strategy_class` and built by the same `build_strategy`.

A strategy is built from its declared keyword parameters (server_app/strategies/parameters.py
`declared_parameters`: its settings groups' fields, then its base's constructor's), each named after the
run-config key it mirrors, so `build_strategy` reads each from the run config under its own name; the few
that are not run-config keys (the grouped values: the codec, the aggregation with its bounds, the relay's
bounds and gossip, the server's task, and the app's wiring: its node table, lr schedule, model names) say here
where they come from. What
fedsynth's app adds around the algorithm (the nodes' kept models for resume, FID's reference from the nodes'
feature sums, the perturbation diagnostic) is attached here too, so the strategies never see a run config.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import torch
from flwr.app import ConfigRecord, RecordDict

from common.algorithms.plugins import algorithm_of, import_attribute, rule_keys
from common.algorithm_table import ALGORITHMS
from common.errors import ConfigError
from common.records import module_parameter_names
from common.run.aggregation import aggregation_of, bounded_influence_of
from common.algorithms.codec_settings import CodecSettings
from common.run.gossip import gossip_of
from common.algorithms.cog_settings import COG_START_KEY, CogSettings
from common.algorithms.local_training_settings import ROUND_LR_KEY
from common.algorithms.rule_settings import SAMSettings
from common.keys import node_keys
from common.models.diffusion import optimizer_kind
from common.run.config import RunConfig, cog_enabled
from common.run.task import make_model, task_of
from server_app.fid_reference import ClientFeatureReference
from server_app.perturbation import PerturbationDiagnostic
from server_app.strategies.base import RoundStrategy
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.node_models import NodeModels, kept_model_keys
from server_app.strategies.catalog import STRATEGY_CLASSES
from server_app.strategies.parameters import declared_parameters
from server_app.strategies.server_training import (
    CorrectionSettings, DiffusionTraining, DistillationSettings, DynaFedTraining, QuickTestSettings,
)
from server_app.strategies.wiring import AppWiring

# algorithm -> its strategy class (common/algorithm_table.py's `strategy`), in the table's order: the class
# `fedsynth.strategies` exports under the same name
SERVER_STRATEGIES: dict[str, type[RoundStrategy]] = {
    name: STRATEGY_CLASSES[algorithm.strategy_name] for name, algorithm in ALGORITHMS.items()
}


def strategy_class(name: str) -> type[RoundStrategy]:
    """The strategy class of the algorithm `name`: the table's, or a plugin's, which must subclass one of
    fedsynth's (the app needs its node table, reply checks and round log); ConfigError otherwise."""
    if name in SERVER_STRATEGIES:
        return SERVER_STRATEGIES[name]
    path = algorithm_of(name).strategy
    cls = import_attribute(path, f"run config key 'algorithm' = {name!r}: its strategy")
    if not (isinstance(cls, type) and issubclass(cls, RoundStrategy)):
        raise ConfigError(f"run config key 'algorithm' = {name!r}: its strategy {path!r} must subclass one of "
                          f"fedsynth.strategies' classes (e.g. FedAvg) for fedsynth's app to run it")
    return cls


def decayed_lr(lr: float, decay: float, server_round: int) -> float:
    """A round's learning rate, `lr * lr-decay^(round-1)`: the one lr formula. The strategy sends it as each round's
    rate (`lr_schedule`, `round_lr_entry`), and fedsynth's clients train at the rate they receive."""
    return lr * decay ** (server_round - 1)


def cog_node_settings(cfg: RunConfig) -> dict[str, Any] | None:
    """FedCOG's settings on a run with FedCOG plugged in (`fedcog`, `X+cog`, `cog = true`), sent in every train
    message beside the base's (None otherwise): the run config's FedCOG part (`CogSettings.cog_config`), with
    its first round resolved to the first FedCOG round of the run's `num-server-rounds`. FedCOG's own class sends
    them itself (`cog_settings`)."""
    if not cog_enabled(cfg) or "cog_settings" in declared_parameters(SERVER_STRATEGIES[cfg.algorithm]):
        return None
    return {**CogSettings.of(cfg).cog_config(), COG_START_KEY: cfg.first_cog_round(cfg.num_server_rounds)}


def train_config(cfg: RunConfig) -> dict[str, Any]:
    """`start()`'s `train_config` for the run `cfg`: the local training recipe (`recipe_config`: the step count,
    batch, momentum, weight decay, clipping, and the optimizer with `auto` resolved by the task), which every
    train message then carries beside the round's rate, so that the nodes train by the server's recipe and never
    parse their run config for it."""
    return cfg.recipe_config(optimizer_kind(cfg))


def run_parameter_names(cfg: RunConfig) -> list[str]:
    """The trainable arrays of the run's model, in its order (built with the global RNG state kept, so that
    building it changes no run's random numbers)."""
    with torch.random.fork_rng(devices=[]):
        return module_parameter_names(make_model(cfg))


def run_wiring(cfg: RunConfig, nodes: list[NodeInfo] | None) -> AppWiring:
    """The app's wiring of the run `cfg`'s strategy (`AppWiring`): the handshake's node table, the run's lr schedule
    (`decayed_lr`), FedCOG's settings on a run with FedCOG plugged in (`cog_node_settings`; each class sends its
    rule's own settings itself) and, for a centralized algorithm, the trainable arrays of the run's model (the relay
    forwards whole models)."""
    decentralized = algorithm_of(cfg.algorithm).decentralized
    return AppWiring(nodes=nodes, parameter_names=None if decentralized else run_parameter_names(cfg),
                     lr_schedule=partial(decayed_lr, cfg.lr, cfg.lr_decay), node_settings=cog_node_settings(cfg))


def strategy_arguments(cls: type, cfg: RunConfig, nodes: list[NodeInfo] | None) -> dict[str, Any]:
    """The keyword arguments of `cls` for the run `cfg`: each parameter that is a run-config key from `cfg` (a
    field of a plugin's own settings group from its key "<name>.<key>"), and the others from the run (`wiring`: the
    node table, the lr schedule, FedCOG's settings on a run with FedCOG, the model's parameter names; `gossip`, the
    grouped values, the server's model).

    `fraction_evaluate` is 0: fedsynth's clients evaluate the received model inside each train reply, and every
    node evaluates the final model once (server_app/recorder.py). `weighted_by_key` and `min_available_nodes`
    keep their defaults (the handshake waits for the nodes).
    """
    from_run: dict[str, Callable[[], Any]] = {
        "fraction_evaluate": lambda: 0.0,
        "wiring": lambda: run_wiring(cfg, nodes),
        "gossip": lambda: gossip_of(cfg),
        "cog_settings": lambda: CogSettings.of(cfg),  # FedCOG's class sends its own
        "task": lambda: task_of(cfg),
        # the trainings the server runs itself, one grouped value each (server_app/strategies/server_training.py)
        "distillation": lambda: DistillationSettings.of(cfg),
        "server_training": lambda: DynaFedTraining.of(cfg),
        "diffusion": lambda: DiffusionTraining.of(cfg),
        "correction": lambda: CorrectionSettings.of(cfg),
        "quicktest": lambda: QuickTestSettings.of(cfg),
        "aggregation": lambda: aggregation_of(cfg),  # the mean, `Bounded` under the run's bounds
        "bounded_influence": lambda: bounded_influence_of(cfg),  # the relay's bounds (it has no mean)
        "codec": lambda: CodecSettings.of(cfg),
        "sam": lambda: set(node_keys(SAMSettings)) <= set(rule_keys(algorithm_of(cfg.algorithm))),  # OledFL-SAM
    }
    own = cfg.own_settings  # a plugin's own settings group (common/run/own_settings.py): its fields win
    own_fields = {f.name for f in dataclasses.fields(own)} if own is not None else set()
    arguments: dict[str, Any] = {}
    for name in declared_parameters(cls):
        if name in from_run:
            arguments[name] = from_run[name]()
        elif name in own_fields:
            arguments[name] = getattr(own, name)
        elif hasattr(cfg, name):
            arguments[name] = getattr(cfg, name)
    return arguments


def build_strategy(cfg: RunConfig, nodes: list[NodeInfo] | None = None) -> RoundStrategy:
    """The strategy of the run `cfg` over the handshake's node table, with fedsynth's app services attached."""
    cls = strategy_class(cfg.algorithm)
    strategy = cls(**strategy_arguments(cls, cfg, nodes))
    if not algorithm_of(cfg.algorithm).decentralized:
        strategy.node_models = NodeModels(kept_model_keys(cfg))  # MOON's and FedCOG's models, for a resume
        # FID without server data
        strategy.feature_reference = ClientFeatureReference(strategy.node_table.nodes, cfg.round_timeout)
        if cfg.perturbation_diagnostic and hasattr(strategy, "diagnostic"):
            strategy.diagnostic = PerturbationDiagnostic(cfg, len(nodes or []))
    return strategy


def train_config_of(cfg: RunConfig, server_round: int) -> dict[str, Any]:
    """The config of round `server_round`'s train message in the run `cfg`: what the app's strategy sends its
    nodes (the round, its lr, the local training recipe, the codec and the rule's settings), for a test or a
    benchmark that runs a client rule without a server."""
    strategy = build_strategy(cfg)
    strategy.num_rounds = cfg.num_server_rounds  # start()'s, as fedsynth's app passes it
    config: dict[str, Any] = {**strategy.client_config(), **train_config(cfg), "server-round": server_round}
    if strategy.lr_schedule is not None:
        config[ROUND_LR_KEY] = strategy.lr_schedule(server_round)
    return config


def train_records_of(cfg: RunConfig, server_round: int) -> RecordDict:
    """Round `server_round`'s train message content without the model: its `"config"` record
    (`train_config_of`), the `incoming` a `LocalJob` of a benchmark's own loop gets."""
    return RecordDict({"config": ConfigRecord(train_config_of(cfg, server_round))})
