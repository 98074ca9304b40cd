"""Tests for common.metrics.fid: Gaussian statistics, sufficient-statistic pooling, FID."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.metrics.fid import (
    GaussianStats,
    class_histogram,
    classes_covered,
    feature_sums,
    kernel_inception_distance,
    normalized_entropy,
    unbiased_mmd2,
    frechet_distance,
    gaussian_stats,
    stats_from_sums,
)


def _diag_stats(mean: list[float], variances: list[float]) -> GaussianStats:
    return GaussianStats(mean=np.array(mean), cov=np.diag(variances), count=100)


def _random_spd(rng: np.random.Generator, dim: int) -> np.ndarray:
    factor = rng.normal(size=(dim, dim))
    return factor @ factor.T + 0.1 * np.eye(dim)


def test_gaussian_stats_hand_example() -> None:
    features = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 4.0]])
    stats = gaussian_stats(features)
    np.testing.assert_allclose(stats.mean, [3.0, 4.0])
    # Deviations (-2,-2), (0,2), (2,0); divide by n-1 = 2.
    np.testing.assert_allclose(stats.cov, [[4.0, 2.0], [2.0, 4.0]])
    assert stats.count == 3


def test_self_distance_is_zero() -> None:
    rng = np.random.default_rng(0)
    stats = gaussian_stats(rng.normal(size=(500, 16)) @ rng.normal(size=(16, 16)))
    distance = frechet_distance(stats, stats)
    assert 0.0 <= distance < 1e-6 * np.trace(stats.cov)


def test_diagonal_closed_form() -> None:
    a = _diag_stats([1.0, 2.0, 3.0], [4.0, 1.0, 9.0])
    b = _diag_stats([0.0, 0.0, 1.0], [1.0, 4.0, 4.0])
    # Means: 1 + 4 + 4 = 9.  Covariances: sum_k s1 + s2 - 2 sqrt(s1 s2)
    # = (4+1-4) + (1+4-4) + (9+4-12) = 3.
    assert frechet_distance(a, b) == pytest.approx(12.0, abs=1e-12)
    assert frechet_distance(b, a) == pytest.approx(12.0, abs=1e-12)


def test_two_by_two_non_diagonal_hand_value() -> None:
    a = GaussianStats(mean=np.zeros(2), cov=np.eye(2), count=10)
    cov2 = np.array([[2.0, 1.0], [1.0, 2.0]])
    b = GaussianStats(mean=np.zeros(2), cov=cov2, count=10)
    # Eigenvalues of S2 are 3 and 1, so Tr(S2^{1/2}) = sqrt(3) + 1:
    # 2 + 4 - 2 (sqrt(3) + 1) = 4 - 2 sqrt(3).
    assert frechet_distance(a, b) == pytest.approx(4 - 2 * math.sqrt(3), abs=1e-12)


def test_non_diagonal_matches_eigendecomposition() -> None:
    rng = np.random.default_rng(1)
    dim = 6
    cov1, cov2 = _random_spd(rng, dim), _random_spd(rng, dim)
    mu1, mu2 = rng.normal(size=dim), rng.normal(size=dim)
    # Tr((S1 S2)^{1/2}) = Tr((S1^{1/2} S2 S1^{1/2})^{1/2}), and the inner
    # matrix is symmetric PSD, so it reduces to a sum of sqrt-eigenvalues.
    values, vectors = np.linalg.eigh(cov1)
    root1 = vectors @ np.diag(np.sqrt(values)) @ vectors.T
    inner = np.linalg.eigvalsh(root1 @ cov2 @ root1)
    expected = (
        np.sum((mu1 - mu2) ** 2)
        + np.trace(cov1)
        + np.trace(cov2)
        - 2.0 * np.sum(np.sqrt(np.clip(inner, 0.0, None)))
    )
    a = GaussianStats(mean=mu1, cov=cov1, count=50)
    b = GaussianStats(mean=mu2, cov=cov2, count=50)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-9)


def test_pooled_sums_equal_concatenated_stats() -> None:
    rng = np.random.default_rng(2)
    # Offset means make the sum-of-squares route cancel, as real features do.
    chunk_a = rng.normal(loc=5.0, size=(37, 8))
    chunk_b = rng.normal(loc=-2.0, scale=3.0, size=(61, 8))
    empty = np.zeros((0, 8))
    parts = [feature_sums(chunk) for chunk in (chunk_a, chunk_b, empty)]
    sum_f = sum(p[0] for p in parts)
    sum_ff = sum(p[1] for p in parts)
    count = sum(p[2] for p in parts)
    pooled = stats_from_sums(sum_f, sum_ff, count)
    direct = gaussian_stats(np.concatenate([chunk_a, chunk_b]))
    assert pooled.count == direct.count == 98
    np.testing.assert_allclose(pooled.mean, direct.mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(pooled.cov, direct.cov, rtol=0, atol=1e-10)


def test_fid_against_the_clients_sums_equals_fid_against_their_pooled_features() -> None:
    """Issue 33: a server without images scores against the nodes' summed statistics; the FID is the one
    against the pooled features, to float tolerance (three clients of different sizes, one empty)."""
    rng = np.random.default_rng(5)
    clients = [rng.normal(loc=3.0, size=(40, 6)), rng.normal(loc=-1.0, scale=2.0, size=(25, 6)), np.zeros((0, 6)),
               rng.normal(size=(9, 6)) @ rng.normal(size=(6, 6))]
    generated = gaussian_stats(rng.normal(loc=0.5, scale=1.5, size=(50, 6)))
    sums = [feature_sums(chunk) for chunk in clients]
    from_sums = stats_from_sums(sum(p[0] for p in sums), sum(p[1] for p in sums), sum(p[2] for p in sums))
    pooled = gaussian_stats(np.concatenate(clients))
    distance = frechet_distance(generated, pooled)
    assert distance > 1.0  # a real difference, not two near-zero numbers
    assert frechet_distance(generated, from_sums) == pytest.approx(distance, rel=1e-9)


def test_feature_sums_hand_example() -> None:
    sum_f, sum_ff, count = feature_sums(np.array([[1, 2], [3, 4]]))
    assert sum_f.dtype == sum_ff.dtype == np.float64
    np.testing.assert_array_equal(sum_f, [4.0, 6.0])
    np.testing.assert_array_equal(sum_ff, [[10.0, 14.0], [14.0, 20.0]])
    assert count == 2


def test_shifted_standard_normals_give_nine_per_dimension() -> None:
    rng = np.random.default_rng(3)
    dim, n = 4, 20_000
    a = gaussian_stats(rng.normal(size=(n, dim)))
    b = gaussian_stats(rng.normal(loc=3.0, size=(n, dim)))
    assert frechet_distance(a, b) == pytest.approx(9.0 * dim, rel=0.02)


def test_tiny_imaginary_part_is_dropped() -> None:
    # A round-off-sized negative eigenvalue makes sqrtm complex (~1e-5 i).
    a = _diag_stats([0.0, 0.0], [1.0, -1e-10])
    b = _diag_stats([0.0, 0.0], [1.0, 1.0])
    assert frechet_distance(a, b) == pytest.approx(1.0, abs=1e-9)


def test_large_imaginary_part_raises() -> None:
    a = _diag_stats([0.0, 0.0], [1.0, -1.0])
    b = _diag_stats([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="imaginary"):
        frechet_distance(a, b)


def test_non_finite_sqrtm_retries_with_eps(monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy import linalg

    real_sqrtm = linalg.sqrtm
    seen: list[np.ndarray] = []

    def flaky_sqrtm(matrix: np.ndarray) -> np.ndarray:
        seen.append(matrix)
        if len(seen) == 1:
            return np.full_like(matrix, np.nan)
        return real_sqrtm(matrix)

    monkeypatch.setattr(linalg, "sqrtm", flaky_sqrtm)
    a = _diag_stats([0.0, 0.0], [4.0, 1.0])
    b = _diag_stats([0.0, 0.0], [1.0, 4.0])
    distance = frechet_distance(a, b, eps=0.01)
    np.testing.assert_allclose(seen[1], np.diag([4.01 * 1.01, 1.01 * 4.01]))
    # As in pytorch-fid, only the square-root term is regularised; the traces
    # use the original covariances: 5 + 5 - 2 * 2 * sqrt(4.01 * 1.01).
    expected = 10.0 - 4.0 * math.sqrt(4.01 * 1.01)
    assert distance == pytest.approx(expected, abs=1e-12)


# Fewer samples than dimensions: both covariances are singular, which scipy
# may flag with a LinAlgWarning; the distance must still come out usable.
@pytest.mark.filterwarnings("ignore::scipy.linalg.LinAlgWarning")
def test_rank_deficient_covariances_give_finite_distance() -> None:
    rng = np.random.default_rng(4)
    a = gaussian_stats(rng.normal(size=(3, 10)))
    b = gaussian_stats(rng.normal(size=(4, 10)))
    distance = frechet_distance(a, b)
    assert math.isfinite(distance) and distance >= 0.0
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)


def test_gaussian_stats_validates_input() -> None:
    with pytest.raises(ValueError, match="2-D"):
        gaussian_stats(np.zeros(5))
    with pytest.raises(ValueError, match="at least 2 samples"):
        gaussian_stats(np.zeros((1, 3)))


def test_stats_from_sums_validates_shapes() -> None:
    with pytest.raises(ValueError, match="sum_ff"):
        stats_from_sums(np.zeros(3), np.zeros((2, 2)), 5)
    with pytest.raises(ValueError, match="sum_f"):
        stats_from_sums(np.zeros((3, 3)), np.zeros((3, 3)), 5)
    with pytest.raises(ValueError, match="at least 2 samples"):
        stats_from_sums(np.zeros(3), np.zeros((3, 3)), 1)


def test_frechet_distance_validates_shapes() -> None:
    a = _diag_stats([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="mean"):
        frechet_distance(a, _diag_stats([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]))
    bad_cov = GaussianStats(mean=np.zeros(2), cov=np.eye(3), count=5)
    with pytest.raises(ValueError, match="second covariance"):
        frechet_distance(a, bad_cov)


# ----- KID ------------------------------------------------------------------------------------


def test_unbiased_mmd2_hand_example() -> None:
    # d = 1, degree 1, coef 0: k(a, b) = a b. x = (1, 2), y = (0, 1).
    # k_xx off-diagonal: 2 * (1*2) = 4; k_yy off-diagonal: 2 * 0 = 0; over m(m-1) = 2 -> 2.
    # k_xy sum: (1 + 2) * (0 + 1) = 3; 2 * 3 / m^2 = 1.5. MMD^2 = 2 - 1.5 = 0.5.
    x, y = np.array([[1.0], [2.0]]), np.array([[0.0], [1.0]])
    assert unbiased_mmd2(x, y, degree=1, coef=0.0) == pytest.approx(0.5)
    # the default cubic kernel (a b + 1)^3: k_xx off 27, k_yy off 1, k_xy 1, 8, 1, 27 -> (54 + 2)/2 - 2*37/4
    assert unbiased_mmd2(x, y) == pytest.approx(28.0 - 18.5)


def test_kid_is_torchmetrics_estimator_on_our_features() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(200, 8)), rng.normal(0.3, 1.0, size=(200, 8))
    # one subset holding every sample: KID is the unbiased MMD^2 of the two sets
    mean, std = kernel_inception_distance(a, b, subsets=3, subset_size=200)
    assert mean == pytest.approx(unbiased_mmd2(a, b), rel=1e-5) and std == pytest.approx(0.0, abs=1e-6)
    assert kernel_inception_distance(a, b, seed=1) == kernel_inception_distance(a, b, seed=1)  # seeded subsets


def test_kid_of_a_set_against_itself_is_near_zero_and_a_shift_makes_it_larger() -> None:
    rng = np.random.default_rng(1)
    features = rng.normal(size=(2000, 32))

    def kid(a: np.ndarray, b: np.ndarray) -> float:
        return kernel_inception_distance(a, b, subsets=30, subset_size=500)[0]

    same, fresh = kid(features, features), kid(features, rng.normal(size=(2000, 32)))
    shifted, far = kid(features, features + 0.3), kid(features, features + 1.0)
    # a subset of a set against a subset of itself shares samples: slightly negative, within a few % of a 0.3 shift
    assert abs(same) < 0.03 * shifted and abs(fresh) < 0.03 * shifted
    assert 0 < shifted < far


def test_kid_refuses_mismatched_features() -> None:
    with pytest.raises(ValueError, match="widths"):
        kernel_inception_distance(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(ValueError, match="equal-size"):
        unbiased_mmd2(np.zeros((5, 3)), np.zeros((4, 3)))


# ----- mode coverage ----------------------------------------------------------------------


def test_class_histogram_coverage_and_entropy_by_hand() -> None:
    histogram = class_histogram(np.array([0, 0, 1, 3]), 4)
    np.testing.assert_allclose(histogram, [0.5, 0.25, 0.0, 0.25])
    assert classes_covered(histogram) == 3  # class 2 gets nothing
    assert classes_covered(np.array([0.9, 0.05, 0.05]), min_share=0.25) == 1  # 0.05 < 0.25 / 3
    # entropy of (1/2, 1/4, 1/4) over log 4 = 1.5 bits / 2 bits
    assert normalized_entropy(histogram) == pytest.approx(0.75)
    assert normalized_entropy(np.full(10, 0.1)) == pytest.approx(1.0)
    assert normalized_entropy(np.array([1.0, 0.0, 0.0])) == 0.0
    np.testing.assert_array_equal(class_histogram(np.array([], dtype=np.int64), 3), [0.0, 0.0, 0.0])
