"""Start-of-run handshake: learn which partition (or which site) each connected node holds.

Node ids are random per run; partition ids are stable. The server asks every
connected node for its partition id, partition count, sample counts, image shape
and name, waits until all `num-partitions` nodes have answered (or
`node-wait-timeout` passes), and from then on samples and orders nodes by
partition id. In simulation the first message also pays for the simulation
engine's start-up, so the handshake uses the long wait rather than the round
timeout.

With `partition = "node"` the nodes hold their own data and need no partition
ids: a node without one sends no partition count and a stable id from its name.
The server then takes every connected node once at least `min-nodes` have
answered, and a node refused for its data (missing, empty or unreadable folder,
undecodable images, labels outside the label space) fails the run at once with
the node's message: a site's data is fixed by its operator, not skipped.

The wait ends when all `num-partitions` partitions have answered, or when every
connected node has answered and as many nodes as partitions are connected, or
after `node-wait-timeout` (a connected node always gets at least
`round-timeout` to answer). A node that fails the handshake (an error, a
malformed reply, a partition id another node already holds: that node alone
is refused) is recorded with its reason. Fewer partitions than
`num-partitions` - `max-missing-nodes` is a failure: the run does not start on
a part of the federation silently (docs/reliability.md).

A node's claims are bounded before the server sizes anything from them
(`num-partitions` at most 100,000, counts at most 2**53, ids 31-bit, names 200
printable characters: server_app/reply_checks.py), and the partition count the
server waits for is the one most nodes claim: a node claiming another count is
refused alone, named, at once, rather than leaving the run to wait for
partitions that do not exist. Every refusal names the node (id and name).

A user's model must fit the task: its output width is checked against the
federation's class count here on the server, before any node is asked, and on
every node as it answers the handshake (`common.run.task.check_task_model`).

A node that restarts mid-run comes back with the same node id when node
authentication is on, and with a new one otherwise; a site can also join for
the first time mid-run. `joined_nodes` asks every node id the table lacks the
same question: a new id that holds the partition (or site) of a node that is
gone takes over that node's table entry; one that holds a partition (or site)
the table lacks gets an entry of its own, and the strategy takes it in from
its next round where the algorithm allows it (`RoundStrategy._late_join_refusal`;
the decentralized relay refuses, naming the site). The strategy's node table
holds this question (`NodeTable.rejoin`, server_app/strategies/node_table.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any, NamedTuple

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.data.settings import NODE_PARTITION
from common.run.config import RunConfig
from common.run.interrupt import raise_if_stopped
from common.protocol import HANDSHAKE
from common.run.task import check_task_model
from server_app.messaging import match_replies, send_and_receive, sender_mismatch
from server_app.reply_checks import check_handshake_metrics, check_node_name
from server_app.strategies.node_table import NodeInfo


class HandshakeError(RuntimeError):
    """More nodes than `max-missing-nodes` were lost at the handshake, or fewer than `min-nodes` answered."""

    def __init__(self, message: str, failures: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []


def _node_info(node_id: int, metrics: MetricRecord, name: str) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        partition_id=int(metrics["partition-id"]),
        num_train_examples=int(metrics["num-train-examples"]),
        num_test_examples=int(metrics["num-test-examples"]),
        name=name,
    )


def _node_name(reply: Message) -> str:
    record = reply.content.config_records.get("node")
    return str(record["name"]) if record is not None and "name" in record else ""


class _Answer(NamedTuple):
    """One node's handshake answer: its name once checked (else ""), its entry or why it was refused, its claim."""

    name: str
    node: NodeInfo | str
    num_partitions: int | None = None


def _ask(grid: Grid, cfg: RunConfig, node_ids: list[int], timeout: float) -> dict[int, _Answer]:
    """Each node's handshake answer, its claims bounded before anything is sized from them."""
    messages = [Message(RecordDict(), dst_node_id=nid, message_type=f"query.{HANDSHAKE}") for nid in node_ids]
    replies = send_and_receive(grid, messages, timeout, cfg.reply_poll_interval)
    answers: dict[int, _Answer] = {}
    for message, reply in match_replies(messages, replies)[0]:
        nid = message.metadata.dst_node_id  # the SuperLink answers for a node that went away
        mismatch = sender_mismatch(message, reply)
        if mismatch is not None:
            answers[nid] = _Answer("", mismatch)
            continue
        if reply.has_error():
            answers[nid] = _Answer("", reply.error.reason)
            continue
        name = _node_name(reply)
        metrics = reply.content.metric_records.get("metrics")
        reason = check_node_name(name)
        if reason is not None:
            answers[nid] = _Answer("", f"malformed handshake reply: {reason}")
            continue
        reason = check_handshake_metrics(metrics)
        if reason is not None:
            answers[nid] = _Answer(name, f"malformed handshake reply: {reason}")
            continue
        claim = int(metrics["num-partitions"]) if "num-partitions" in metrics else None
        answers[nid] = _Answer(name, _node_info(nid, metrics, name), claim)
    return answers


