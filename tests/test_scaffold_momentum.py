"""SCAFFOLD's client update with local momentum: the option-II control variate has no feedback from c, c_i.

With the correction `w <- w - lr (c - c_i)` applied after each optimizer step
(outside the momentum buffer, as the SCAFFOLD paper's option II and the FedCOG
authors' code do), K steps on a loss with a constant gradient g give

    c_i+ = c_i - c + (x - y_i) / (K lr) = g * A,   A = (1/K) sum_{k=1..K} (1 - beta^k) / (1 - beta),

whatever c and c_i were: the momentum-weighted mean gradient, and no gain from
the old control variates (a correction fed through the momentum buffer would
give c_i+ = g A + (A - 1)(c - c_i), a gain of A - 1 > 1 that diverges). This
is why SCAFFOLD's divergence with momentum 0.9 on NIID-2 is a step-size effect
and not a defect (docs/fedcog.md, benchmarks/results/scaffold-momentum.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from torch import nn

from client_app.training import LocalJob
from client_app.updates import STATE_SCAFFOLD_CONTROL, scaffold_update
from common.run.config import parse_run_config
from common.protocol import SCAFFOLD_CONTROL
from common.records import from_record, to_record
from server_app.registry import SERVER_STRATEGIES, train_config_of


def momentum_factor(beta: float, steps: int) -> float:
    """A = (1/K) sum_{k=1..K} (1 - beta^k) / (1 - beta); 1 without momentum."""
    return float(np.mean([(1 - beta ** k) / (1 - beta) for k in range(1, steps + 1)]))


def test_momentum_factor_by_hand() -> None:
    assert momentum_factor(0.0, 30) == pytest.approx(1.0)
    assert momentum_factor(0.5, 2) == pytest.approx((1 + 1.5) / 2)
    assert momentum_factor(0.9, 30) == pytest.approx(7.13, abs=0.01)  # the K = 30, beta = 0.9 of the measurement


@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize("scale", [0.0, 1.0, 50.0])
def test_option_two_control_variate_is_the_momentum_weighted_gradient_whatever_c_was(beta: float, scale: float) -> None:
    steps, lr = 30, 0.01
    cfg = parse_run_config({"algorithm": "scaffold", "lr": lr, "momentum": beta, "weight-decay": 0.0,
                            "local-steps": steps, "batch-size": 4}, SERVER_STRATEGIES)
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    names = [name for name, _ in model.named_parameters()]
    gradient = {name: np.random.default_rng(i).normal(size=p.shape).astype(np.float32)
                for i, (name, p) in enumerate(model.named_parameters())}
    rng = np.random.default_rng(7)
    c_global = {n: (scale * rng.normal(size=gradient[n].shape)).astype(np.float32) for n in names}
    c_local = {n: (scale * rng.normal(size=gradient[n].shape)).astype(np.float32) for n in names}

    def linear_loss(m: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        # loss = <g, w>: the gradient is g everywhere
        return sum((p * torch.from_numpy(gradient[n])).sum() for n, p in m.named_parameters())

    incoming, state = RecordDict({"config": ConfigRecord(train_config_of(cfg, 1))}), RecordDict()
    incoming[SCAFFOLD_CONTROL] = to_record(c_global)
    state[STATE_SCAFFOLD_CONTROL] = to_record(c_local)
    job = LocalJob(cfg=cfg, server_round=1, partition_id=0, model=model, x=torch.zeros(8, 3),
                   y=torch.zeros(8, dtype=torch.long), device=torch.device("cpu"), incoming=incoming, state=state,
                   loss_fn=linear_loss)
    scaffold_update(job)
    c_new = from_record(state.array_records[STATE_SCAFFOLD_CONTROL])
    factor = momentum_factor(beta, steps)
    for n in names:
        np.testing.assert_allclose(c_new[n], factor * gradient[n], rtol=2e-3, atol=2e-3 * (1 + scale))
