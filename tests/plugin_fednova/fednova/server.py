"""FedNova's server rule: normalised averaging of the nodes' updates.

Each node i reports its model w_i and its local steps tau_i; with n_i its examples, p_i = n_i / n,
d_i = (w - w_i) / tau_i its normalised update and tau_eff = sum_i p_i tau_i, the server takes

    w <- w - tau_eff * sum_i p_i d_i

(Wang et al., 2020, eq. 6 with a_i = (1, ..., 1): plain local SGD), times the run's `server-lr` (1 by
default). With equal tau_i it is FedAvg's weighted mean of the models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Message, RecordDict

from fedsynth.strategies import FedAvg
from fednova.client import TAU

Weights = Mapping[str, np.ndarray]


def fednova_step(global_weights: Weights, local_weights: Sequence[Weights], taus: Sequence[float],
                 num_examples: Sequence[float], server_lr: float = 1.0) -> dict[str, np.ndarray]:
    """w - server_lr * tau_eff * sum_i p_i (w - w_i) / tau_i, with p_i = n_i / n and tau_eff = sum_i p_i tau_i."""
    p = np.asarray(num_examples, dtype=np.float64) / float(np.sum(num_examples))
    tau_eff = float(np.dot(p, taus))
    step = {name: sum(p_i * (global_weights[name] - w_i[name]) / tau_i
                      for p_i, w_i, tau_i in zip(p, local_weights, taus)) for name in global_weights}
    return {name: (global_weights[name] - server_lr * tau_eff * step[name]).astype(np.float32)
            for name in global_weights}


class FedNova(FedAvg):
    """FedNova: FedAvg's round, sampling and checks, with the normalised average as its server step."""

    reply_metrics = {TAU: "float > 0, the node's local steps this round (fednova.client.fednova_update)"}

    def check_extra_records(self, content: RecordDict) -> str | None:
        tau = content.metric_records["metrics"].get(TAU)
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
            return f"reply metric {TAU!r} = {tau!r} is not a number > 0 (FedNova's local step count)"
        return None

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> dict[str, np.ndarray]:
        """FedNova's step over the replies' models (w + their decoded updates), weighted as FedAvg weighs them."""
        local = [{name: self.current[name] + delta[name] for name in self.current}
                 for delta in (self.reply_gate.delta(reply) for reply in replies)]
        taus = [float(reply.content.metric_records["metrics"][TAU]) for reply in replies]
        new = fednova_step(self.current, local, taus, self.update_mean.weights(replies), self.server_lr)
        new.update(self.update_mean.buffers(replies))
        return new
