"""The node table: which nodes a run has, how nodes that join mid-run are added, and which a round samples.

A handshake (server_app/handshake.py) gives each node its partition id and example counts; without one the
grid's node ids are numbered in id order, and ids that appear later are added after the highest partition id,
so a node keeps its partition id (and its seeded draws) for the whole run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid


@dataclass(frozen=True)
class NodeInfo:
    """What the handshake learned about one node (counts are None for nodes known only by id)."""

    node_id: int
    partition_id: int
    num_train_examples: int | None = None
    num_test_examples: int | None = None
    name: str = ""  # node config `name` (partition = node: the site's label in logs and results)


def with_new_nodes(nodes: list[NodeInfo], node_ids: Iterable[int]) -> list[NodeInfo]:
    """`nodes` plus an entry for every id it lacks, numbered on from its highest partition id in node-id order.

    Entries of nodes that left stay: a node id is never renumbered, so a node keeps its partition id (and the
    seeded sampling its draws) for the whole run.
    """
    known = {n.node_id for n in nodes}
    start = max((n.partition_id for n in nodes), default=-1) + 1
    new = sorted(int(i) for i in node_ids if int(i) not in known)
    return [*nodes, *(NodeInfo(node_id=node_id, partition_id=start + k) for k, node_id in enumerate(new))]


def wait_for_nodes(grid: Grid, count: int, poll_interval: float = 1.0) -> list[int]:
    """The grid's node ids once at least `count` are connected (Flower's `min_available_nodes` wait)."""
    while len(node_ids := [int(i) for i in grid.get_node_ids()]) < count:
        log(INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).", len(node_ids), count)
        time.sleep(poll_interval)
    return node_ids


def sample_nodes(nodes: list[NodeInfo], fraction: float, seed: int, server_round: int) -> list[NodeInfo]:
    """n = max(floor(N * fraction), 1) nodes, drawn without replacement, seeded by (seed, round)."""
    ordered = sorted(nodes, key=lambda n: n.partition_id)
    # the epsilon keeps floor(100 * 0.29) at 29 despite binary rounding
    count = max(math.floor(len(ordered) * fraction + 1e-9), 1)
    if count >= len(ordered):
        return ordered
    rng = np.random.default_rng([seed, server_round, 1])
    chosen = np.sort(rng.choice(len(ordered), size=count, replace=False))
    return [ordered[i] for i in chosen]
