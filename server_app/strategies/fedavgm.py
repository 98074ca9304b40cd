"""FedAvgM: FedAvg with server momentum on the averaged update (Hsu et al., 2019).

v <- beta * v + mean_delta;  w <- w + server_lr * v. The velocity is server
state that a checkpoint must keep.
"""

from __future__ import annotations

import numpy as np
from typing import Callable

from flwr.app import Message
from flwr.common.typing import Scalar

from common.records import Weights
from common.run.aggregation import Aggregation, BoundedInfluence
from common.run.codecs import Codec
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.wire import WEIGHTED_BY_KEY


@documented
class FedAvgM(FedAvg):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum `server_momentum`."""

    velocity: Weights | None = None

    def __init__(self, *, server_momentum: float = DEFAULTS.server_momentum,
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
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation, bounded_influence=bounded_influence, codec=codec,
                         node_settings=node_settings, parameter_names=parameter_names, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.server_momentum = server_momentum

    def state_arrays(self) -> dict[str, Weights]:
        return {"velocity": self.velocity} if self.velocity is not None else {}

    def load_state_arrays(self, groups) -> None:
        self.velocity = groups.get("velocity")

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        beta = self.server_momentum
        if self.velocity is None:
            self.velocity = {name: np.zeros_like(d) for name, d in mean_delta.items()}
        self.velocity = {name: (beta * self.velocity[name] + mean_delta[name]).astype(np.float32) for name in mean_delta}
        new = {name: (self.current[name] + self.server_lr * self.velocity[name]).astype(np.float32)
               for name in self.current}
        new.update(self.update_mean.buffers(replies))  # buffers are averaged, not moved with momentum
        return new
