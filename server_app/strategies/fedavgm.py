"""FedAvgM: FedAvg with server momentum on the averaged update (Hsu et al., 2019).

v <- beta * v + mean_delta;  w <- w + server_lr * v. The velocity is server
state that a checkpoint must keep.
"""

from __future__ import annotations

import numpy as np

from flwr.app import Message

from common.algorithms.aggregation_settings import FedAvgMSettings
from common.records import Weights
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.parameters import documented


@documented
class FedAvgM(FedAvg):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum `server_momentum`."""

    settings = FedAvgMSettings

    velocity: Weights | None = None

    def _state_arrays(self) -> dict[str, Weights]:
        return {"velocity": self.velocity} if self.velocity is not None else {}

    def _load_state_arrays(self, groups) -> None:
        self.velocity = groups.get("velocity")

    def _server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        beta = self.server_momentum
        if self.velocity is None:
            self.velocity = {name: np.zeros_like(d) for name, d in mean_delta.items()}
        self.velocity = {name: (beta * self.velocity[name] + mean_delta[name]).astype(np.float32) for name in mean_delta}
        new = {name: (self.current[name] + self.server_lr * self.velocity[name]).astype(np.float32)
               for name in self.current}
        new.update(self._aggregated_buffers(replies))  # buffers are averaged, not moved with momentum
        return new
