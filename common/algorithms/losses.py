"""Loss terms of the centralized baselines (SPEC 4.1), and SCAFFOLD's control-variate rules re-exported.

Pure functions on tensors, so each can be checked against hand-computed values. SCAFFOLD's rules work
on numpy arrays and live in common/algorithms/scaffold_control.py, which the server imports without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from common.algorithms.scaffold_control import (  # noqa: F401 - re-exported: the client's rules import them here
    scaffold_client_control, scaffold_clipped_control_delta, scaffold_server_control,
)


def proximal_term(params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx: (mu / 2) * ||w - w_global||^2 over all parameters."""
    return 0.5 * mu * sum(torch.sum((p - a) ** 2) for p, a in zip(params, anchor))


def moon_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """MOON's model-contrastive loss, averaged over the batch.

    -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
    with cosine similarity: pulls the local representation towards the global
    model's and away from the previous local model's.
    """
    positive = F.cosine_similarity(z, z_global, dim=-1) / tau
    negative = F.cosine_similarity(z, z_prev, dim=-1) / tau
    logits = torch.stack([positive, negative], dim=1)
    targets = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, targets)
