"""fedsynth's centralized strategies under their public names: FedAvg, FedAvgM, SCAFFOLD and the SAM family.

A class that only renames fedsynth's server strategy keeps its parameters; one whose nodes read a setting the
server does not use (FedSAM's `sam_rho`, FedCOG's `cog_start_round`, ...) adds that parameter and sends it in
every train message's config (`client_config`). The package docstring (fedsynth/strategies/__init__.py) says
how to use them.
"""

from __future__ import annotations

from typing import Callable

from flwr.common.typing import Scalar

from server_app.strategies.fedavg import FedAvgStrategy
from server_app.strategies.fedavgm import FedAvgMStrategy
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.sam_baselines import FedLESAMDStrategy, FedLESAMStrategy, FedSMOOStrategy
from server_app.strategies.scaffold import ScaffoldStrategy
from server_app.wire import WEIGHTED_BY_KEY


@documented
class FedAvg(FedAvgStrategy):
    """FedAvg (McMahan et al., 2017) with fedsynth's reply checks and seeded sampling.

    The server step is the paper's: w + server_lr * the sample-weighted mean of the updates (`aggregation`).
    Bounded influence (a weight cap and an update-norm bound) is an option: `FedAvg(**BOUNDED_INFLUENCE)`.
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
    train with `fedsynth.client.train_scaffold` and reply with `c_i+ - c_i` in the record "scaffold-delta-c"
    (the server sends `c` as "scaffold-c").
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
