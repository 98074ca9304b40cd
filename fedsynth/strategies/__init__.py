"""fedsynth's strategies as Flower strategies, for a Flower developer's own ServerApp.

Each class is a Flower `Strategy` built from its own typed keyword parameters (no `**kwargs`), each listed
with its default in the class docstring, as Flower's `FedAvg` does (`help(FedSynSAM)` shows them), and run
with Flower's own `start()`, which returns Flower's `Result`:

    from fedsynth.strategies import QSGD, DistillationSettings, FedSynSAM, ServerTask, round_lr_entry
    strategy = FedSynSAM(fraction_train=1.0, codec=QSGD(bits=4), distillation=DistillationSettings(
        task=ServerTask(model="cnn", dataset="fashion-mnist"), trajectory_rounds=30, synthetic_ipc=20))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=100,
                            train_config=ConfigRecord(round_lr_entry(0.05)), evaluate_fn=central_evaluate)

There is one class per algorithm, and it is the class `fedsynth run` builds: fedsynth's app builds the class
of the run's algorithm (common/algorithm_table.py's `strategy`, the class's import path, from which this module
exports it under its class name) from its run config
(server_app/registry.py `build_strategy`), reading each parameter under the run-config key of the same name.
A parameter's meaning is its run-config key's (docs/configuration.md; `help()` shows it with the class's own
default), and each default is the run config's, so a class and `fedsynth run` share one set of defaults.

Options every centralized class shares are one value each, not a key each:
- `codec`: the uplink codec, None (no compression), `QSGD(bits=4, qsgd_scope="bucket", qsgd_bucket=512)` or
  `TopK(topk_ratio=0.1)` (each with `error_feedback`), a `CodecSettings` whose fields are the run-config keys of
  the same names, which the nodes read back;
- `aggregation`: the mean and its bounds. A plain mean runs the paper's rule: "weighted" (the papers'
  sample-weighted mean), "uniform", "median", `TrimmedMean(fraction)` or `Krum(byzantine_nodes)`. A mean under
  bounded influence is `Bounded(mean, influence)`: `BoundedInfluence(update_norm_ratio=1.5, weight_share=0.4,
  update_norm=0.0, action="clip")` bounds each update's norm and caps any node's weight share, and
  `Bounded("weighted")` (influence `BOUNDED_INFLUENCE`, those defaults) is what the run config's
  `bounded-influence = true` sets; each round's train metrics then carry "clipped-updates" and "weight-cap-bound"
  (the decentralized relay, which has no mean, takes its `bounded_influence` alone);
- the trainings a server runs itself, one value each, whose fields are the run-config keys of the same names:
  FedSynSAM's and DynaFed's `distillation` (`DistillationSettings(task=ServerTask(model=..., dataset=...),
  trajectory_rounds=..., ...)`, the `task` being the model the server builds), DynaFed's `server_training`
  (`DynaFedTraining`), FedDDPM's `diffusion` (`DiffusionTraining`: its task, warm-up and auxiliary set) and
  `correction` (`CorrectionSettings`), FedDDPMPlus's `diffusion` and `quicktest` (`QuickTestSettings`);
- `cog_settings` (FedCOG): `CogSettings(gen_budget=..., ...)`, FedCOG's generation and distillation settings;
- `gossip` (the decentralized relay): `Gossip(topology="ring", peers=..., mixing=..., relay_mixing=...)`, the graph
  and mixing of each round;
- `wiring`: `AppWiring(nodes=..., parameter_names=..., lr_schedule=..., node_settings=...)`, what the app around
  the strategy wires in (a handshake's node table, the model's trainable names, each round's lr, your own settings
  for the nodes); fedsynth's app builds it from its run, and a Flower app passes what it has.
`LocalRecipe` is the local training recipe fedsynth's ClientApp reads from each train message (the run config's
local training group: the step count, batch, momentum, ...): pass `LocalRecipe(...).recipe_config()` in
`start()`'s `train_config` beside the round's learning rate, `round_lr_entry(rate)` (its key is `ROUND_LR_KEY`).
Flower's own FedAvg parameters are taken with Flower's meaning (`arrayrecord_key`, `configrecord_key`,
`min_available_nodes`, `weighted_by_key`, `train_metrics_aggr_fn`, `evaluate_metrics_aggr_fn`: its record is added
to each round's metrics; every numeric reply metric fedsynth does not read itself is averaged into them, as Flower
averages it), or refused naming the parameter to use (`min_train_nodes`, `min_evaluate_nodes`); an unknown keyword
is refused naming the class and the nearest parameter.
A value is checked when it is built, with the run config's message: `QSGD(bits=1)` fails as `bits = 1` does.

A class takes only what its server uses or sends: the round's sampling and checks, the aggregation, and the
settings its nodes' rule reads from the train message's config (the codec, FedSAM's `sam_rho`, FedProx's
`proximal_mu`, ...; `wiring`'s `node_settings` adds your own). The classes' families: FedAvg's server (FedAvg, FedProx,
MOON, FedSAM, FedCOG), server state (FedAvgM, Scaffold, FedGamma, MoFedSAM, the FedLESAM family, FedSMOO),
a server that trains a model (FedSynSAM, DynaFed, FedDDPM, FedDDPMPlus) and the decentralized relay (DPSGD,
DFedAvg, DFedAvgM, DFedSAM, OledFL).

What a node must reply to a train message (content "arrays" = the global model, "config" with "server-round",
the round's learning rate and every setting the node's rule needs under its run-config name, its settings group's and
the codec's: read them with `fedsynth.client.rule_settings` and `fedsynth.client.message_codec`):
{"arrays": the local model, "metrics": {"num-examples": int > 0, "train-loss" or Flower's "train_loss": float}};
optionally "partition-id", and "num-test-examples", "local-test-accuracy", "local-test-loss" for the received
model. An evaluate reply carries "num-examples" and "local-test-accuracy"/"local-test-loss" or Flower's
"eval_acc"/"eval_loss". Replies that errored, came late, or fail a check (a missing or mis-shaped array, a
non-finite value, a bad metric) are dropped in `aggregate_train` and listed in
`strategy.round_log.latest.failures` (node, partition, reason); a first round in which every reply broke the contract raises
`ReplyContractError` saying what to change. The exceptions a run can end with are importable from here:
`TooManyFailedRounds` (max_failed_rounds short rounds in a row), `ReplyContractError`, `WarmupFailed` (FedDDPM's
warm-up returned fewer than min_nodes warm models) and `NoFeatureSums` (no node sent usable feature sums for
FID's reference). docs/library.md lists, per strategy, its algorithms, the settings its
nodes read from the message and what the reply must carry (generated from the algorithm table), and per
`fedsynth.client` function what it needs from the server.
"""

