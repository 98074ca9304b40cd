"""FedAdam's server rule (Reddi et al., 2021, Algorithm 2): Adam on the mean update of the nodes.

With Delta_t the round's mean update (FedAvg's weighted mean of w_i - w),

    m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t
    v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2
    w  <- w + eta m_t / (sqrt(v_t) + tau)

from m = v = 0 (no bias correction: the paper's algorithm). The moments are server state that must survive a
resume: the class declares them (`server_state`) and writes no checkpoint code.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Message

from fedadam.settings import FedAdamSettings
from fedsynth.strategies import FedAvg

Weights = Mapping[str, np.ndarray]


def adam_step(weights: Weights, delta: Weights, m: Weights, v: Weights, eta: float, beta_1: float, beta_2: float,
              tau: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(new weights, m_t, v_t) of one Adam step on `delta`, every array float32 (the paper's update, no bias
    correction)."""
    m_t = {k: (beta_1 * m[k] + (1 - beta_1) * delta[k]).astype(np.float32) for k in delta}
    v_t = {k: (beta_2 * v[k] + (1 - beta_2) * np.square(delta[k])).astype(np.float32) for k in delta}
    new = {k: (weights[k] + eta * m_t[k] / (np.sqrt(v_t[k]) + tau)).astype(np.float32) for k in delta}
    return new, m_t, v_t


class FedAdam(FedAvg):
    """FedAdam: FedAvg's round, sampling and checks, with Adam's step on the mean update as its server step."""

    settings = FedAdamSettings    # its constructor parameters eta, beta_1, beta_2, tau, local_lr_scale
    server_state = ("m", "v")     # Adam's moments: checkpointed and restored by fedsynth
    m: dict[str, np.ndarray] | None = None
    v: dict[str, np.ndarray] | None = None

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> dict[str, np.ndarray]:
        """Adam on the trainable arrays' mean update; the buffers from the replies' (FedAvg's rule)."""
        names = self._parameter_names
        zeros = {k: np.zeros_like(self.current[k], dtype=np.float32) for k in names}
        new, self.m, self.v = adam_step({k: self.current[k] for k in names}, {k: mean_delta[k] for k in names},
                                        self.m or zeros, self.v or zeros, self.eta, self.beta_1, self.beta_2,
                                        self.tau)
        return {**self.current, **new, **self.update_mean.buffers(replies)}
