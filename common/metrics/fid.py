"""Fréchet distance between Gaussian fits of feature embeddings (FID).

FID scores a generator by fitting a Gaussian to feature embeddings of
generated and of real images and measuring the Fréchet (2-Wasserstein)
distance between the two fits:

    d^2 = ||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2}).

In federated evaluation no party holds all real images, so clients send only
sufficient statistics (sum f, sum f f^T, n); summing those across clients and
converting once gives exactly the mean and covariance of the pooled features.
The matrix-square-root numerics follow the reference pytorch-fid
implementation so scores are comparable with published numbers.

FID is biased at small sample counts (it falls as the count grows), so the
final model is scored with thousands of samples, and **KID** (Binkowski et al.,
2018: the unbiased squared MMD with the cubic polynomial kernel
`k(x, y) = (x.y / d + 1)^3`, averaged over random subsets) is reported next to
it: its estimate has no such bias, so KIDs of different sample counts compare.
torchmetrics' `KernelInceptionDistance` computes it on the features we pass
(its feature module is the identity: our extractor has already run).

**Mode coverage**: the histogram of the classes a classifier predicts for the
generated images; a generator that drops modes leaves classes (nearly) empty.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

# sqrtm of a product of PSD matrices is real in exact arithmetic; round-off
# leaves an imaginary part, and above this size it signals a real problem.
_MAX_IMAGINARY = 1e-3


@dataclass(frozen=True)
class GaussianStats:
    """Mean (d,), covariance (d, d) and sample count of a feature set."""

    mean: np.ndarray
    cov: np.ndarray
    count: int


def _as_features(features: np.ndarray) -> np.ndarray:
    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2:
        raise ValueError(
            f"features must be a 2-D (n, d) array, got shape {features.shape}"
        )
    return features


def _require_count(count: int) -> None:
    if count < 2:
        raise ValueError(f"need at least 2 samples for a covariance, got {count}")


def gaussian_stats(features: np.ndarray) -> GaussianStats:
    """Mean and unbiased (n-1) covariance of an (n, d) feature matrix."""
    features = _as_features(features)
    count = features.shape[0]
    _require_count(count)
    mean = features.mean(axis=0)
    centered = features - mean
    cov = centered.T @ centered / (count - 1)
    return GaussianStats(mean=mean, cov=cov, count=count)


def feature_sums(features: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(sum f, sum f f^T, n) in float64: additive across clients.

    An empty (0, d) chunk is allowed so a client with no data can still
    contribute a neutral element to the aggregate.
    """
    features = _as_features(features)
    return features.sum(axis=0), features.T @ features, features.shape[0]


def stats_from_sums(
    sum_f: np.ndarray, sum_ff: np.ndarray, count: int
) -> GaussianStats:
    """Mean and unbiased covariance from aggregated `feature_sums`.

    Uses cov = (sum f f^T - n mu mu^T) / (n - 1), which equals
    `gaussian_stats` of the pooled features up to round-off.
    """
    sum_f = np.asarray(sum_f, dtype=np.float64)
    sum_ff = np.asarray(sum_ff, dtype=np.float64)
    if sum_f.ndim != 1:
        raise ValueError(f"sum_f must be 1-D (d,), got shape {sum_f.shape}")
    dim = sum_f.shape[0]
    if sum_ff.shape != (dim, dim):
        raise ValueError(
            f"sum_ff has shape {sum_ff.shape}, expected ({dim}, {dim}) to match sum_f"
        )
    _require_count(count)
    mean = sum_f / count
    cov = (sum_ff - count * np.outer(mean, mean)) / (count - 1)
    # Summation order can leave sum_ff asymmetric in the last bits.
    cov = (cov + cov.T) / 2.0
    return GaussianStats(mean=mean, cov=cov, count=count)


def _check_compatible(a: GaussianStats, b: GaussianStats) -> int:
    mu1, mu2 = np.atleast_1d(a.mean), np.atleast_1d(b.mean)
    if mu1.ndim != 1 or mu1.shape != mu2.shape:
        raise ValueError(
            f"mean vectors have different or non-1-D shapes: {mu1.shape} vs {mu2.shape}"
        )
    dim = mu1.shape[0]
    for name, stats in (("first", a), ("second", b)):
        if np.shape(stats.cov) != (dim, dim):
            raise ValueError(
                f"{name} covariance has shape {np.shape(stats.cov)}, "
                f"expected ({dim}, {dim}) to match the means"
            )
    return dim


