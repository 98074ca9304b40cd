"""Start-of-run handshake: learn which partition each connected node holds.

Node ids are random per run; partition ids are stable. The server asks every
connected node for its partition id, partition count and sample counts, waits
until all `num-partitions` nodes have answered (or `node-wait-timeout` passes),
and from then on samples and orders nodes by partition id. In simulation the
first message also pays for the simulation engine's start-up, so the handshake
uses the long wait rather than the round timeout.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.config import RunConfig
from common.interrupt import raise_if_stopped
from common.protocol import HANDSHAKE
from server_app.messaging import match_replies, send_and_receive
from server_app.reply_checks import check_handshake_metrics
from server_app.strategies.fedavg import NodeInfo


class HandshakeError(RuntimeError):
    """Too few nodes completed the handshake, or two claim the same partition."""


def _node_info(node_id: int, metrics: MetricRecord) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        partition_id=int(metrics["partition-id"]),
        num_train_examples=int(metrics["num-train-examples"]),
        num_test_examples=int(metrics["num-test-examples"]),
        label_counts=tuple(int(c) for c in metrics["label-counts"]),
    )


def handshake(grid: Grid, cfg: RunConfig, poll_interval: float = 0.5) -> list[NodeInfo]:
    """Query connected nodes until every partition has answered or the wait runs out."""
    deadline = time.monotonic() + cfg.node_wait_timeout
    infos: dict[int, NodeInfo] = {}
    errors: dict[int, str] = {}
    expected: int | None = None
    while True:
        raise_if_stopped()
        new = [nid for nid in grid.get_node_ids() if nid not in infos and nid not in errors]
        if new:
            messages = [
                Message(RecordDict(), dst_node_id=nid, message_type=f"query.{HANDSHAKE}") for nid in new
            ]
            remaining = max(deadline - time.monotonic(), 1.0)
            replies = send_and_receive(grid, messages, remaining, cfg.reply_poll_interval)
            for message, reply in match_replies(messages, replies)[0]:
                nid = message.metadata.dst_node_id  # the SuperLink answers for a node that went away
                if reply.has_error():
                    errors[nid] = reply.error.reason
                    log(WARNING, "node %s failed the handshake: %s", nid, reply.error.reason)
                    continue
                metrics = reply.content.metric_records.get("metrics")
                reason = check_handshake_metrics(metrics)
                if reason is not None:
                    errors[nid] = f"malformed handshake reply: {reason}"
                    log(WARNING, "node %s: %s", nid, errors[nid])
                    continue
                infos[nid] = _node_info(nid, metrics)
                expected = max(expected or 0, int(metrics["num-partitions"]))
        if expected is not None and len(infos) >= expected:
            break
        if errors and not infos and set(grid.get_node_ids()) <= set(errors):
            break  # every node failed the same way so far: report it now rather than wait
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_interval)
    nodes = sorted(infos.values(), key=lambda n: n.partition_id)
    _check_nodes(nodes, errors, cfg, expected)
    log(INFO, "handshake: %d nodes, partitions %s", len(nodes), [n.partition_id for n in nodes])
    return nodes


def _check_nodes(nodes: list[NodeInfo], errors: dict[int, str], cfg: RunConfig, expected: int | None) -> None:
    seen: dict[int, int] = {}
    for node in nodes:
        if node.partition_id in seen:
            raise HandshakeError(
                f"nodes {seen[node.partition_id]} and {node.node_id} both hold partition-id "
                f"{node.partition_id}; give every SuperNode its own 'partition-id' in --node-config"
            )
        seen[node.partition_id] = node.node_id
    if len(nodes) < cfg.min_nodes:
        detail = "; ".join(f"node {nid}: {reason}" for nid, reason in list(errors.items())[:3])
        raise HandshakeError(
            f"only {len(nodes)} node(s) completed the handshake within node-wait-timeout="
            f"{cfg.node_wait_timeout:g}s, fewer than min-nodes={cfg.min_nodes}"
            + (f". Node errors: {detail}" if detail else
               f". {len(nodes)} node(s) answered; start more SuperNodes or lower min-nodes" if nodes else
               ". No node answered: check that the SuperNodes are connected to this SuperLink "
               "(in simulation, a slow start of the engine may need a larger node-wait-timeout)")
        )
    if expected is not None and len(nodes) < expected:
        log(WARNING, "only %d of %d partitions answered the handshake; continuing with them", len(nodes), expected)
