"""Sharpness-aware minimisation (SAM) with a pluggable ascent direction.

SAM evaluates the gradient at a perturbed point `w + e`, where
`e = rho * g / (||g||_2 + 1e-12)` and the norm is the global L2 norm over all
parameters. FedSAM uses the local gradient as `g`; FedLESAM the previous global
update; FedSynSAM a mix of local and synthetic-data gradients; MoFedSAM the local
gradient with a momentum-corrected descent. Callers pass the direction; this
module only does the perturb / gradient / restore dance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

EPS = 1e-12


def sam_perturbation(direction: Sequence[torch.Tensor], rho: float) -> list[torch.Tensor]:
    """e = rho * g / (||g||_2 + eps), with the norm taken over all tensors together."""
    norm = torch.sqrt(sum(torch.sum(d.double() ** 2) for d in direction)).to(direction[0].dtype)
    scale = rho / (norm + EPS)
    return [d * scale for d in direction]


def current_gradients(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """Copies of the parameters' .grad (zeros where a parameter got none)."""
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def perturbed_gradients(
    params: Sequence[nn.Parameter],
    loss_fn: Callable[[], torch.Tensor],
    direction: Sequence[torch.Tensor],
    rho: float,
) -> torch.Tensor:
    """Fill .grad with the gradient of `loss_fn` at `w + e(direction)`, leaving `w` unchanged.

    Returns the loss at the perturbed point.
    """
    perturbation = sam_perturbation(direction, rho)
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, e in zip(params, perturbation):
            p.add_(e)
    for p in params:
        p.grad = None
    loss = loss_fn()
    loss.backward()
    with torch.no_grad():
        for p, w in zip(params, saved):
            p.copy_(w)  # restore exactly; w + e - e is not w in floating point
    return loss.detach()


def fedsam_gradients(params: Sequence[nn.Parameter], loss_fn: Callable[[], torch.Tensor], rho: float,
                     perturbed_loss_fn: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """FedSAM: ascent along the local gradient, .grad = grad L(w + e).

    `loss_fn` is evaluated at w, `perturbed_loss_fn` (default: `loss_fn`) at w + e; the
    client rules pass one that leaves BatchNorm's running statistics alone, so that only the
    pass at w moves them (common/algorithms/batch_statistics.py).
    """
    for p in params:
        p.grad = None
    loss_fn().backward()
    second = perturbed_loss_fn if perturbed_loss_fn is not None else loss_fn
    return perturbed_gradients(params, second, current_gradients(params), rho)
