"""DynaFed (Pi et al., 2023), the FedSynSAM paper's baseline (SPEC 4.1).

Clients run FedAvg. The server distils a synthetic set from the first R global
models exactly as FedSynSAM does (server_app/distillation.py), once, and from
then on, after every aggregation, trains the global model on it on the server
(Adam at DynaFed's rate, for DynaFed's epochs of the recipe's batch size: `DynaFedTraining`). D_syn
never leaves the server, so the traffic is FedAvg's. torch is imported where the server trains, not
with the module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.keys import parameter
from common.records import Weights
from common.run.task import make_model
from server_app.strategies.fedsynsam import TrajectoryStrategy
from server_app.strategies.parameters import documented
from server_app.strategies.server_training import DynaFedTraining, field_list, grouped


@dataclass(frozen=True)
class DynaFedClassSettings:
    """DynaFed's strategy class (not a part of the run config): its server's training on the synthetic set, one
    grouped value (its keys' declaration: the run config's `DynaFedSettings` and the local training recipe's
    batch size, which the server reads here)."""

    server_training: DynaFedTraining = parameter(
        DynaFedTraining(), "The server's epochs on the synthetic set: a "
        f"`DynaFedTraining({field_list(DynaFedTraining)})`, each field the run-config key of the same name.")

    def check(self) -> None:
        """Refuse a `server_training` that is not a `DynaFedTraining` (which checked its keys when built)."""
        grouped(DynaFedTraining, "server_training", self.server_training)


@documented
class DynaFed(TrajectoryStrategy):
    """DynaFed (Pi et al., 2023): FedAvg; the server distils a synthetic set from the first
    `distillation.trajectory_rounds` global models and, after every later aggregation, trains the global model on it
    (D_syn never leaves the server). The server builds `distillation.task`'s model for both.
    """

    settings = DynaFedClassSettings

    def after_aggregation(self, new: Weights) -> Weights:
        training = self.server_training
        if self.synthetic is None or training.dynafed_epochs == 0:
            return new
        from common.metrics.evaluation import resolve_device
        from server_app.distillation import train_on_synthetic

        x, y = self.synthetic
        return train_on_synthetic(
            make_model(self.distillation.task), new, x, y, epochs=training.dynafed_epochs, lr=training.dynafed_lr,
            batch_size=training.batch_size, rng=np.random.default_rng([self.seed, self.server_round, 6]),
            device=resolve_device(self.distillation.device),
        )
