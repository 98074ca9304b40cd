"""The node table: which nodes a run has, how nodes that join mid-run are added, and which a round samples.

A handshake (server_app/handshake.py) gives each node its partition id and example counts; without one the
grid's node ids are numbered in id order, and ids that appear later are added after the highest partition id,
so a node keeps its partition id (and its seeded draws) for the whole run.

`NodeTable` is a strategy's table and its join rules: the entries, the node ids that take no part (refused at
the handshake, or new ids that were refused or did not answer), and, for a handshake's table, the question put
to node ids that appear mid-run (`rejoin`: a node that restarted under a new id takes its old entry, a site
that joins late gets its own unless the algorithm says why it cannot take it). fedsynth's app and its results
folder (server_app/recorder.py) read the table, never the strategy's own attributes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from logging import INFO, WARNING

import numpy as np
from flwr.app import Message
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


# The question for node ids that appear mid-run in a handshake's table (server_app/handshake.py `joined_nodes`):
# (grid, the new ids, the table, the ids of its nodes that are gone) -> {new id: the entry it takes over, or its
# own new entry}; ids it leaves out take no part.
Rejoin = Callable[[Grid, list[int], list[NodeInfo], set[int]], dict[int, NodeInfo]]


class NodeTable:
    """A strategy's nodes, in partition order, and which node ids take part.

    Parameters
    ----------
    nodes : list[NodeInfo] | None
        A handshake's table; None (or empty) starts empty, and `grow` adds the grid's node ids.
    late_join_refusal : Callable[[], str | None] (default: always None)
        The algorithm's answer to a site that joins a handshake's table mid-run: why it cannot take part, or None.
    """

    def __init__(self, nodes: list[NodeInfo] | None = None,
                 late_join_refusal: Callable[[], str | None] = lambda: None) -> None:
        self.nodes: list[NodeInfo] = sorted(nodes or [], key=lambda n: n.partition_id)
        self.from_handshake = bool(nodes)  # counts and partition ids to check replies against
        self.late_join_refusal = late_join_refusal
        self.rejoin: Rejoin | None = None  # None: new ids in a handshake's table take no part (the app sets it)
        self.refused: set[int] = set()     # node ids that take no part and are not asked again

    def of(self, node_id: int) -> NodeInfo | None:
        """The entry of a node id, or None."""
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def partition_of(self, reply: Message) -> int:
        """The partition of the node that sent `reply`: its entry's, else the reply's own "partition-id" metric."""
        node = self.of(reply.metadata.src_node_id)
        if node is not None:
            return node.partition_id
        return int(reply.content.metric_records["metrics"].get("partition-id", 0))

    def label(self, index: int) -> str:
        """How results name entry `index`: its node-config `name`, else its partition."""
        node = self.nodes[index]
        return node.name or f"partition-{node.partition_id}"

    def refuse(self, node_ids: Iterable[int]) -> None:
        """Node ids that take no part in this run and are not asked the handshake again."""
        self.refused.update(node_ids)

    def grow(self, node_ids: Iterable[int]) -> int:
        """Add an entry for every id the table lacks (numbered on, `with_new_nodes`); returns how many."""
        grown = with_new_nodes(self.nodes, node_ids)
        added = len(grown) - len(self.nodes)
        self.nodes = grown
        return added

    def connected(self, node_ids: Iterable[int]) -> list[NodeInfo]:
        """The entries whose node id is among `node_ids`, in partition order."""
        present = set(node_ids)
        return [n for n in self.nodes if n.node_id in present]

    def take_in_joined(self, grid: Grid, next_round: int) -> bool:
        """A handshake's table and node ids it lacks: ask them `rejoin`, then take them in; True if it grew.

        A node that came back under a new node id gets its old entry (its partition, its counts, its place in
        the sampling). A site that joins late gets an entry of its own and takes part from `next_round`, unless
        `late_join_refusal` says why this algorithm cannot take it: then one log line names it.
        """
        if self.rejoin is None:
            return False
        known = {n.node_id for n in self.nodes}
        connected = {int(i) for i in grid.get_node_ids()}
        unknown = sorted(connected - known - self.refused)
        if not unknown:
            return False
        answered = self.rejoin(grid, unknown, self.nodes, known - connected)
        self.refused.update(set(unknown) - set(answered))
        by_old_id = {entry.node_id: new_id for new_id, entry in answered.items() if entry.node_id in known}
        self.nodes = [replace(n, node_id=by_old_id[n.node_id]) if n.node_id in by_old_id else n
                      for n in self.nodes]
        newcomers = [entry for new_id, entry in answered.items() if entry.node_id == new_id]
        refusal = self.late_join_refusal() if newcomers else None
        for node in newcomers:
            who = f"node {node.node_id}" + (f" ({node.name!r})" if node.name else "")
            if refusal is not None:
                log(WARNING, "%s joined mid-run and takes no part: %s", who, refusal)
                self.refused.add(node.node_id)
            else:
                log(INFO, "%s joined mid-run (partition %s, %d training examples): it takes part from round %d",
                    who, node.partition_id, node.num_train_examples, next_round)
        if refusal is None and newcomers:
            self.nodes = sorted([*self.nodes, *newcomers], key=lambda n: n.partition_id)
            return True
        return False