def _sqrtm_product(cov1: np.ndarray, cov2: np.ndarray, eps: float) -> np.ndarray:
    """(cov1 cov2)^{1/2}, regularised with eps*I if singular, imaginary part dropped."""
    # imported here: every ClientApp process imports this module for its feature sums, and
    # only the server's FID needs scipy (~0.3 s of each deployment message's start-up)
    from scipy import linalg

    covmean = linalg.sqrtm(cov1 @ cov2)
    if not np.isfinite(covmean).all():
        # Nearly singular covariances (e.g. fewer samples than dimensions)
        # can break the Schur-based sqrtm; a small ridge makes it well posed.
        # As in pytorch-fid the ridge enters only this term, not the traces,
        # so published scores stay comparable (the result is biased slightly low).
        offset = np.eye(cov1.shape[0]) * eps
        covmean = linalg.sqrtm((cov1 + offset) @ (cov2 + offset))
        if not np.isfinite(covmean).all():
            raise ValueError(
                f"matrix square root is not finite even with eps={eps} added"
            )
    if np.iscomplexobj(covmean):
        # Only the trace enters the distance, so only the diagonal matters.
        imaginary = np.max(np.abs(np.diagonal(covmean).imag))
        if imaginary > _MAX_IMAGINARY:
            raise ValueError(
                f"matrix square root has imaginary component {imaginary:.3g}"
            )
        covmean = covmean.real
    return covmean


def frechet_distance(a: GaussianStats, b: GaussianStats, eps: float = 1e-6) -> float:
    """Squared Fréchet distance between N(a.mean, a.cov) and N(b.mean, b.cov)."""
    _check_compatible(a, b)
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    mu1 = np.atleast_1d(np.asarray(a.mean, dtype=np.float64))
    mu2 = np.atleast_1d(np.asarray(b.mean, dtype=np.float64))
    cov1 = np.asarray(a.cov, dtype=np.float64)
    cov2 = np.asarray(b.cov, dtype=np.float64)
    diff = mu1 - mu2
    covmean = _sqrtm_product(cov1, cov2, eps)
    distance = diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * np.trace(covmean)
    # The true value is >= 0; a negative result is round-off on (near-)equal inputs.
    return max(float(distance), 0.0)


# ----- KID ------------------------------------------------------------------------------------
KID_SUBSETS = 100          # torchmetrics' default
KID_SUBSET_SIZE = 1000     # torchmetrics' default; smaller sets use all their samples


def kernel_inception_distance(fake: np.ndarray, real: np.ndarray, subsets: int = KID_SUBSETS,
                              subset_size: int = KID_SUBSET_SIZE, seed: int = 0) -> tuple[float, float]:
    """(mean, std over subsets) of KID between two (n, d) feature sets; torchmetrics' estimator, seeded.

    Each subset draws `min(subset_size, n_fake, n_real)` features of each set
    without replacement; KID is the mean of the subsets' unbiased MMD^2.
    """
    import torch
    from torch import nn
    from torchmetrics.image.kid import KernelInceptionDistance

    fake, real = _as_features(fake), _as_features(real)
    if fake.shape[1] != real.shape[1]:
        raise ValueError(f"feature sets of different widths: {fake.shape[1]} vs {real.shape[1]}")
    size = min(subset_size, fake.shape[0], real.shape[0])
    _require_count(size)
    with warnings.catch_warnings():  # "will save all extracted features": they are ours, already in memory
        warnings.simplefilter("ignore", UserWarning)
        metric = KernelInceptionDistance(feature=nn.Identity(), subsets=subsets, subset_size=size)
    # float32 as torchmetrics' Inception features are: half the time of float64, same digits that matter
    metric.update(torch.from_numpy(real.astype(np.float32)), real=True)
    metric.update(torch.from_numpy(fake.astype(np.float32)), real=False)
    with torch.random.fork_rng(devices=[]):  # its subsets come from torch's global generator
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return float(mean), float(std)


def unbiased_mmd2(x: np.ndarray, y: np.ndarray, degree: int = 3, coef: float = 1.0) -> float:
    """Unbiased MMD^2 of two equal-size sets under k(a, b) = (a.b / d + coef)^degree (one KID subset)."""
    x, y = _as_features(x), _as_features(y)
    m = x.shape[0]
    if y.shape[0] != m:
        raise ValueError(f"unbiased_mmd2 needs equal-size sets, got {m} and {y.shape[0]}")
    _require_count(m)
    d = x.shape[1]
    k_xx, k_yy, k_xy = ((a @ b.T / d + coef) ** degree for a, b in ((x, x), (y, y), (x, y)))
    off_diagonal = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (m * (m - 1))
    return float(off_diagonal - 2.0 * k_xy.sum() / m**2)


# ----- mode coverage -------------------------------------------------------------------------
def class_histogram(predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """Fraction of the samples predicted as each class (sums to 1; zeros for an empty set)."""
    counts = np.bincount(np.asarray(predicted, dtype=np.int64), minlength=num_classes)[:num_classes]
    total = counts.sum()
    return counts / total if total else counts.astype(np.float64)


def classes_covered(histogram: np.ndarray, min_share: float = 0.25) -> int:
    """Classes that get at least `min_share` of the uniform share 1/C of the samples."""
    histogram = np.asarray(histogram, dtype=np.float64)
    return int((histogram >= min_share / len(histogram)).sum())


def normalized_entropy(histogram: np.ndarray) -> float:
    """Entropy of the class histogram over log C: 1 for uniform classes, 0 for a single class."""
    p = np.asarray(histogram, dtype=np.float64)
    p = p[p > 0]
    if len(histogram) < 2 or p.size == 0:
        return 0.0
    return float(-(p * np.log(p)).sum() / np.log(len(histogram)))