def joined_nodes(grid: Grid, node_ids: list[int], table: list[NodeInfo], away: set[int],
                 cfg: RunConfig) -> dict[int, NodeInfo]:
    """{new node id: its entry} for node ids that appeared mid-run, each asked the handshake's question.

    A new id that holds the partition id (or site id) of an entry whose node is `away` (no longer
    connected) takes over that entry, which keeps its handshake counts (a restart cannot raise a node's
    weight) and its old node id: the caller maps it. A new id that holds a partition (or site) the table
    lacks gets a new entry under its own id (a site that joins late). A new id that fails the question,
    or holds a partition a connected node holds, is logged by id (and name) and takes no part.
    """
    taken: dict[int, NodeInfo] = {}
    held = {n.partition_id for n in table}
    for nid, (name, answer, _) in _ask(grid, cfg, node_ids, cfg.round_timeout).items():
        who = f"node {nid}" + (f" ({name!r})" if name else "")
        if isinstance(answer, str):
            log(WARNING, "%s joined mid-run and takes no part: %s", who, answer)
            continue
        if answer.partition_id not in held:
            held.add(answer.partition_id)
            taken[nid] = answer  # its own entry: the strategy decides whether it takes part
            continue
        entry = next((n for n in table if n.partition_id == answer.partition_id and n.node_id in away
                      and n.node_id not in {t.node_id for t in taken.values()}), None)
        if entry is None:
            log(WARNING, "%s joined mid-run and takes no part: partition %s is held by a connected node",
                who, answer.partition_id)
            continue
        log(INFO, "node %s came back as node %s (partition %s%s)", entry.node_id, nid, entry.partition_id,
            f", {entry.name!r}" if entry.name else "")
        taken[nid] = entry
    return taken


def handshake(grid: Grid, cfg: RunConfig, poll_interval: float = 0.5) -> list[NodeInfo]:
    """The nodes of the run (see `handshake_outcome`)."""
    return handshake_outcome(grid, cfg, poll_interval)[0]


def handshake_outcome(grid: Grid, cfg: RunConfig, poll_interval: float = 0.5) -> tuple[list[NodeInfo], list[dict[str, Any]]]:
    """(nodes, failures): query connected nodes until every partition or every connected node has answered.

    Each failure is {"node", "name" (when known), "reason"}; every reason names the node. Raises
    HandshakeError (with the failures) when more than `max-missing-nodes` partitions are missing or
    fewer than `min-nodes` nodes answered.
    """
    check_task_model(cfg)  # a model that does not fit the task is refused before any node is asked (ConfigError)
    deadline = time.monotonic() + cfg.node_wait_timeout
    own_data = cfg.partition == NODE_PARTITION
    infos: dict[int, NodeInfo] = {}
    errors: dict[int, str] = {}
    names: dict[int, str] = {}
    claims: dict[int, int] = {}  # node id -> the num-partitions it claims (bounded by check_handshake_metrics)
    expected: int | None = None
    while True:
        raise_if_stopped()
        new = [nid for nid in grid.get_node_ids() if nid not in infos and nid not in errors]
        if new:
            # a connected node gets at least round-timeout to answer, even when node-wait-timeout is short
            remaining = max(deadline - time.monotonic(), cfg.round_timeout)
            for nid, (name, answer, claim) in _ask(grid, cfg, new, remaining).items():
                if name:
                    names[nid] = name
                if isinstance(answer, str):
                    errors[nid] = answer
                    log(WARNING, "node %s failed the handshake: %s", nid, answer)
                    continue
                info = answer
                holder = next((n for n in infos.values() if n.partition_id == info.partition_id), None)
                if holder is not None:  # refuse this node alone: the federation goes on with the first holder
                    errors[nid] = (
                        f"node {nid} ({info.name!r}) has the same id {info.partition_id} as node {holder.node_id} "
                        f"({holder.name!r}): give every SuperNode its own 'name' in --node-config" if own_data else
                        f"partition-id {info.partition_id} is already held by node {holder.node_id}; give "
                        "every SuperNode its own 'partition-id' in --node-config")
                    log(WARNING, "node %s: %s", nid, errors[nid])
                    continue
                infos[nid] = info
                if claim is not None:
                    claims[nid] = claim
            expected = agreed_partition_count(claims.values())
        agreeing = [nid for nid in infos if nid not in claims or claims[nid] == expected]
        if expected is not None and len(agreeing) >= expected:
            break
        connected = set(grid.get_node_ids())
        answered = set(infos) | set(errors)
        if expected is not None and connected <= answered and len(connected) >= expected:
            break  # every node that is there has answered, and no more are due
        if own_data and connected <= answered and (errors or len(infos) >= cfg.min_nodes):
            break  # every connected site answered: a refused one fails the run now, not at the deadline
        if errors and not infos and set(grid.get_node_ids()) <= set(errors):
            break  # every node failed the same way so far: report it now rather than wait
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_interval)
    for nid, reason in disagreeing_claims(claims, expected).items():  # refused alone, named
        errors[nid] = reason
        del infos[nid]
        log(WARNING, "node %s: %s", nid, reason)
    nodes = sorted(infos.values(), key=lambda n: n.partition_id)
    failures = [{"node": nid, **({"name": names[nid]} if names.get(nid) else {}), "reason": reason}
                for nid, reason in errors.items()]
    if own_data and errors:  # a site's data is fixed by its operator, not skipped
        raise HandshakeError(f"{len(errors)} node(s) refused at the handshake: "
                             + "; ".join(_who(f) + f": {f['reason']}" for f in failures), failures)
    _check_nodes(nodes, errors, cfg, expected, failures)
    log(INFO, "handshake: %d nodes, partitions %s", len(nodes),
        [f"{n.partition_id} ({n.name})" if n.name else n.partition_id for n in nodes])
    return nodes, failures


