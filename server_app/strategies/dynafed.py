"""DynaFed (Pi et al., 2023), the FedSynSAM paper's baseline (SPEC 4.1).

Clients run FedAvg. The server distils a synthetic set from the first R global
models exactly as FedSynSAM does (server_app/distillation.py), once, and from
then on, after every aggregation, trains the global model on it on the server
(Adam, `dynafed-lr`, `dynafed-epochs` epochs of `batch-size` batches). D_syn
never leaves the server, so the traffic is FedAvg's.
"""

from __future__ import annotations

import numpy as np

from common.metrics.evaluation import resolve_device
from common.records import Weights
from common.run.task import make_model
from server_app.distillation import train_on_synthetic
from server_app.strategies.fedsynsam import TrajectoryStrategy


class DynaFedStrategy(TrajectoryStrategy):
    """FedAvg plus server training on the trajectory-distilled synthetic set."""

    def after_aggregation(self, new: Weights) -> Weights:
        if self.synthetic is None or self.cfg.dynafed_epochs == 0:
            return new
        x, y = self.synthetic
        return train_on_synthetic(
            make_model(self.cfg), new, x, y, epochs=self.cfg.dynafed_epochs, lr=self.cfg.dynafed_lr,
            batch_size=self.cfg.batch_size, rng=np.random.default_rng([self.cfg.seed, self.server_round, 6]),
            device=resolve_device(self.cfg.device),
        )
