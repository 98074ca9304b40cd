"""fedsynth's server strategies as Flower strategies, for a Flower developer's own ServerApp.

Each class is a Flower `Strategy` built from its own typed keyword parameters (no `**kwargs`), each listed
with its default in the class docstring, as Flower's `FedAvg` does (`help(FedSynSAM)` shows them), and run
with Flower's own `start()`, which returns Flower's `Result`:

    from fedsynth.strategies import FedSynSAM
    strategy = FedSynSAM(fraction_train=1.0, trajectory_rounds=30, synthetic_ipc=20, compression="qsgd", bits=4)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=100,
                            train_config=ConfigRecord({"lr": 0.05}), evaluate_fn=central_evaluate)

Every class runs its paper's aggregation by default (FedAvg: the plain sample-weighted mean). Bounded influence,
for sites that do not trust each other, is one option: `FedAvg(**BOUNDED_INFLUENCE)` bounds each update to 1.5x
the round's lower-median update norm and caps any node's weight share at 0.4 (the run config's
`bounded-influence = true`); each round's train metrics then carry "clipped-updates" and "weight-cap-bound".

A class takes only what its server uses or sends: the round's sampling and checks, the aggregation, the
settings its nodes' rule reads from the train message's config (the uplink codec, SAM's rho, ...; see
common/run/client_settings.py; `node_settings` adds your own), and, where the server itself builds the model
(FedSynSAM's and DynaFed's distillation, FedDDPM's sampling), the model and the data's shape. Each default is
the run config's (server_app/strategies/parameters.py), so the public classes and `fedsynth run` share one
set of defaults.

Which algorithm each class runs, and which settings it sends its nodes, is common/algorithm_table.py's table
(`Algorithm.public_class`, `Algorithm.client_keys`), shared with fedsynth's registry and client rules.

Each class is fedsynth's own server strategy (server_app/strategies/) under its public name, or a subclass
that adds the settings only its nodes read (FedSAM's `sam_rho`, ...). There is no run config inside: fedsynth's
ServerApp builds the same classes from its run config (server_app/registry.py `build_strategy`), reading each
parameter under the run-config key of the same name. A parameter's meaning is its run-config key's
(docs/configuration.md; server_app/strategies/parameters.py writes it into each class docstring with the class's
own defaults). The classes are grouped by family: `centralized`, `server_models` (the strategies whose server
trains a model itself) and `decentralized`.

What a node must reply to a train message (content "arrays" = the global model, "config" with "server-round",
"lr" and every setting the node's rule needs under its run-config name, e.g. "sam-rho", "compression", "bits",
"ole-beta": read them with `fedsynth.client.config_value` and `fedsynth.client.compression_from_config`):
{"arrays": the local model, "metrics": {"num-examples": int > 0, "train-loss" or Flower's "train_loss": float}};
optionally "partition-id", and "num-test-examples", "local-test-accuracy", "local-test-loss" for the received
model. An evaluate reply carries "num-examples" and "local-test-accuracy"/"local-test-loss" or Flower's
"eval_acc"/"eval_loss". Replies that errored, came late, or fail a check (a missing or mis-shaped array, a
non-finite value, a bad metric) are dropped in `aggregate_train` and listed in
`strategy.round_report["failures"]`; a first round in which every reply broke the contract raises
`ReplyContractError` saying what to change. The exceptions a run can end with are importable from here:
`TooManyFailedRounds` (max_failed_rounds short rounds in a row), `ReplyContractError`, `WarmupFailed` (FedDDPM's
warm-up returned fewer than min_nodes warm models) and `NoFeatureSums` (no node sent usable feature sums for
FID's reference). docs/library.md lists, per strategy, the client function in
`fedsynth.client`, what the message carries and what the reply must carry.
"""

from __future__ import annotations

from fedsynth.strategies.centralized import (
    FedAvg, FedAvgM, FedCOG, FedLESAM, FedLESAMD, FedSAM, FedSMOO, MoFedSAM, Scaffold,
)
from fedsynth.strategies.decentralized import DFedAvg, OledFL
from fedsynth.strategies.server_models import DynaFed, FedDDPM, FedDDPMPlus, FedSynSAM
from common.algorithms.aggregation_settings import BOUNDED_UPDATE_NORM_RATIO, BOUNDED_WEIGHT_SHARE
from server_app.fid_reference import NoFeatureSums
from server_app.strategies.base import ReplyContractError, TooManyFailedRounds
from server_app.strategies.fedddpm import WarmupFailed
from server_app.strategies.flower_wrappers import WrapperRefused
from server_app.strategies.node_table import NodeInfo

# Bounded influence as a class's keyword arguments: what `bounded-influence = true` sets in the run config.
BOUNDED_INFLUENCE: dict[str, float] = {
    "max_update_norm_ratio": BOUNDED_UPDATE_NORM_RATIO, "max_weight_share": BOUNDED_WEIGHT_SHARE,
}

__all__ = [
    "BOUNDED_INFLUENCE", "DFedAvg", "DynaFed", "FedAvg", "FedAvgM", "FedCOG", "FedDDPM", "FedDDPMPlus", "FedLESAM",
    "FedLESAMD", "FedSAM", "FedSMOO", "FedSynSAM", "MoFedSAM", "NodeInfo", "NoFeatureSums", "OledFL",
    "ReplyContractError", "Scaffold", "TooManyFailedRounds", "WarmupFailed", "WrapperRefused",
]