def agreed_partition_count(claims: Iterable[int]) -> int | None:
    """The `num-partitions` most nodes claim (a tie: the largest of the tied), or None when no node claimed one.

    One node cannot set how many partitions the server waits for: the count is the nodes' majority.
    """
    counted = Counter(claims)
    if not counted:
        return None
    return max(counted, key=lambda count: (counted[count], count))


def disagreeing_claims(claims: Mapping[int, int], expected: int | None) -> dict[int, str]:
    """node id -> why it is refused, for each node whose `num-partitions` is not the agreed one."""
    if expected is None:
        return {}
    agreeing = sorted(nid for nid, count in claims.items() if count == expected)
    return {nid: (f"node {nid} claims num-partitions = {count}, but {len(agreeing)} node(s) "
                  f"({', '.join(map(str, agreeing[:5]))}) claim {expected}; give every SuperNode the same "
                  "'num-partitions' in --node-config")
            for nid, count in sorted(claims.items()) if count != expected}


def _who(failure: Mapping[str, Any]) -> str:
    """'node <id>' or "node <id> ('<name>')", for messages."""
    return f"node {failure['node']}" + (f" ({failure['name']!r})" if failure.get("name") else "")


def _check_nodes(nodes: list[NodeInfo], errors: dict[int, str], cfg: RunConfig, expected: int | None,
                 failures: list[dict[str, Any]]) -> None:
    if len(nodes) < cfg.min_nodes:
        detail = "; ".join(f"{_who(f)}: {f['reason']}" for f in failures[:3])
        raise HandshakeError(
            f"only {len(nodes)} node(s) completed the handshake within node-wait-timeout="
            f"{cfg.node_wait_timeout:g}s, fewer than min-nodes={cfg.min_nodes}"
            + (f". Node errors: {detail}" if detail else
               f". {len(nodes)} node(s) answered; start more SuperNodes or lower min-nodes" if nodes else
               ". No node answered: check that the SuperNodes are connected to this SuperLink "
               "(in simulation, a slow start of the engine may need a larger node-wait-timeout)"),
            failures,
        )
    missing = sorted(set(range(expected)) - {n.partition_id for n in nodes}) if expected is not None else []
    if len(missing) > cfg.max_missing_nodes:
        detail = "; ".join(f"{_who(f)}: {f['reason']}" for f in failures[:3])
        raise HandshakeError(
            f"{len(missing)} of {expected} partitions did not complete the handshake (partitions {missing[:10]}), "
            f"more than max-missing-nodes = {cfg.max_missing_nodes}"
            + (f". Node errors: {detail}" if detail else ". Those nodes did not connect within node-wait-timeout = "
               f"{cfg.node_wait_timeout:g}s")
            + "; fix them, or set max-missing-nodes to run without them",
            failures,
        )
    if missing:
        log(WARNING, "%d of %d partitions did not complete the handshake (%s); continuing without them "
            "(max-missing-nodes = %d)", len(missing), expected, missing[:10], cfg.max_missing_nodes)

