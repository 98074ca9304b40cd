"""Communication topologies and gossip mixing matrices for decentralized FL.

Decentralized algorithms (D-PSGD, DFedAvg, DFedSAM, OledFL) have no server:
every round node i replaces its model by a weighted average of its
neighbours' models, x_i = sum_j W_ij z_j.  Consensus (and the convergence
rates in those papers) needs W to be symmetric, doubly stochastic,
non-negative and to have self-loops; how fast the nodes agree is governed by
psi, the second largest eigenvalue modulus of W.  This module builds W for
the named topologies and adapts W to nodes that dropped out of a round
(psi and Ole's contraction are `common.algorithms.mixing_spectrum`).  Everything is a pure function of its arguments (the random
topologies are seeded by (seed, round)), so every node and the simulator
derive the same matrix without exchanging it.

`random` is the OledFL paper's "each client randomly selecting 10
neighbours": a fresh random k-regular graph every round (networkx's
Steger-Wormald sampler), so every node has exactly k neighbours.
`random-draws` is the project's earlier reading: each node draws k peers and
every draw is a bidirectional link, which gives each node between k and
about 2k neighbours (mean degree 7.1 at 20 nodes and k = 4).
`random-pull` is the graph of the code OledFL builds on (DisPFL's dpsgd):
each node draws k peers and *pulls* their models, averaging itself and them
with weight 1/(k+1) each. Nobody pushes back, so W is row-stochastic only:
neither symmetric nor doubly stochastic, and the network average can move in
a round. It is the one directed topology here and takes only uniform weights.

Weights: `metropolis` (Metropolis-Hastings, symmetric and doubly stochastic
for any graph) or `uniform` (1/(d+1) on the node and each of its d
neighbours, the DisPFL/DFedSAM code base's averaging). Uniform weights are
doubly stochastic only when every node has the same degree, so they are
refused for a graph that is not regular; on a d-regular graph Metropolis-
Hastings gives 1/(d+1) too, i.e. the two coincide on every topology where
both are defined.
"""

from __future__ import annotations

import math

import numpy as np

TOPOLOGIES: tuple[str, ...] = ("random", "random-draws", "random-pull", "ring", "grid", "exponential", "full")
RANDOM_TOPOLOGIES: tuple[str, ...] = ("random", "random-draws", "random-pull")
# Topologies whose W is row-stochastic only (i pulls from j without j pulling from i).
DIRECTED_TOPOLOGIES: tuple[str, ...] = ("random-pull",)
MIXINGS: tuple[str, ...] = ("metropolis", "uniform")


def _validate(kind: str, num_nodes: int, peers: int) -> None:
    if kind not in TOPOLOGIES:
        raise ValueError(
            f"unknown topology {kind!r}; known kinds: {', '.join(TOPOLOGIES)}"
        )
    if num_nodes < 1:
        raise ValueError(f"num-nodes must be >= 1, got {num_nodes}")
    if peers < 1:
        raise ValueError(f"peers must be >= 1, got {peers}")
    if kind == "random":
        check_regular_degree(num_nodes, peers)


def check_regular_degree(num_nodes: int, peers: int) -> None:
    """Raise ValueError unless a k-regular graph on n nodes exists for k = min(peers, n - 1): n * k even.

    peers >= n - 1 is the full graph (every node talks to every other), as
    `random-draws` treats it, so the default peers = 10 works on 10 or fewer
    nodes. A single node (n = 1) has nothing to mix with and is accepted.
    """
    if num_nodes == 1:
        return
    peers = min(peers, num_nodes - 1)
    if (num_nodes * peers) % 2:
        raise ValueError(
            f"no graph on {num_nodes} nodes gives every node exactly k = {peers} neighbours "
            f"(n * k = {num_nodes * peers} is odd: every link has two ends); use an even peers, "
            f"an even number of nodes, or topology random-draws"
        )


