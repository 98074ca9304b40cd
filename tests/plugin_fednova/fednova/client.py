"""FedNova's client rule with plain local SGD: tau_i steps, and tau_i in the reply.

With plain SGD FedNova's gradient-weight vector is a_i = (1, ..., 1), so ||a_i||_1 = tau_i, the node's local
step count (with `local-epochs` it differs between nodes of different sizes). The node sends its model as for
FedAvg; the server normalises w_global - w_i by tau_i (fednova/server.py).
"""

from __future__ import annotations

from fedsynth.algorithm import LocalJob, LocalResult, plain_rule, run_local_steps

TAU = "stat-fednova-tau"  # the reply metric: this round's local steps tau_i (a "stat-" metric: the round log
# shows its mean and max over the replies)


def fednova_update(job: LocalJob) -> LocalResult:
    """K steps of plain SGD, reporting tau_i = K (a_i = tau_i holds for SGD without momentum only)."""
    optimizer = job.optimizer
    if optimizer.kind != "sgd" or optimizer.momentum != 0:
        raise ValueError("this FedNova client normalises plain SGD (a_i = tau_i): run it with momentum = 0 and "
                         "the sgd local optimizer")
    result = run_local_steps(job, plain_rule(job))
    result.metrics[TAU] = float(result.num_steps)
    return result
