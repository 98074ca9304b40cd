"""The strategies whose server trains a model itself: FedSynSAM and DynaFed (distillation), FedDDPM and
FedDDPM+ (sampling and corrections of a DDPM).

Each takes the model it builds (`model`: a preset or "package.module:factory") and the data's shape (`dataset`,
or `image_channels`, `image_size`, `num_classes`) and hands them to its server strategy as a `ServerTask`.
"""

from __future__ import annotations

from typing import Callable

from flwr.common.typing import Scalar

from common.run.config import own_data_partition
from common.run.task import ServerTask
from server_app.strategies.dynafed import DynaFedStrategy
from server_app.strategies.fedddpm import FedDDPMStrategy
from server_app.strategies.fedddpm_plus import FedDDPMPlusStrategy
from server_app.strategies.fedsynsam import FedSynSAMStrategy
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.wire import WEIGHTED_BY_KEY


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
                         image_channels=image_channels, image_size=image_size,
                         partition=own_data_partition(image_channels, image_size, num_classes),
                         num_classes=num_classes, seed=seed),
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
                         partition=own_data_partition(image_channels, image_size, num_classes),
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
                         partition=own_data_partition(image_channels, image_size),
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
                         partition=own_data_partition(image_channels, image_size),
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