def _from_offsets(num_nodes: int, offsets: list[int]) -> np.ndarray:
    """Circulant graph linking i to i +/- each offset (mod n), symmetric."""
    adj = np.zeros((num_nodes, num_nodes), dtype=bool)
    nodes = np.arange(num_nodes)
    for offset in offsets:
        adj[nodes, (nodes + offset) % num_nodes] = True
        adj[nodes, (nodes - offset) % num_nodes] = True
    # Offsets that are multiples of n would wrap back onto the node itself.
    np.fill_diagonal(adj, False)
    return adj


def _ring(num_nodes: int) -> np.ndarray:
    # n = 2 collapses i+1 and i-1 into the single edge 0-1; n = 1 has no edge.
    return _from_offsets(num_nodes, [1])


def _exponential(num_nodes: int) -> np.ndarray:
    # 2**j < n exactly for j < bit_length(n - 1).
    offsets = [2**j for j in range((num_nodes - 1).bit_length())]
    return _from_offsets(num_nodes, offsets)


def grid_shape(num_nodes: int) -> tuple[int, int]:
    """(rows, cols) of the most square factorisation, rows <= cols."""
    rows = max(r for r in range(1, math.isqrt(num_nodes) + 1) if num_nodes % r == 0)
    return rows, num_nodes // rows


def _grid(num_nodes: int) -> np.ndarray:
    rows, cols = grid_shape(num_nodes)
    adj = np.zeros((num_nodes, num_nodes), dtype=bool)
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            for nr, nc in (
                ((r - 1) % rows, c),
                ((r + 1) % rows, c),
                (r, (c - 1) % cols),
                (r, (c + 1) % cols),
            ):
                adj[i, nr * cols + nc] = True
    # A dimension of size 1 wraps onto the node itself; size 2 makes the two
    # wrap directions hit the same node, which the boolean matrix dedupes.
    np.fill_diagonal(adj, False)
    return adj


def _check_seed(seed: int, round_num: int) -> None:
    if seed < 0 or round_num < 0:
        raise ValueError(
            f"seed and round must be >= 0, got seed={seed}, round={round_num}"
        )


def _random_regular(num_nodes: int, peers: int, seed: int, round_num: int) -> np.ndarray:
    """A random k-regular graph drawn from (seed, round): every node has exactly k neighbours."""
    _check_seed(seed, round_num)
    if num_nodes == 1:
        return np.zeros((1, 1), dtype=bool)
    # one 63-bit integer from (seed, round); networkx seeds Python's Mersenne Twister with it
    graph_seed = int(np.random.SeedSequence([seed, round_num]).generate_state(1, dtype=np.uint64)[0] >> 1)
    full = np.ones((num_nodes, num_nodes), dtype=bool)
    np.fill_diagonal(full, False)
    if peers >= num_nodes - 1:  # the full graph
        return full
    # Steger-Wormald pairs stubs and retries on collisions; for dense graphs draw the sparse complement
    dense = peers > (num_nodes - 1) // 2
    degree = num_nodes - 1 - peers if dense else peers
    import networkx as nx  # here, not at import: 1-2 s that `import fedsynth.strategies` need not pay

    graph = nx.random_regular_graph(degree, num_nodes, seed=graph_seed)
    adj = nx.to_numpy_array(graph, nodelist=range(num_nodes), dtype=bool)
    return full & ~adj if dense else adj


def _draws(num_nodes: int, peers: int, seed: int, round_num: int) -> np.ndarray:
    """Directed draws: row i marks the min(k, n-1) peers node i drew, uniformly from the others."""
    _check_seed(seed, round_num)
    rng = np.random.default_rng([seed, round_num])
    draws = min(peers, num_nodes - 1)
    adj = np.zeros((num_nodes, num_nodes), dtype=bool)
    for i in range(num_nodes):
        picks = rng.choice(num_nodes - 1, size=draws, replace=False)
        # Sample from the n-1 other nodes, then skip over i itself.
        adj[i, picks + (picks >= i)] = True
    return adj


