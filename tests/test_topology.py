"""Tests for common.algorithms.topology and mixing_spectrum: mixing-matrix invariants and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.algorithms.mixing_spectrum import (
    disagreement_factor,
    k_regular_ole_contraction,
    ole_beta_bound,
    ole_gossip_contraction,
    ole_gossip_growth,
    spectral_psi,
)
from common.algorithms.topology import (
    DIRECTED_TOPOLOGIES,
    MIXINGS,
    TOPOLOGIES,
    adjacency,
    check_topology,
    grid_shape,
    metropolis_hastings_weights,
    mixing_matrix,
    neighbours,
    renormalize_present,
    uniform_weights,
)

UNDIRECTED = [kind for kind in TOPOLOGIES if kind not in DIRECTED_TOPOLOGIES]


def _degrees(w: np.ndarray) -> np.ndarray:
    off_diagonal = (w > 0) & ~np.eye(w.shape[0], dtype=bool)
    return off_diagonal.sum(axis=1)


@pytest.mark.parametrize("kind", UNDIRECTED)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 16, 20, 33])
def test_mixing_matrix_invariants(kind: str, n: int) -> None:
    peers = min(3, max(n - 1, 1))
    if kind == "random" and n > 1 and n * peers % 2:
        peers -= 1  # a k-regular graph needs n * k even
    w = mixing_matrix(kind, n, peers=peers, seed=1, round_num=2)
    assert w.shape == (n, n)
    assert w.dtype == np.float64
    assert np.array_equal(w, w.T)
    assert np.all(w >= 0)
    assert np.all(np.diag(w) > 0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", UNDIRECTED)
def test_adjacency_is_symmetric_bool_without_self_loops(kind: str) -> None:
    adj = adjacency(kind, 12, peers=2, seed=3, round_num=4)
    assert adj.dtype == bool
    assert np.array_equal(adj, adj.T)
    assert not np.any(np.diag(adj))


@pytest.mark.parametrize("n", [3, 5, 16])
def test_ring_has_degree_two_and_thirds(n: int) -> None:
    w = mixing_matrix("ring", n)
    assert np.all(_degrees(w) == 2)
    assert np.allclose(w[w > 0], 1.0 / 3.0)
    assert neighbours(w, 0) == [1, n - 1]


def test_ring_small_n() -> None:
    np.testing.assert_array_equal(mixing_matrix("ring", 1), [[1.0]])
    np.testing.assert_allclose(mixing_matrix("ring", 2), [[0.5, 0.5], [0.5, 0.5]])


def test_grid_shape_is_most_square() -> None:
    assert grid_shape(20) == (4, 5)
    assert grid_shape(16) == (4, 4)
    assert grid_shape(6) == (2, 3)
    assert grid_shape(7) == (1, 7)
    assert grid_shape(1) == (1, 1)


def test_torus_4x5_has_degree_four() -> None:
    w = mixing_matrix("grid", 20)
    assert np.all(_degrees(w) == 4)
    # Node 0 = (row 0, col 0): right 1, left 4 (wrap), down 5, up 15 (wrap).
    assert neighbours(w, 0) == [1, 4, 5, 15]
    assert np.allclose(w[w > 0], 0.2)


def test_grid_dedupes_short_dimensions() -> None:
    # 2x3: up and down are the same node, so degree 3 instead of 4.
    assert np.all(_degrees(mixing_matrix("grid", 6)) == 3)
    # Prime n gives a 1 x n torus, i.e. a ring.
    np.testing.assert_array_equal(mixing_matrix("grid", 7), mixing_matrix("ring", 7))


def test_exponential_degree_for_16() -> None:
    w = mixing_matrix("exponential", 16)
    # Offsets +-1, +-2, +-4, and 8 (= -8 mod 16): 7 distinct peers.
    assert np.all(_degrees(w) == 7)
    assert neighbours(w, 0) == [1, 2, 4, 8, 12, 14, 15]
    assert np.allclose(w[w > 0], 1.0 / 8.0)


def test_full_is_dense_uniform() -> None:
    np.testing.assert_array_equal(mixing_matrix("full", 5), np.full((5, 5), 0.2))


def test_random_is_deterministic_per_seed_and_round() -> None:
    a = adjacency("random", 30, peers=3, seed=7, round_num=5)
    b = adjacency("random", 30, peers=3, seed=7, round_num=5)
    np.testing.assert_array_equal(a, b)
    next_round = adjacency("random", 30, peers=3, seed=7, round_num=6)
    other_seed = adjacency("random", 30, peers=3, seed=8, round_num=5)
    assert not np.array_equal(a, next_round)
    assert not np.array_equal(a, other_seed)


@pytest.mark.parametrize(("n", "k"), [(2, 1), (4, 1), (20, 4), (21, 4), (100, 10), (12, 7), (10, 8), (9, 8)])
def test_random_gives_every_node_exactly_k_neighbours_every_round(n: int, k: int) -> None:
    """The paper's "each client randomly selecting 10 neighbours": a k-regular graph per round (SPEC 4.5)."""
    graphs = []
    for round_num in range(1, 6):
        adj = adjacency("random", n, peers=k, seed=3, round_num=round_num)
        assert np.array_equal(adj, adj.T) and not np.any(np.diag(adj))
        assert np.all(adj.sum(axis=1) == k), (round_num, adj.sum(axis=1))
        w = mixing_matrix("random", n, peers=k, seed=3, round_num=round_num)
        assert np.all(_degrees(w) == k)
        assert np.array_equal(w, w.T)
        np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        graphs.append(adj)
    if k < n - 1:  # the complete graph (k = n - 1) is the only 9-regular graph on 10 nodes
        assert any(not np.array_equal(graphs[0], g) for g in graphs[1:])


