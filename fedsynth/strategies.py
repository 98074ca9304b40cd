"""fedsynth's server strategies as Flower strategies, for a Flower developer's own ServerApp.

Each class is a Flower `Strategy` built from its own typed keyword parameters (no `**kwargs`), each listed
with its default in the class docstring, as Flower's `FedAvg` does (`help(FedSynSAM)` shows them), and run
with Flower's own `start()`, which returns Flower's `Result`:

    from fedsynth.strategies import FedSynSAM
    strategy = FedSynSAM(fraction_train=1.0, trajectory_rounds=30, synthetic_ipc=20, compression="qsgd", bits=4)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=100,
                            train_config=ConfigRecord({"lr": 0.05}), evaluate_fn=central_evaluate)

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
parameter under the run-config key of the same name. The parameters' meanings are defined once
(server_app/strategies/parameters.py `PARAMETER_DOCS`) and written into each class docstring with the class's
own defaults.

What a node must reply to a train message (content "arrays" = the global model, "config" with "server-round",
"lr" and every setting the node's rule needs under its run-config name, e.g. "sam-rho", "compression", "bits",
"ole-beta": read them with `fedsynth.client.config_value` and `fedsynth.client.compression_from_config`):
{"arrays": the local model, "metrics": {"num-examples": int > 0, "train-loss" or Flower's "train_loss": float}};
optionally "partition-id", and "num-test-examples", "local-test-accuracy", "local-test-loss" for the received
model. An evaluate reply carries "num-examples" and "local-test-accuracy"/"local-test-loss" or Flower's
"eval_acc"/"eval_loss". Replies that errored, came late, or fail a check (a missing or mis-shaped array, a
non-finite value, a bad metric) are dropped in `aggregate_train` and listed in
`strategy.round_report["failures"]`; a first round in which every reply broke the contract raises
`ReplyContractError` saying what to change. docs/library.md lists, per strategy, the client function in
`fedsynth.client`, what the message carries and what the reply must carry.
"""

from __future__ import annotations

from typing import Callable

from flwr.common.typing import Scalar

from common.run.task import ServerTask
from server_app.strategies.base import ReplyContractError, TooManyFailedRounds
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.dynafed import DynaFedStrategy
from server_app.strategies.fedavg import FedAvgStrategy
from server_app.strategies.fedavgm import FedAvgMStrategy
from server_app.strategies.fedddpm import FedDDPMStrategy
from server_app.strategies.fedddpm_plus import FedDDPMPlusStrategy
from server_app.strategies.fedsynsam import FedSynSAMStrategy
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.relay import DecentralizedRelay
from server_app.strategies.sam_baselines import FedLESAMDStrategy, FedLESAMStrategy, FedSMOOStrategy
from server_app.strategies.scaffold import ScaffoldStrategy
from server_app.wire import WEIGHTED_BY_KEY

__all__ = [
    "DFedAvg", "DynaFed", "FedAvg", "FedAvgM", "FedCOG", "FedDDPM", "FedDDPMPlus", "FedLESAM", "FedLESAMD", "FedSAM",
    "FedSMOO", "FedSynSAM", "MoFedSAM", "NodeInfo", "OledFL", "ReplyContractError", "Scaffold", "TooManyFailedRounds",
]


@documented
class FedAvg(FedAvgStrategy):
    """FedAvg (McMahan et al., 2017) with fedsynth's reply checks, seeded sampling and bounded influence.

    Nodes train with any rule (`fedsynth.client.train_sgd`, or a Flower template's own train function).
    """


