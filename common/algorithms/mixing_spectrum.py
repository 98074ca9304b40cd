"""The spectrum of a gossip mixing matrix W: how fast the nodes agree, and how OledFL's restart changes that.

psi, the second largest eigenvalue modulus of a symmetric W (`spectral_psi`),
governs how fast plain gossip brings the nodes to consensus; a directed W
(`random-pull`) is measured by its worst one-round factor instead
(`disagreement_factor`). OledFL's restart turns W into (1+beta) W - beta I,
whose mean-square contraction (`ole_gossip_contraction`, measured by
`ole_gossip_growth`, exact on k-regular graphs by `k_regular_ole_contraction`)
tells whether a beta pushes the nodes apart (`ole_beta_bound` for a fixed W).
The matrices are `common.algorithms.topology`'s; every function is pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Tolerance for the symmetry checks on caller-supplied matrices.
_SYMMETRY_ATOL = 1e-12


def _check_symmetric(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"mixing matrix must be square, got shape {w.shape}")
    if not np.allclose(w, w.T, rtol=0.0, atol=_SYMMETRY_ATOL):
        raise ValueError("mixing matrix must be symmetric")
    return w


def spectral_psi(w: np.ndarray) -> float:
    """Second largest eigenvalue modulus of a symmetric stochastic W.

    psi = max(|lambda_2|, |lambda_n|) = 1 - spectral gap; psi < 1 iff the
    graph is connected and gossip converges, smaller means faster consensus.
    The largest eigenvalue (1, for the all-ones vector) is excluded.
    """
    w = _check_symmetric(w)
    if w.shape[0] == 1:
        return 0.0
    eigenvalues = np.linalg.eigvalsh(w)  # ascending; the last one is 1
    return float(max(abs(eigenvalues[-2]), abs(eigenvalues[0])))


def disagreement_factor(w: np.ndarray) -> float:
    """The largest factor ||P W e|| / ||e|| by which one round can shrink a disagreement e (mean removed).

    P = I - J removes the mean. For a symmetric doubly stochastic W this is
    psi (`spectral_psi`); for a directed, row-stochastic W (`random-pull`),
    where eigenvalues say little about one round, it is the largest singular
    value of P W P, the worst case over disagreement vectors.
    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"mixing matrix must be square, got shape {w.shape}")
    n = w.shape[0]
    if n == 1:
        return 0.0
    projector = np.eye(n) - np.full((n, n), 1.0 / n)
    return float(np.linalg.norm(projector @ w @ projector, 2))


def _disagreement_projector(ws: Sequence[np.ndarray]) -> np.ndarray | None:
    """I - 11^T/n, the projector onto the disagreement subspace of the rounds' n nodes; None when n = 1."""
    if not ws:
        raise ValueError("need at least one mixing matrix")
    n = ws[0].shape[0]
    if n == 1:
        return None
    return np.eye(n) - np.full((n, n), 1.0 / n)


def ole_gossip_contraction(ws: Sequence[np.ndarray], beta: float, *, exchangeable: bool = False) -> float:
    """Mean-square factor by which OledFL's restart-and-mix shrinks the nodes' disagreement per round.

    Ole's restart x_i + beta (x_i - z_i) with x = W z is gossip with
    M = (1+beta) W - beta I (OledFL section III-C), which maps each eigenvalue
    lambda of W to (1+beta) lambda - beta.  A disagreement vector e (mean
    removed by P = I - J) becomes P M e, so E||P M e||^2 = e^T S e with
    S = P E[M^T P M] P, estimated by averaging over `ws`.  beta = 0 is plain
    gossip; a value above 1 means the restarts alone push the nodes apart
    faster than mixing pulls them together.

    Static topology (one W, `exchangeable` False): the worst mode, the
    largest eigenvalue of S: the same W acts every round, so that mode is hit
    every round.

    Random topology drawn afresh each round (`exchangeable` True: `random`,
    `random-draws`, `random-pull`): relabelling the nodes does not change the
    distribution of W, so the true S commutes with every permutation and is
    c P, a multiple of the identity on the (n-1)-dimensional disagreement
    space, c = trace(S) / (n - 1).  Every disagreement vector shrinks by c in
    expectation, and over independent rounds E||e_T||^2 = c^T ||e_0||^2.  The
    top eigenvalue of a *finite* average over sampled graphs is biased upward
    (100 nodes, k = 10, beta = 0.99: 1.42 from 20 graphs, 1.275 from 40, 1.073 from 400,
    while c = 0.982), so it must not be used there; trace / (n-1) is an
    unbiased estimate, and exact from one graph on k-regular graphs with
    uniform weights (`k_regular_ole_contraction`).
    """
    projector = _disagreement_projector(ws)
    if projector is None:
        return 0.0
    n = projector.shape[0]
    second_moment = np.zeros((n, n))
    for w in ws:
        m = projector @ ((1 + beta) * np.asarray(w, dtype=np.float64) - beta * np.eye(n))
        second_moment += m.T @ m
    second_moment = projector @ (second_moment / len(ws)) @ projector
    if exchangeable:
        return float(np.trace(second_moment) / (n - 1))
    return float(np.linalg.eigvalsh(second_moment)[-1])