def test_random_mixing_matrix_is_reproducible_from_seed_and_round() -> None:
    for mixing in MIXINGS:
        a = mixing_matrix("random", 100, peers=10, seed=5, round_num=17, mixing=mixing)
        b = mixing_matrix("random", 100, peers=10, seed=5, round_num=17, mixing=mixing)
        assert a.tobytes() == b.tobytes()
        assert not np.array_equal(a, mixing_matrix("random", 100, peers=10, seed=5, round_num=18, mixing=mixing))
        assert not np.array_equal(a, mixing_matrix("random", 100, peers=10, seed=6, round_num=17, mixing=mixing))


@pytest.mark.parametrize(("n", "k", "match"), [(5, 3, "odd"), (7, 1, "odd")])
def test_random_refuses_impossible_regular_graphs(n: int, k: int, match: str) -> None:
    for call in (lambda: mixing_matrix("random", n, peers=k), lambda: check_topology("random", n, k, "metropolis")):
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize(("n", "k"), [(6, 6), (4, 10), (3, 10)])
def test_random_with_peers_at_least_n_minus_1_is_the_full_graph(n: int, k: int) -> None:
    """The default peers = 10 on 10 or fewer nodes: every node talks to every other, as random-draws does."""
    check_topology("random", n, k, "metropolis")
    assert adjacency("random", n, peers=k, seed=0, round_num=1).sum() == n * (n - 1)
    np.testing.assert_allclose(mixing_matrix("random", n, peers=k, mixing="uniform"), np.full((n, n), 1.0 / n))


def test_random_draws_keeps_the_bidirectional_draws() -> None:
    """random-draws: every node draws k peers and links both ways, so degrees run from k to about 2k."""
    degrees = np.concatenate([adjacency("random-draws", 20, peers=4, seed=0, round_num=t).sum(axis=1)
                              for t in range(1, 41)])
    assert degrees.min() >= 4
    assert 6.5 < degrees.mean() < 7.7  # the measurement: 7.1 at 20 nodes and k = 4
    a = adjacency("random-draws", 30, peers=3, seed=7, round_num=5)
    np.testing.assert_array_equal(a, adjacency("random-draws", 30, peers=3, seed=7, round_num=5))
    assert adjacency("random-draws", 6, peers=10).sum() == 6 * 5  # k >= n - 1: complete