def _random_draws(num_nodes: int, peers: int, seed: int, round_num: int) -> np.ndarray:
    """Every node draws min(k, n-1) peers; every draw is a bidirectional link (degree k to ~2k)."""
    adj = _draws(num_nodes, peers, seed, round_num)
    # Links are bidirectional: a node also talks to everyone who drew it.
    return adj | adj.T


def adjacency(
    kind: str,
    num_nodes: int,
    *,
    peers: int = 10,
    seed: int = 0,
    round_num: int = 0,
) -> np.ndarray:
    """Boolean (n, n) neighbour relation without self-loops; symmetric except for `random-pull`.

    `peers`, `seed` and `round_num` only affect the random kinds: `random` is a
    k-regular graph drawn per round (n * k must be even and k < n),
    `random-draws` lets every node draw min(peers, n-1) peers per round and
    links both ways, `random-pull` marks row i's draws only (i pulls from
    them). The others are static.
    """
    _validate(kind, num_nodes, peers)
    if kind == "random":
        return _random_regular(num_nodes, peers, seed, round_num)
    if kind == "random-draws":
        return _random_draws(num_nodes, peers, seed, round_num)
    if kind == "random-pull":
        return _draws(num_nodes, peers, seed, round_num)
    if kind == "ring":
        return _ring(num_nodes)
    if kind == "grid":
        return _grid(num_nodes)
    if kind == "exponential":
        return _exponential(num_nodes)
    full = np.ones((num_nodes, num_nodes), dtype=bool)
    np.fill_diagonal(full, False)
    return full