def ole_gossip_growth(ws: Sequence[np.ndarray], beta: float) -> float:
    """Measured per-round mean-square factor of Ole's gossip over the rounds `ws`, applied in order.

    The product Pi = P M_T ... M_1 P (M_t = (1+beta) W_t - beta I) maps a
    disagreement vector to its value after T rounds; ||Pi||_F^2 / (n-1) is
    the mean of ||Pi e||^2 over an orthonormal basis of disagreement vectors,
    and its T-th root the factor per round. Over independent random rounds
    its expectation is c^T with c = `ole_gossip_contraction(...,
    exchangeable=True)`; one long realisation typically grows a little slower
    (Jensen; 100 nodes, k = 10, 400 rounds: 0.972 at beta 0.99 against c = 0.982). For
    a static W it tends to the worst mode's factor. Renormalised every round,
    so long products neither overflow nor underflow.
    """
    projector = _disagreement_projector(ws)
    if projector is None:
        return 0.0
    n = projector.shape[0]
    product = projector.copy()
    log_total = 0.0
    for w in ws:
        product = projector @ ((1 + beta) * np.asarray(w, dtype=np.float64) - beta * np.eye(n)) @ product
        square = float(np.sum(product**2)) / (n - 1)
        if square == 0.0:
            return 0.0
        log_total += math.log(square)
        product /= math.sqrt(square)
    return math.exp(log_total / len(ws))


def k_regular_ole_contraction(num_nodes: int, peers: int, beta: float) -> float:
    """Exact E||P M e||^2 / ||e||^2 of Ole's gossip on any k-regular graph with weights 1/(k+1).

    W = (I + A)/(k+1) has trace(W) = trace(W^2) = n/(k+1) whatever the graph,
    so trace(M^T M) = (1-beta^2) n/(k+1) + beta^2 n; removing the mean mode
    (M 1 = 1) and dividing by the n-1 disagreement dimensions gives c. It is
    below 1 for every beta < 1 and k >= 1, and equals 1 at beta = 1: on
    `random` Ole's gossip alone never expands disagreement in mean square; it
    slows its contraction (100 nodes, k = 10: 0.082 at beta 0, 0.31 / 0.67 /
    0.98 at 0.5 / 0.8 / 0.99).
    """
    if num_nodes < 2:
        return 0.0
    k = min(peers, num_nodes - 1)
    trace = (1 - beta**2) * num_nodes / (k + 1) + beta**2 * num_nodes
    return float((trace - 1.0) / (num_nodes - 1))


def ole_beta_bound(w: np.ndarray) -> float:
    """Largest beta for which Ole's gossip (1+beta) W - beta I expands no disagreement mode of a fixed W.

    |(1+beta) lambda - beta| <= 1 for every eigenvalue lambda of W holds
    iff beta <= (1 + lambda_min) / (1 - lambda_min): a W with a negative
    eigenvalue (ring: -1/3, bound 1/2) caps beta, a positive semi-definite W
    (full: bound 1) does not.
    """
    w = _check_symmetric(w)
    lambda_min = float(np.linalg.eigvalsh(w)[0])
    if lambda_min >= 1.0:  # one node: nothing to disagree about
        return 1.0
    return min(1.0, (1 + lambda_min) / (1 - lambda_min))