def test_uniform_weights_are_one_over_k_plus_one() -> None:
    w = mixing_matrix("random", 20, peers=4, seed=1, round_num=3, mixing="uniform")
    assert set(np.unique(w)) == {0.0, 0.2}
    np.testing.assert_array_equal(np.diag(w), np.full(20, 0.2))
    np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    # on a k-regular graph Metropolis-Hastings gives 1/(1 + max(k, k)) = 1/(k+1) too
    np.testing.assert_allclose(w, mixing_matrix("random", 20, peers=4, seed=1, round_num=3), rtol=0, atol=1e-15)
    np.testing.assert_allclose(mixing_matrix("ring", 5, mixing="uniform"), mixing_matrix("ring", 5), atol=1e-15)
    path = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=bool)
    with pytest.raises(ValueError, match="degrees range from 1 to 2"):
        uniform_weights(path)


def test_uniform_mixing_is_refused_where_degrees_differ() -> None:
    with pytest.raises(ValueError, match="random-draws"):
        check_topology("random-draws", 20, 4, "uniform")
    check_topology("random-draws", 20, 4, "metropolis")
    check_topology("random", 20, 4, "uniform")
    check_topology("grid", 20, 4, "uniform")  # a 4x5 torus: every node has 4 neighbours
    with pytest.raises(ValueError, match="unknown mixing"):
        check_topology("ring", 20, 4, "lazy")


def test_metropolis_hastings_path_of_three() -> None:
    path = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=bool)
    # Degrees (1, 2, 1): each edge weight 1/(1+2); self weight is the remainder.
    expected = np.array(
        [[2 / 3, 1 / 3, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 1 / 3, 2 / 3]]
    )
    w = metropolis_hastings_weights(path)
    np.testing.assert_allclose(w, expected, atol=1e-15)


def test_metropolis_hastings_rejects_asymmetric() -> None:
    with pytest.raises(ValueError, match="symmetric"):
        metropolis_hastings_weights(np.array([[0, 1], [0, 0]], dtype=bool))


def test_spectral_psi_hand_values_for_16_nodes() -> None:
    static = [kind for kind in TOPOLOGIES if not kind.startswith("random")]
    psi = {kind: spectral_psi(mixing_matrix(kind, 16)) for kind in static}
    # Circulant/torus eigenvalues: ring 1/3 + 2/3 cos(2pi/16);
    # 4x4 torus 1/5 + 2/5 (cos a + cos b) -> +-0.6;
    # exponential (1 + 2cos(2pi k/16) + 2cos(4pi k/16) + 2cos(8pi k/16) + cos(pi k))/8
    # peaks at k = 8 with 4/8.
    ring_psi = 1 / 3 + 2 / 3 * math.cos(math.pi / 8)
    assert psi["ring"] == pytest.approx(ring_psi, abs=1e-12)
    assert psi["grid"] == pytest.approx(0.6, abs=1e-12)
    assert psi["exponential"] == pytest.approx(0.5, abs=1e-12)
    assert psi["full"] == pytest.approx(0.0, abs=1e-12)
    assert psi["ring"] > psi["grid"] > psi["exponential"] > psi["full"]


def test_spectral_psi_edge_cases() -> None:
    assert spectral_psi(np.eye(1)) == 0.0
    # Disconnected graph: two consensus components, psi = 1.
    assert spectral_psi(np.eye(3)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="symmetric"):
        spectral_psi(np.array([[0.5, 0.5], [0.0, 1.0]]))


def test_renormalize_present_ring_of_four() -> None:
    w = mixing_matrix("ring", 4)
    present = np.array([True, True, True, False])
    expected = np.array(
        [
            [0.5, 0.5, 0.0, 0.0],  # lost neighbour 3: self and 1 go 1/3 -> 1/2
            [1 / 3, 1 / 3, 1 / 3, 0.0],  # neighbours 0 and 2 both present: unchanged
            [0.0, 0.5, 0.5, 0.0],  # lost neighbour 3
            [0.0, 0.0, 0.0, 1.0],  # absent node keeps its own model
        ]
    )
    np.testing.assert_allclose(renormalize_present(w, present), expected, atol=1e-15)


def test_renormalize_present_all_present_is_identity_operation() -> None:
    w = mixing_matrix("grid", 20)
    everyone = np.ones(20, dtype=bool)
    np.testing.assert_allclose(renormalize_present(w, everyone), w, atol=1e-15)


