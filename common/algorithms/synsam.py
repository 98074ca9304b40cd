"""FedSynSAM's ascent direction: the local/synthetic gradient mix and how much of it is synthetic (SPEC 4.3).

FedSynSAM perturbs along `g = beta * grad F(w; xi) + (1 - beta) * grad F(w; zeta)`
(the paper's eq. 14, the mix "paper" of `SynSAMRuleSettings`), xi a local batch and zeta a
synthetic one. When the synthetic gradient is much smaller than the local one,
its term is a sliver of `g` however well it points: with beta = 0.9 and
`||grad F(w; zeta)|| = 0.15 ||grad F(w; xi)||` it is about 1.6 % of the mix.
The mix "normalized" is an ablation, **not the paper's method**: each
gradient is scaled to unit norm before mixing, so the synthetic term weighs
exactly `1 - beta` whatever the norms; it tells whether the synthetic direction
helps once it is not drowned.

The client's rule (client_app/sam_family.py) and the server's full-batch
diagnostic (server_app/perturbation.py) both use these functions. Tensors are
lists of per-parameter tensors read as one flat vector; norms and dot products
are accumulated in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from common.keys import key_name

MIXES: tuple[str, ...] = ("paper", "normalized")
_EPS = 1e-12

Tensors = Sequence[torch.Tensor]


def l2_norm(tensors: Tensors) -> float:
    """The L2 norm of the parameter list as one vector."""
    return math.sqrt(sum(float(torch.sum(t.double() ** 2)) for t in tensors))


def cosine(a: Tensors, b: Tensors) -> float:
    """Cosine similarity of two parameter lists read as one flat vector each (0 if either is zero)."""
    dot = sum(float(torch.sum(x.double() * y.double())) for x, y in zip(a, b))
    na, nb = l2_norm(a), l2_norm(b)
    return dot / (na * nb) if na > 0 and nb > 0 else 0.0


def ascent_terms(local: Tensors, synthetic: Tensors, beta: float, mix: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The local and synthetic terms whose sum is the ascent direction, for the given mix."""
    if mix not in MIXES:
        raise ValueError(f"{key_name('synsam_mix')}: unknown mix {mix!r}, expected one of {MIXES}")
    a, b = beta, 1.0 - beta
    if mix == "normalized":
        a, b = a / (l2_norm(local) + _EPS), b / (l2_norm(synthetic) + _EPS)
    return [a * t for t in local], [b * t for t in synthetic]


def mix_ascent(local: Tensors, synthetic: Tensors, beta: float, mix: str = "paper") -> list[torch.Tensor]:
    """FedSynSAM's ascent direction: `beta g_local + (1 - beta) g_syn` (paper), or of the unit gradients."""
    local_term, synthetic_term = ascent_terms(local, synthetic, beta, mix)
    return [x + y for x, y in zip(local_term, synthetic_term)]


def synthetic_share(local: Tensors, synthetic: Tensors, beta: float, mix: str = "paper") -> float:
    """`||synthetic term|| / (||local term|| + ||synthetic term||)`: 0 without synthetic signal, 1 - beta normalized."""
    local_term, synthetic_term = ascent_terms(local, synthetic, beta, mix)
    nl, ns = l2_norm(local_term), l2_norm(synthetic_term)
    return ns / (nl + ns) if nl + ns > 0 else 0.0


def norm_ratio(local: Tensors, synthetic: Tensors) -> float:
    """`||grad F(w; zeta)|| / ||grad F(w; xi)||` (the local norm floored at 1e-12, so it stays finite)."""
    return l2_norm(synthetic) / max(l2_norm(local), _EPS)


def step_statistics(stats: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """One client's per-step `norm-ratio`, `share` and `cos` as its reply metrics (`synsam-` keys).

    The norm ratio goes up as its median over the steps (`synsam-norm-ratio-median`): on a one-class
    client a step whose local gradient is nearly 0 gives a ratio orders of magnitude above the others
    (a mean of 1.4e8 against a median of 9.2e4 in one measured run), so a mean reports that one step.
    The share goes up as its median (`synsam-share-median`) and mean (`synsam-share`), the cosine as its
    mean (`synsam-cos`): both are bounded, so no single step rules their mean. A statistic without
    steps gives no entry.
    """
    out: dict[str, float] = {}
    if stats.get("norm-ratio"):
        out["synsam-norm-ratio-median"] = float(np.median(stats["norm-ratio"]))
    if stats.get("share"):
        out["synsam-share-median"] = float(np.median(stats["share"]))
        out["synsam-share"] = float(np.mean(stats["share"]))
    if stats.get("cos"):
        out["synsam-cos"] = float(np.mean(stats["cos"]))
    return out
