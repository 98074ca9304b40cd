"""DynaFed (Pi et al., 2023), the FedSynSAM paper's baseline (SPEC 4.1).

Clients run FedAvg. The server distils a synthetic set from the first R global
models exactly as FedSynSAM does (server_app/distillation.py), once, and from
then on, after every aggregation, trains the global model on it on the server
(Adam at DynaFed's rate, for DynaFed's epochs of the recipe's batch size: `DynaFedClassSettings`). D_syn
never leaves the server, so the traffic is FedAvg's. torch is imported where the server trains, not
with the module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.algorithms.local_training_settings import LocalTrainingSettings
from common.algorithms.synsam_settings import DynaFedSettings
from common.keys import SERVER, same_key
from common.records import Weights
from common.run.task import make_model
from server_app.strategies.fedsynsam import TrajectoryStrategy
from server_app.strategies.parameters import documented


@dataclass(frozen=True)
class DynaFedClassSettings(DynaFedSettings):
    """DynaFed's strategy class (not a part of the run config): DynaFed's settings and the batch size of the
    server's epochs (the local training recipe's key, which the server reads here)."""

    batch_size: int = same_key(LocalTrainingSettings, "batch_size", side=SERVER)


@documented
class DynaFed(TrajectoryStrategy):
    """DynaFed (Pi et al., 2023): FedAvg; the server distils a synthetic set from the first
    `trajectory_rounds` global models and, after every later aggregation, trains the global model on it
    (D_syn never leaves the server). The server builds `task`'s model for both.
    """

    settings = DynaFedClassSettings

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