def test_renormalize_present_rejects_bad_mask() -> None:
    with pytest.raises(ValueError, match="present"):
        renormalize_present(np.eye(3), np.ones(4, dtype=bool))


def test_neighbours_excludes_self_and_checks_range() -> None:
    w = mixing_matrix("full", 4)
    assert neighbours(w, 2) == [0, 1, 3]
    with pytest.raises(ValueError, match="out of range"):
        neighbours(w, 4)


def test_unknown_kind_lists_known_kinds() -> None:
    with pytest.raises(ValueError) as info:
        mixing_matrix("star", 4)
    for kind in TOPOLOGIES:
        assert kind in str(info.value)


@pytest.mark.parametrize(
    ("num_nodes", "peers", "name"), [(0, 3, "num-nodes"), (4, 0, "peers")]
)
def test_invalid_sizes_name_the_parameter(
    num_nodes: int, peers: int, name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        mixing_matrix("ring", num_nodes, peers=peers)


@pytest.mark.parametrize("kind", ["random", "ring", "full"])
def test_ole_restart_is_gossip_with_the_over_relaxed_matrix(kind: str) -> None:
    """OledFL section III-C: x_i + beta (x_i - z_i) with x = W z is ((1+beta) W - beta I) z."""
    from common.algorithms.gossip import ole_start

    n, beta = 8, 0.7
    w = mixing_matrix(kind, n, peers=2, seed=3, round_num=5)
    z = np.random.default_rng(0).normal(size=(n, 6))
    x = w @ z
    starts = np.stack([ole_start({"p": x[i]}, {"p": z[i]}, beta)["p"] for i in range(n)])
    np.testing.assert_allclose(starts, ((1 + beta) * w - beta * np.eye(n)) @ z, atol=1e-12)


def test_ole_slows_gossip_on_a_well_connected_graph_and_speeds_up_the_ring_slightly() -> None:
    """lambda -> (1+beta) lambda - beta: the full graph's disagreement modes (lambda = 0) become -beta,
    the ring's slow mode lambda_2 moves away from 1 by the factor 1+beta (benchmarks/results/oledfl-investigation.md)."""
    n, beta = 20, 0.3

    def ole(w: np.ndarray) -> np.ndarray:
        return (1 + beta) * w - beta * np.eye(n)

    full = mixing_matrix("full", n)
    assert spectral_psi(full) == pytest.approx(0.0, abs=1e-12)
    assert spectral_psi(ole(full)) == pytest.approx(beta)
    ring = mixing_matrix("ring", n)
    lam2, lam2_ole = np.linalg.eigvalsh(ring)[-2], np.linalg.eigvalsh(ole(ring))[-2]
    assert 1 - lam2_ole == pytest.approx((1 + beta) * (1 - lam2))
    assert spectral_psi(ole(ring)) < spectral_psi(ring)  # beta 0.3 < (1 + lambda_min) / (1 - lambda_min) = 0.5


def test_ole_gossip_contraction_hand_values() -> None:
    """Ole's gossip maps lambda to (1+beta) lambda - beta; the contraction is the largest square on 1-perp."""
    full4 = mixing_matrix("full", 4)
    assert ole_gossip_contraction([full4], 0.5) == pytest.approx(0.25)  # lambda 0 -> -0.5
    ring4 = mixing_matrix("ring", 4)  # eigenvalues 1, 1/3, 1/3, -1/3
    assert ole_gossip_contraction([ring4], 0.0) == pytest.approx(1 / 9)
    assert ole_gossip_contraction([ring4], 0.5) == pytest.approx(1.0)  # -1/3 -> -1
    assert ole_gossip_contraction([ring4], 0.9) == pytest.approx((1.9 / 3 + 0.9) ** 2)
    # a fresh W each round: J (disagreement -> -beta e) or I (untouched) with equal odds
    assert ole_gossip_contraction([full4, np.eye(4)], 0.5) == pytest.approx((0.25 + 1.0) / 2)
    assert ole_gossip_contraction([np.ones((1, 1))], 0.9) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        ole_gossip_contraction([], 0.5)


def test_ole_beta_bound_hand_values() -> None:
    """beta <= (1 + lambda_min) / (1 - lambda_min): ring 1/2, full 1, a lone node 1."""
    assert ole_beta_bound(mixing_matrix("ring", 4)) == pytest.approx(0.5)
    assert ole_beta_bound(mixing_matrix("full", 5)) == pytest.approx(1.0)
    assert ole_beta_bound(np.ones((1, 1))) == 1.0
    grid = mixing_matrix("grid", 20)
    bound = ole_beta_bound(grid)
    assert ole_gossip_contraction([grid], bound) == pytest.approx(1.0)
    assert ole_gossip_contraction([grid], bound + 0.01) > 1.0


def test_oledfl_diagnostic_predicts_beta_one_over_gain_on_the_full_graph() -> None:
    """benchmarks/oledfl_jacobian.py: on W = J Ole's gossip factor is beta^2, so q^2 beta^2 = 1 at beta = 1/q."""
    from benchmarks.oledfl_jacobian import growth_factor, predicted_beta

    full = mixing_matrix("full", 10)
    contraction = lambda beta: ole_gossip_contraction([full], beta)  # noqa: E731
    assert predicted_beta(2.0, contraction) == pytest.approx(0.5, abs=1e-3)
    assert predicted_beta(1.25, contraction) == pytest.approx(0.8, abs=1e-3)
    assert predicted_beta(1.0, contraction) is None  # gossip alone never expands on the full graph
    assert growth_factor([1.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert growth_factor([0.5, 0.25]) == pytest.approx(0.5)
    assert growth_factor([1.0, float("nan")]) == float("inf")


def _matching(pairs: list[tuple[int, int]], n: int = 4) -> np.ndarray:
    adj = np.zeros((n, n), dtype=bool)
    for i, j in pairs:
        adj[i, j] = adj[j, i] = True
    return uniform_weights(adj)


def test_ole_contraction_of_a_random_graph_is_trace_over_n_minus_1_by_hand() -> None:
    """4 nodes, k = 1: the random 1-regular graph is one of 3 perfect matchings, W = (I + A)/2.

    On the disagreement space each matching's W has eigenvalues 1 (the two pairs opposite), 0, 0; Ole maps
    them to 1, -beta, -beta, so trace(P M^T M P) = 1 + 2 beta^2 for every matching, and the exact
    expectation over the three is (1 + 2 beta^2)/3 times the identity there. One sampled matching has a
    mode that does not shrink at all, so the top eigenvalue of a one-graph "average" says 1.
    """
    matchings = [_matching([(0, 1), (2, 3)]), _matching([(0, 2), (1, 3)]), _matching([(0, 3), (1, 2)])]
    for beta in (0.0, 0.5, 0.99):
        exact = (1 + 2 * beta**2) / 3
        # all three matchings: the sample average is the exact expectation, and both readings agree
        assert ole_gossip_contraction(matchings, beta) == pytest.approx(exact)
        assert ole_gossip_contraction(matchings, beta, exchangeable=True) == pytest.approx(exact)
        # one sampled matching: trace / (n-1) is already exact, the top eigenvalue is biased to 1
        assert ole_gossip_contraction(matchings[:1], beta, exchangeable=True) == pytest.approx(exact)
        assert ole_gossip_contraction(matchings[:1], beta) == pytest.approx(1.0)
        assert k_regular_ole_contraction(4, 1, beta) == pytest.approx(exact)
    assert ole_gossip_contraction(matchings[:1], 0.5, exchangeable=True) == pytest.approx(0.5)


def test_ole_contraction_on_the_papers_random_topology_stays_below_one() -> None:
    """100 nodes, k = 10: trace/(n-1) over sampled graphs matches the closed form, 0.982 at beta 0.99 (issue 35)."""
    ws = [mixing_matrix("random", 100, peers=10, seed=0, round_num=t) for t in range(1, 6)]
    for beta in (0.0, 0.5, 0.8, 0.99):
        estimate = ole_gossip_contraction(ws, beta, exchangeable=True)
        assert estimate == pytest.approx(k_regular_ole_contraction(100, 10, beta), abs=1e-12)
        assert estimate < 1.0
    assert k_regular_ole_contraction(100, 10, 0.99) == pytest.approx(0.98173, abs=1e-5)
    assert k_regular_ole_contraction(100, 10, 0.0) == pytest.approx((100 / 11 - 1) / 99)
    assert k_regular_ole_contraction(100, 10, 1.0) == pytest.approx(1.0)
    # the old reading, the top eigenvalue of a 5-graph average, claimed expansion
    assert ole_gossip_contraction(ws, 0.99) > 1.0


def test_random_pull_rows_sum_to_one_and_it_is_directed() -> None:
    """DisPFL's pull graph: node i averages itself and its k draws, 1/(k+1) each; W is row-stochastic only."""
    n, k = 12, 3
    w = mixing_matrix("random-pull", n, peers=k, seed=2, round_num=7, mixing="uniform")
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(_degrees(w) == k)
    assert np.allclose(w[w > 0], 1.0 / (k + 1))
    assert np.all(np.diag(w) == pytest.approx(1.0 / (k + 1)))
    assert not np.array_equal(w, w.T)
    assert not np.allclose(w.sum(axis=0), 1.0)  # some node is pulled by more than k others
    adj = adjacency("random-pull", n, peers=k, seed=2, round_num=7)
    assert not np.any(np.diag(adj)) and not np.array_equal(adj, adj.T)
    # the same draws as random-draws before it symmetrises them
    np.testing.assert_array_equal(adj | adj.T, adjacency("random-draws", n, peers=k, seed=2, round_num=7))
    np.testing.assert_array_equal(w, mixing_matrix("random-pull", n, peers=k, seed=2, round_num=7, mixing="uniform"))
    assert not np.array_equal(w, mixing_matrix("random-pull", n, peers=k, seed=2, round_num=8, mixing="uniform"))


def test_random_pull_refuses_metropolis_weights() -> None:
    with pytest.raises(ValueError, match="directed.*mixing = uniform"):
        mixing_matrix("random-pull", 8, peers=2)
    with pytest.raises(ValueError, match="directed"):
        check_topology("random-pull", 8, 2, "metropolis")
    check_topology("random-pull", 8, 2, "uniform")


def test_disagreement_factor_is_psi_on_symmetric_and_singular_value_on_directed() -> None:
    for kind in ("ring", "grid", "full"):
        w = mixing_matrix(kind, 16)
        assert disagreement_factor(w) == pytest.approx(spectral_psi(w), abs=1e-12)
    # a directed 2-node pull: node 0 averages itself and node 1, node 1 keeps its own model
    w = np.array([[0.5, 0.5], [0.0, 1.0]])
    # a disagreement (1, -1) becomes (0, -1), centred (0.5, -0.5): half the norm
    assert disagreement_factor(w) == pytest.approx(0.5)
    assert disagreement_factor(np.ones((1, 1))) == 0.0


def test_ole_gossip_growth_of_the_product_by_hand_and_on_the_papers_topology() -> None:
    """The measured counterpart: per-round factor of ||P M_T ... M_1 P||_F^2 / (n-1)."""
    full4 = mixing_matrix("full", 4)
    assert ole_gossip_growth([full4] * 5, 0.5) == pytest.approx(0.25)  # P M = -beta P every round
    # one matching kept for 2 rounds: disagreement eigenvalues 1, -beta, -beta -> (1 + 2 beta^4) / 3 after 2
    matching = _matching([(0, 1), (2, 3)])
    assert ole_gossip_growth([matching] * 2, 0.5) == pytest.approx(math.sqrt((1 + 2 * 0.5**4) / 3))
    assert ole_gossip_growth([matching], 0.5) == pytest.approx((1 + 2 * 0.25) / 3)  # one round: trace / (n-1)
    assert ole_gossip_growth([np.ones((1, 1))], 0.9) == 0.0
    # 100 nodes, k = 10, fresh graphs: below 1 at beta 0.99, a little under the mean-square factor 0.982
    ws = [mixing_matrix("random", 100, peers=10, seed=0, round_num=t) for t in range(1, 41)]
    growth = ole_gossip_growth(ws, 0.99)
    assert 0.95 < growth < k_regular_ole_contraction(100, 10, 0.99) < 1.0