from __future__ import annotations

from typing import Any

from common.algorithms.plugins import import_attribute
from common.algorithm_table import ALGORITHMS
from common.algorithms.codec_settings import CodecSettings
from common.algorithms.cog_settings import CogSettings
from common.algorithms.local_training_settings import ROUND_LR_KEY, LocalRecipe, round_lr_entry
from common.algorithms.rule_settings import (
    DFedAvgMSettings, FedDynSAMSettings, FedProxSettings, MOONSettings, MoFedSAMSettings, OledFLSettings, SAMSettings,
)
from common.algorithms.synsam_settings import SynSAMRuleSettings
from common.run.aggregation import BOUNDED_INFLUENCE, Bounded, BoundedInfluence, Krum, TrimmedMean
from common.run.codecs import QSGD, TopK
from common.run.gossip import Gossip
from common.run.task import ServerTask
from server_app.fid_reference import NoFeatureSums
from server_app.strategies.base import ReplyContractError, TooManyFailedRounds
from server_app.strategies.fedddpm import WarmupFailed
from server_app.strategies.flower_wrappers import WrapperRefused
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.server_training import (
    CorrectionSettings, DiffusionTraining, DistillationSettings, DynaFedTraining, QuickTestSettings,
)
from server_app.strategies.wiring import AppWiring

# every algorithm's strategy class, by class name -> its import path (common/algorithm_table.py's rows): a new
# built-in class is exported by its row alone, imported on first use
_STRATEGY_PATHS: dict[str, str] = {algorithm.strategy_name: algorithm.strategy for algorithm in ALGORITHMS.values()}


def __getattr__(name: str) -> Any:
    """A strategy class, imported from its row's path the first time it is asked for."""
    if name not in _STRATEGY_PATHS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = import_attribute(_STRATEGY_PATHS[name], f"the strategy class {name}")
    globals()[name] = cls
    return cls


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_STRATEGY_PATHS))


__all__ = sorted([
    "AppWiring", "BOUNDED_INFLUENCE", "Bounded", "BoundedInfluence", "CodecSettings", "CogSettings", "Gossip", "Krum", "LocalRecipe", "NodeInfo", "NoFeatureSums", "QSGD",
    "ReplyContractError", "ServerTask", "TooManyFailedRounds", "TopK", "TrimmedMean", "WarmupFailed", "WrapperRefused",
    # a train message's entry of the round's learning rate (common/algorithms/local_training_settings.py)
    "ROUND_LR_KEY", "round_lr_entry",
    # the node rules' settings groups (common/algorithms/rule_settings.py): what each class's `settings` declares
    "DFedAvgMSettings", "FedDynSAMSettings", "FedProxSettings", "MOONSettings", "MoFedSAMSettings", "OledFLSettings",
    "SAMSettings", "SynSAMRuleSettings",
    # the settings of the trainings the server runs itself, one grouped parameter each
    # (server_app/strategies/server_training.py)
    "CorrectionSettings", "DiffusionTraining", "DistillationSettings", "DynaFedTraining", "QuickTestSettings",
    *_STRATEGY_PATHS,
])