def _links_and_degrees(adj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A square symmetric adjacency without self-loops, and each node's degree; ValueError otherwise."""
    adj = np.asarray(adj).astype(bool)
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {adj.shape}")
    if not np.array_equal(adj, adj.T):
        raise ValueError("adjacency must be symmetric")
    adj = adj.copy()
    np.fill_diagonal(adj, False)
    return adj, adj.sum(axis=1)


def metropolis_hastings_weights(adj: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings mixing matrix for an undirected graph.

    W_ij = 1 / (1 + max(d_i, d_j)) for neighbours, W_ii = 1 - sum_{j!=i} W_ij.
    It needs only local degree information and is symmetric and doubly
    stochastic for any graph; W_ii >= 1/(1+d_i) > 0, so self-loops are kept.
    The diagonal of `adj` is ignored.
    """
    adj, degree = _links_and_degrees(adj)
    pair_max = np.maximum(degree[:, None], degree[None, :])
    w = np.where(adj, 1.0 / (1.0 + pair_max), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def uniform_weights(adj: np.ndarray) -> np.ndarray:
    """W = (I + A) / (d + 1) for a d-regular undirected graph: the node and each neighbour weigh 1/(d+1).

    Only a regular graph makes these weights symmetric and doubly stochastic,
    so any other graph is refused (use Metropolis-Hastings there).
    """
    adj, degree = _links_and_degrees(adj)
    if degree.min() != degree.max():
        raise ValueError(
            f"uniform mixing needs every node to have the same number of neighbours, but degrees range "
            f"from {degree.min()} to {degree.max()}; use mixing = metropolis for this topology"
        )
    return (adj + np.eye(adj.shape[0])) / (1.0 + degree[0])


def pull_weights(adj: np.ndarray) -> np.ndarray:
    """W = (I + A) / (1 + out-degree) row by row: node i averages itself and the nodes it pulls from.

    DisPFL's aggregation (each node weighs itself and each drawn peer
    equally). Every row sums to 1; the columns do not in general, because a
    node is pulled by a random number of others.
    """
    adj = np.asarray(adj).astype(bool).copy()
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {adj.shape}")
    np.fill_diagonal(adj, False)
    w = adj + np.eye(adj.shape[0])
    return w / w.sum(axis=1, keepdims=True)


def _check_directed_mixing(kind: str, mixing: str) -> None:
    if kind in DIRECTED_TOPOLOGIES and mixing != "uniform":
        raise ValueError(
            f"topology {kind} is directed (a node pulls from its draws, nobody pushes back), and "
            f"Metropolis-Hastings weights need an undirected graph; use mixing = uniform (DisPFL's 1/(k+1))"
        )


def mixing_matrix(
    kind: str,
    num_nodes: int,
    *,
    peers: int = 10,
    seed: int = 0,
    round_num: int = 0,
    mixing: str = "metropolis",
) -> np.ndarray:
    """float64 (n, n) mixing matrix W for a topology; deterministic in (kind, n, peers, seed, round, mixing)."""
    _validate(kind, num_nodes, peers)
    if mixing not in MIXINGS:
        raise ValueError(f"unknown mixing {mixing!r}; one of {', '.join(MIXINGS)}")
    _check_directed_mixing(kind, mixing)
    if kind in DIRECTED_TOPOLOGIES:
        return pull_weights(adjacency(kind, num_nodes, peers=peers, seed=seed, round_num=round_num))
    if kind == "full":
        # Exact uniform averaging (MH and uniform weights give the same up to round-off).
        return np.full((num_nodes, num_nodes), 1.0 / num_nodes)
    adj = adjacency(kind, num_nodes, peers=peers, seed=seed, round_num=round_num)
    if mixing == "uniform":
        return uniform_weights(adj)
    return metropolis_hastings_weights(adj)


def check_topology(kind: str, num_nodes: int, peers: int, mixing: str) -> None:
    """Raise ValueError, naming the problem, when (kind, n, peers, mixing) cannot give a mixing matrix.

    Checks what `mixing_matrix` would refuse in some round, before the first
    round: a k-regular graph that cannot exist, and uniform weights on a
    topology whose nodes differ in degree (random-draws; a static topology is
    checked on its one graph).
    """
    _validate(kind, num_nodes, peers)
    if mixing not in MIXINGS:
        raise ValueError(f"unknown mixing {mixing!r}; one of {', '.join(MIXINGS)}")
    _check_directed_mixing(kind, mixing)
    if mixing == "uniform" and kind == "random-draws" and num_nodes > 1 and peers < num_nodes - 1:
        raise ValueError(
            "uniform mixing needs every node to have the same number of neighbours, which random-draws "
            "does not give (degrees k to ~2k); use topology random (k-regular) or mixing = metropolis"
        )
    if mixing == "uniform" and kind not in RANDOM_TOPOLOGIES:
        uniform_weights(adjacency(kind, num_nodes, peers=peers))


def renormalize_present(w: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Mixing matrix restricted to the nodes that took part this round.

    Absent nodes (failed or timed out) sent no model, so their columns are
    zeroed and every present row is rescaled to sum to 1: each present node
    averages only the models it actually received, in the original relative
    proportions.  Absent rows become identity rows, i.e. an absent node keeps
    its own model unchanged.  The result is row-stochastic but generally not
    symmetric or column-stochastic, so the network-wide average can drift in
    a round with dropouts; we accept that rather than inflate self-weights,
    because it keeps every node's update a plain weighted average of the
    models it got.  A present row whose mass is entirely on absent nodes
    (impossible while W_ii > 0) also falls back to identity.
    """
    w = np.asarray(w, dtype=np.float64)
    present = np.asarray(present, dtype=bool)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"mixing matrix must be square, got shape {w.shape}")
    if present.shape != (w.shape[0],):
        raise ValueError(
            f"present mask has shape {present.shape}, expected ({w.shape[0]},)"
        )
    kept = w * present[None, :]
    row_mass = kept.sum(axis=1)
    usable = present & (row_mass > 0)
    out = np.eye(w.shape[0])
    out[usable] = kept[usable] / row_mass[usable, None]
    return out


def neighbours(w: np.ndarray, i: int) -> list[int]:
    """Nodes j != i that node i mixes with (W_ij > 0), ascending."""
    w = np.asarray(w)
    if not 0 <= i < w.shape[0]:
        raise ValueError(f"node index {i} out of range for {w.shape[0]} nodes")
    return [int(j) for j in np.flatnonzero(w[i] > 0) if j != i]
