"""DynaFed (Pi et al., 2023), the FedSynSAM paper's baseline (SPEC 4.1).

Clients run FedAvg. The server distils a synthetic set from the first R global
models exactly as FedSynSAM does (server_app/distillation.py), once, and from
then on, after every aggregation, trains the global model on it on the server
(Adam, `dynafed-lr`, `dynafed-epochs` epochs of `batch-size` batches). D_syn
never leaves the server, so the traffic is FedAvg's. torch is imported where the server trains, not
with the module.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from flwr.common.typing import Scalar

from common.records import Weights
from common.run.task import ServerTask, make_model
from common.run.aggregation import Aggregation, BoundedInfluence
from common.run.codecs import Codec
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.fedsynsam import TrajectoryStrategy
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.wire import WEIGHTED_BY_KEY


@documented
class DynaFed(TrajectoryStrategy):
    """DynaFed (Pi et al., 2023): FedAvg; the server distils a synthetic set from the first
    `trajectory_rounds` global models and, after every later aggregation, trains the global model on it
    (D_syn never leaves the server). The server builds `task`'s model for both.
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
                          synthetic_source: str = DEFAULTS.synthetic_source,
                          task: ServerTask = ServerTask(),
                          device: str = DEFAULTS.device,
                          dynafed_lr: float = DEFAULTS.dynafed_lr,
                          dynafed_epochs: int = DEFAULTS.dynafed_epochs,
                          batch_size: int = DEFAULTS.batch_size,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: Aggregation = DEFAULTS.aggregation,
                          bounded_influence: BoundedInfluence | None = None,
                          codec: Codec | None = None,
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
                         matching_loss=matching_loss, synthetic_source=synthetic_source, task=task, device=device,
                         fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation, bounded_influence=bounded_influence, codec=codec,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.dynafed_lr = dynafed_lr
        self.dynafed_epochs = dynafed_epochs
        self.batch_size = batch_size


    def after_aggregation(self, new: Weights) -> Weights:
        if self.synthetic is None or self.dynafed_epochs == 0:
            return new
        from common.metrics.evaluation import resolve_device
        from server_app.distillation import train_on_synthetic

        x, y = self.synthetic
        return train_on_synthetic(
            make_model(self.task), new, x, y, epochs=self.dynafed_epochs, lr=self.dynafed_lr,
            batch_size=self.batch_size, rng=np.random.default_rng([self.seed, self.server_round, 6]),
            device=resolve_device(self.device),
        )