@documented
class FedSAM(FedAvgStrategy):
    """FedSAM (Qu et al., 2022): FedAvg on the server; nodes train with SAM (`fedsynth.client.train_fedsam`),
    reading rho from the train config's "sam-rho".
    """

    def __init__(self, *, sam_rho: float = DEFAULTS.sam_rho,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.sam_rho = sam_rho

    def client_config(self) -> dict[str, Scalar]:
        """FedAvg's settings and SAM's radius, "sam-rho"."""
        return {**super().client_config(), "sam-rho": self.sam_rho}


@documented
class FedCOG(FedAvgStrategy):
    """FedCOG (Ye et al., 2023): FedAvg on the server; nodes generate complementary data from the global
    model and train with knowledge distillation (`fedsynth.client`'s FedCOG functions) from the round the train
    config's "cog-start-round" names on (FedCOG is client-side only).
    """

    def __init__(self, *, cog_start_round: int = DEFAULTS.cog_start_round,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.cog_start_round = cog_start_round

    def client_config(self) -> dict[str, Scalar]:
        """FedAvg's settings and FedCOG's first round, "cog-start-round"."""
        return {**super().client_config(), "cog-start-round": self.cog_start_round}


@documented
class FedAvgM(FedAvgMStrategy):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum.
    """


@documented
class Scaffold(ScaffoldStrategy):
    """SCAFFOLD (Karimireddy et al., 2020): the server sends its control variate `c` beside the model; nodes
    train with `fedsynth.client.train_scaffold` and reply with `c_i+ - c_i` in the record "scaffold-control-delta".
    """


@documented
class MoFedSAM(PreviousUpdateStrategy):
    """MoFedSAM (Qu et al., 2022): the server sends the previous global update ("previous-update"); nodes
    train with SAM and mix in that update as momentum, reading "sam-rho" and "mofedsam-alpha".
    """

    def __init__(self, *, sam_rho: float = DEFAULTS.sam_rho,
                          mofedsam_alpha: float = DEFAULTS.mofedsam_alpha,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.sam_rho = sam_rho
        self.mofedsam_alpha = mofedsam_alpha

    def client_config(self) -> dict[str, Scalar]:
        """FedAvg's settings, "sam-rho" and "mofedsam-alpha"."""
        return {**super().client_config(), "sam-rho": self.sam_rho, "mofedsam-alpha": self.mofedsam_alpha}


@documented
class FedLESAM(FedLESAMStrategy):
    """FedLESAM (Fan et al., 2024): the server sends the previous global update; nodes perturb along it
    (a locally estimated global ascent) with radius "sam-rho".
    """

    def __init__(self, *, sam_rho: float = DEFAULTS.sam_rho,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.sam_rho = sam_rho

    def client_config(self) -> dict[str, Scalar]:
        """FedAvg's settings and SAM's radius, "sam-rho"."""
        return {**super().client_config(), "sam-rho": self.sam_rho}


@documented
class FedLESAMD(FedLESAMDStrategy):
    """FedLESAM-D: FedLESAM with FedDyn's dynamic regulariser; nodes reply with their correction
    `g_i+ - g_i` in the record "dynamic-correction".
    """

    def __init__(self, *, sam_rho: float = DEFAULTS.sam_rho,
                          dyn_alpha: float = DEFAULTS.dyn_alpha,
                          max_record_norm: float = DEFAULTS.max_record_norm,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(dyn_alpha=dyn_alpha, max_record_norm=max_record_norm, fraction_train=fraction_train,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.sam_rho = sam_rho

    def client_config(self) -> dict[str, Scalar]:
        """FedLESAM-D's settings and SAM's radius, "sam-rho"."""
        return {**super().client_config(), "sam-rho": self.sam_rho}


@documented
class FedSMOO(FedSMOOStrategy):
    """FedSMOO (Sun et al., 2023): FedDyn's server with a global perturbation `s` sent down; nodes reply with
    their perturbation correction in the record "perturbation-dual".
    """


@documented
class FedSynSAM(FedSynSAMStrategy):
    """FedSynSAM: FedAvg of (compressed) updates; after `trajectory_rounds` aggregations the server distils a
    synthetic set from the global models' trajectory and sends it once to every node (record "synthetic-data");
    nodes then perturb along a mix of their local and the synthetic gradient (`fedsynth.client.train_fedsynsam`),
    reading "sam-rho", "synsam-beta" and "synsam-mix". The server builds `model` for the distillation.
    """

    def __init__(self, *, trajectory_rounds: int = DEFAULTS.trajectory_rounds,
                          synthetic_ipc: int = DEFAULTS.synthetic_ipc,
                          distill_iterations: int = DEFAULTS.distill_iterations,
                          distill_optimizer: str = DEFAULTS.distill_optimizer,
                          distill_inner_steps: int = DEFAULTS.distill_inner_steps,
                          distill_lr: float = DEFAULTS.distill_lr,
                          distill_alpha_init: float = DEFAULTS.distill_alpha_init,
                          distill_alpha_lr: float = DEFAULTS.distill_alpha_lr,
                          matching_loss: str = DEFAULTS.matching_loss,
                          device: str = DEFAULTS.device,
                          sam_rho: float = DEFAULTS.sam_rho,
                          synsam_beta: float = DEFAULTS.synsam_beta,
                          synsam_mix: str = DEFAULTS.synsam_mix,
                          model: str = DEFAULTS.model,
                          dataset: str = DEFAULTS.dataset,
                          data_dir: str = DEFAULTS.data_dir,
                          image_channels: int = DEFAULTS.image_channels,
                          image_size: int = DEFAULTS.image_size,
                          num_classes: int = DEFAULTS.num_classes,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(trajectory_rounds=trajectory_rounds, synthetic_ipc=synthetic_ipc,
                         distill_iterations=distill_iterations, distill_optimizer=distill_optimizer,
                         distill_inner_steps=distill_inner_steps, distill_lr=distill_lr,
                         distill_alpha_init=distill_alpha_init, distill_alpha_lr=distill_alpha_lr,
                         matching_loss=matching_loss, device=device, sam_rho=sam_rho, synsam_beta=synsam_beta,
                         synsam_mix=synsam_mix, task=ServerTask(model=model, dataset=dataset, data_dir=data_dir,
                         image_channels=image_channels, image_size=image_size, num_classes=num_classes, seed=seed),
                         fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)


@documented
class DynaFed(DynaFedStrategy):
    """DynaFed (Pi et al., 2023): FedAvg; the server distils a synthetic set from the first
    `trajectory_rounds` global models and, after every later aggregation, trains the global model on it
    (D_syn never leaves the server). The server builds `model` for both.
    """

    def __init__(self, *, trajectory_rounds: int = DEFAULTS.trajectory_rounds,
                          synthetic_ipc: int = DEFAULTS.synthetic_ipc,
                          distill_iterations: int = DEFAULTS.distill_iterations,
                          distill_optimizer: str = DEFAULTS.distill_optimizer,
                          distill_inner_steps: int = DEFAULTS.distill_inner_steps,
                          distill_lr: float = DEFAULTS.distill_lr,
                          distill_alpha_init: float = DEFAULTS.distill_alpha_init,
                          distill_alpha_lr: float = DEFAULTS.distill_alpha_lr,
                          matching_loss: str = DEFAULTS.matching_loss,
                          device: str = DEFAULTS.device,
                          dynafed_lr: float = DEFAULTS.dynafed_lr,
                          dynafed_epochs: int = DEFAULTS.dynafed_epochs,
                          batch_size: int = DEFAULTS.batch_size,
                          model: str = DEFAULTS.model,
                          dataset: str = DEFAULTS.dataset,
                          data_dir: str = DEFAULTS.data_dir,
                          image_channels: int = DEFAULTS.image_channels,
                          image_size: int = DEFAULTS.image_size,
                          num_classes: int = DEFAULTS.num_classes,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(trajectory_rounds=trajectory_rounds, synthetic_ipc=synthetic_ipc,
                         distill_iterations=distill_iterations, distill_optimizer=distill_optimizer,
                         distill_inner_steps=distill_inner_steps, distill_lr=distill_lr,
                         distill_alpha_init=distill_alpha_init, distill_alpha_lr=distill_alpha_lr,
                         matching_loss=matching_loss, device=device, dynafed_lr=dynafed_lr,
                         dynafed_epochs=dynafed_epochs, batch_size=batch_size, task=ServerTask(model=model,
                         dataset=dataset, data_dir=data_dir, image_channels=image_channels, image_size=image_size,
                         num_classes=num_classes, seed=seed), fraction_train=fraction_train,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)


@documented
class FedDDPM(FedDDPMStrategy):
    """FedDDPM (Peng et al.): each node first trains its own DDPM and uploads it once (the warm-up); the server
    samples an auxiliary set from those models, then runs FedAvg rounds and, after each aggregation,
    `correction_epochs` epochs on the auxiliary set. The server builds `model` (a U-Net) for both.
    """

    def __init__(self, *, model: str = "unet-paper-mnist",
                          dataset: str = DEFAULTS.dataset,
                          data_dir: str = DEFAULTS.data_dir,
                          image_channels: int = DEFAULTS.image_channels,
                          image_size: int = DEFAULTS.image_size,
                          diffusion_timesteps: int = DEFAULTS.diffusion_timesteps,
                          device: str = DEFAULTS.device,
                          aux_sampler: str = DEFAULTS.aux_sampler,
                          ddim_steps: int = DEFAULTS.ddim_steps,
                          batch_size: int = DEFAULTS.batch_size,
                          local_optimizer: str = DEFAULTS.local_optimizer,
                          warmup_epochs: int = DEFAULTS.warmup_epochs,
                          warmup_steps: int = DEFAULTS.warmup_steps,
                          warmup_timeout: float = DEFAULTS.warmup_timeout,
                          aux_fraction: float = DEFAULTS.aux_fraction,
                          correction_epochs: int = DEFAULTS.correction_epochs,
                          correction_lr: float = DEFAULTS.correction_lr,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(device=device, aux_sampler=aux_sampler, ddim_steps=ddim_steps, batch_size=batch_size,
                         local_optimizer=local_optimizer, warmup_epochs=warmup_epochs, warmup_steps=warmup_steps,
                         warmup_timeout=warmup_timeout, aux_fraction=aux_fraction,
                         correction_epochs=correction_epochs, correction_lr=correction_lr,
                         task=ServerTask(model=model, dataset=dataset, data_dir=data_dir,
                         image_channels=image_channels, image_size=image_size,
                         diffusion_timesteps=diffusion_timesteps, seed=seed), fraction_train=fraction_train,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)


@documented
class FedDDPMPlus(FedDDPMPlusStrategy):
    """FedDDPM+ (Peng et al.): the warm-up and auxiliary set of FedDDPM, plain FedAvg rounds, QuickTest every
    `quicktest_every` rounds, and one correction of `oneshot_epochs` on the auxiliary set when QuickTest fires
    (or after `start()`'s last round), after which the run stops.
    """

    def __init__(self, *, model: str = "unet-paper-mnist",
                          dataset: str = DEFAULTS.dataset,
                          data_dir: str = DEFAULTS.data_dir,
                          image_channels: int = DEFAULTS.image_channels,
                          image_size: int = DEFAULTS.image_size,
                          diffusion_timesteps: int = DEFAULTS.diffusion_timesteps,
                          device: str = DEFAULTS.device,
                          aux_sampler: str = DEFAULTS.aux_sampler,
                          ddim_steps: int = DEFAULTS.ddim_steps,
                          batch_size: int = DEFAULTS.batch_size,
                          local_optimizer: str = DEFAULTS.local_optimizer,
                          warmup_epochs: int = DEFAULTS.warmup_epochs,
                          warmup_steps: int = DEFAULTS.warmup_steps,
                          warmup_timeout: float = DEFAULTS.warmup_timeout,
                          aux_fraction: float = DEFAULTS.aux_fraction,
                          quicktest_every: int = DEFAULTS.quicktest_every,
                          quicktest_size: int = DEFAULTS.quicktest_size,
                          quicktest_gamma: float = DEFAULTS.quicktest_gamma,
                          quicktest_threshold: float = DEFAULTS.quicktest_threshold,
                          quicktest_reference: str = DEFAULTS.quicktest_reference,
                          sampler: str = DEFAULTS.sampler,
                          fid_features: str = DEFAULTS.fid_features,
                          cache_dir: str = DEFAULTS.cache_dir,
                          oneshot_epochs: int = DEFAULTS.oneshot_epochs,
                          oneshot_lr: float = DEFAULTS.oneshot_lr,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: str = DEFAULTS.aggregation,
                          trim_fraction: float = DEFAULTS.trim_fraction,
                          byzantine_nodes: int = DEFAULTS.byzantine_nodes,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          max_update_norm_ratio: float = DEFAULTS.max_update_norm_ratio,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          compression: str = DEFAULTS.compression,
                          bits: int = DEFAULTS.bits,
                          levels: int = DEFAULTS.levels,
                          qsgd_scope: str = DEFAULTS.qsgd_scope,
                          qsgd_bucket: int = DEFAULTS.qsgd_bucket,
                          topk_ratio: float = DEFAULTS.topk_ratio,
                          error_feedback: bool = DEFAULTS.error_feedback,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(device=device, aux_sampler=aux_sampler, ddim_steps=ddim_steps, batch_size=batch_size,
                         local_optimizer=local_optimizer, warmup_epochs=warmup_epochs, warmup_steps=warmup_steps,
                         warmup_timeout=warmup_timeout, aux_fraction=aux_fraction, quicktest_every=quicktest_every,
                         quicktest_size=quicktest_size, quicktest_gamma=quicktest_gamma,
                         quicktest_threshold=quicktest_threshold, quicktest_reference=quicktest_reference,
                         sampler=sampler, fid_features=fid_features, cache_dir=cache_dir,
                         oneshot_epochs=oneshot_epochs, oneshot_lr=oneshot_lr, task=ServerTask(model=model,
                         dataset=dataset, data_dir=data_dir, image_channels=image_channels, image_size=image_size,
                         diffusion_timesteps=diffusion_timesteps, seed=seed), fraction_train=fraction_train,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         trim_fraction=trim_fraction, byzantine_nodes=byzantine_nodes,
                         max_weight_share=max_weight_share, max_update_norm=max_update_norm,
                         max_update_norm_ratio=max_update_norm_ratio, update_norm_action=update_norm_action,
                         compression=compression, bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                         qsgd_bucket=qsgd_bucket, topk_ratio=topk_ratio, error_feedback=error_feedback,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)


@documented
class DFedAvg(DecentralizedRelay):
    """Decentralized FedAvg over a peer topology: `configure_train` sends each node its own message (its mixing
    weights and its neighbours' last models, or their weighted sum with `relay_mixing`); `aggregate_train`
    keeps each reply as that node's model and returns their average x-bar. All nodes train every round
    (`fedsynth.client.gossip_mix`, then `fedsynth.client.train_sgd`); docs/library.md describes the message layout.
    """


@documented
class OledFL(DecentralizedRelay):
    """OledFL (Li et al., 2024): DFedAvg's relay; each node restarts from an "opposite lookahead" of its model
    (`fedsynth.client.ole_restart`) with the train config's "ole-beta", then trains with SGD or, with
    `sam`, with SAM at the config's "sam-rho".
    """

    def __init__(self, *, sam: bool = False,
                          ole_beta: float = DEFAULTS.ole_beta,
                          sam_rho: float = DEFAULTS.sam_rho,
                          topology: str = DEFAULTS.topology,
                          peers: int = DEFAULTS.peers,
                          mixing: str = DEFAULTS.mixing,
                          relay_mixing: bool = DEFAULTS.relay_mixing,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(node_settings={"ole-beta": ole_beta, **({"sam-rho": sam_rho} if sam else {})},
                         topology=topology, peers=peers, mixing=mixing, relay_mixing=relay_mixing,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, max_weight_share=max_weight_share,
                         max_update_norm=max_update_norm, update_norm_action=update_norm_action,
                         lr_schedule=lr_schedule, nodes=nodes, weighted_by_key=weighted_by_key,
                         min_available_nodes=min_available_nodes)
