"""The math of FedCOG (Ye et al., 2024, "Fake It Till Make It"), as small pure functions.

FedCOG complements each client's skewed label distribution with data generated
from the global model: the client allocates its generation budget to the labels
it lacks (paper appendix A.1.1), optimises inputs so that the global model
recognises them while the client's previous local model disagrees (a
Jensen-Shannon disagreement term, paper eq. 2), then distils the global model's
soft labels on those inputs into the local model (eq. 3), with coefficients
that balance real and generated data (appendix A.2.2). These functions carry no
state and have unit tests against hand-computed values; the client plug-in that
uses them is `client_app/fedcog.py`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from common.algorithms.cog_names import COG_ABLATIONS, KD_WEIGHTINGS  # noqa: F401 - re-exported

# SPEC 4.2: probabilities are clamped before the Jensen-Shannon divergence, as in the reference code.
JS_CLAMP = (0.01, 0.99)


def complementary_distribution(label_counts: np.ndarray) -> np.ndarray:
    """d_hat = max(d) - d: how many samples of each class the client lacks for a balanced set."""
    counts = np.asarray(label_counts, dtype=np.int64)
    return counts.max() - counts


def complementary_counts(label_counts: np.ndarray, budget: int) -> np.ndarray:
    """Generated samples per class, N_c = round(G * d_hat_c / sum(d_hat)); all zero for a balanced client.

    `round` is round-half-up, so the total can differ from G by a few samples.
    """
    d_hat = complementary_distribution(label_counts)
    total = int(d_hat.sum())
    if total == 0:
        return np.zeros_like(d_hat)
    return np.floor(budget * d_hat / total + 0.5).astype(np.int64)


def complementary_labels(label_counts: np.ndarray, budget: int) -> np.ndarray:
    """The target label list of the generated set: class c repeated N_c times, in class order."""
    counts = complementary_counts(label_counts, budget)
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def kd_coefficients(label_counts: np.ndarray, weighting: str, lambda_kd: float) -> tuple[float, float]:
    """(c_real, c_kd): weights of the real-data task loss and of the KD loss.

    `balanced` (the paper's hyper-parameter-free variant, as in its code):
    c_real = N_real / (N_real + N_gen), c_kd = N_gen / (N_real + N_gen), with
    N_real = sum(d) and N_gen = sum(d_hat), the number of samples that would
    balance the local set. `fixed`: c_real = 1, c_kd = lambda_kd (paper eq. 3).
    """
    if weighting == "fixed":
        return 1.0, float(lambda_kd)
    if weighting != "balanced":
        raise ValueError(f"kd weighting {weighting!r} is not one of {KD_WEIGHTINGS}")
    n_real = float(np.sum(label_counts))
    n_gen = float(complementary_distribution(label_counts).sum())
    if n_real + n_gen == 0:
        return 1.0, 0.0
    return n_real / (n_real + n_gen), n_gen / (n_real + n_gen)


def js_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Textbook Jensen-Shannon divergence (nats), mean over the batch, with clamped probabilities.

    JS = 1/2 KL(P || M) + 1/2 KL(Q || M), M = (P + Q) / 2, with P, Q and M
    clamped to [0.01, 0.99] so that the log stays finite and the gradient does
    not vanish on confident predictions. (The reference code computes
    KL(M || P) + KL(M || Q) instead; SPEC 4.2 asks for the textbook form.)
    """
    low, high = JS_CLAMP
    p = F.softmax(logits_p, dim=1)
    q = F.softmax(logits_q, dim=1)
    m = (0.5 * (p + q)).clamp(low, high)
    p, q = p.clamp(low, high), q.clamp(low, high)
    kl_pm = (p * (p.log() - m.log())).sum(dim=1)
    kl_qm = (q * (q.log() - m.log())).sum(dim=1)
    return (0.5 * (kl_pm + kl_qm)).mean()


def disagreement_loss(global_logits: torch.Tensor, local_logits: torch.Tensor) -> torch.Tensor:
    """L_dis = 1 - JS(p_global, p_local): small when the two models disagree (paper eq. 2)."""
    return 1.0 - js_divergence(global_logits, local_logits)


def generation_loss(
    global_logits: torch.Tensor,
    targets: torch.Tensor,
    local_logits: torch.Tensor | None,
    lambda_dis: float,
) -> torch.Tensor:
    """L_gen = CE(global(x), y) + lambda_dis * (1 - JS); no disagreement term without a local model."""
    loss = F.cross_entropy(global_logits, targets)
    if local_logits is not None and lambda_dis > 0:
        loss = loss + lambda_dis * disagreement_loss(global_logits, local_logits)
    return loss


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher || p_student) at temperature 1, summed over classes, mean over the batch."""
    return F.kl_div(
        F.log_softmax(student_logits, dim=1), F.log_softmax(teacher_logits, dim=1),
        reduction="batchmean", log_target=True,
    )
