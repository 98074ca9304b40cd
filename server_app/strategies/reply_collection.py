"""A round's replies sorted into usable ones and failures: the reply collection every strategy shares.

Flower's FedAvg drops error replies in `aggregate_train`; fedsynth drops every reply it cannot use, and says
why. `collect_replies` pairs each reply with the message it answers (by `reply_to_message_id`, so a SuperLink's
error reply for a lost node counts for that node, and another node's reply is never counted as the node's own),
then drops, in this order, a reply from the wrong node, an error reply, a reply from a node outside the node
table, and a reply the strategy's own `check` refuses (its reason; any exception the check raises is a
malformed reply, never a crash of the server). Messages nobody answered are timeouts; a node's second reply and a
reply to no message of the round are dropped with a record too. Each failure is
`{"node", "partition", "reason"}` and is logged once. The strategy keeps the round's bookkeeping
(server_app/strategies/round_book.py `RoundBook.collect`); this module knows nothing of a round but its
messages, its replies and the node table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.common.logger import log

from common.records import message_array_bytes
from server_app.messaging import match_replies, misaddressed_replies, sender_mismatch, surplus_replies
from server_app.strategies.node_table import NodeInfo
from server_app.wire import with_fedsynth_metric_names


@dataclass
class RoundOutcome:
    """The replies of one round, sorted into usable ones and failures."""

    good: list[tuple[int, Message]] = field(default_factory=list)  # (index into nodes, reply)
    failures: list[dict[str, Any]] = field(default_factory=list)
    uplink_bytes: int = 0
    uplink_float32_bytes: int = 0  # what the same replies would weigh uncompressed (SPEC 3.5)


def pair_replies(sent: Sequence[Message], replies: Iterable[Message]) -> tuple[list[tuple[Message, Message]], list[Message]]:
    """Pair replies with the sent messages they answer; returns (pairs in `sent` order, unanswered sent messages).

    A reply is matched by its `reply_to_message_id` (the grid sets message ids when it pushes), so a
    SuperLink's error reply for a lost node counts for that node, and a reply from another node is paired to be
    dropped, never counted as the node's own (server_app/messaging.py `match_replies`). Messages that were never
    pushed (an `aggregate_train` called by hand) are paired by node id instead.
    """
    replies = list(replies)
    if all(message.metadata.message_id for message in sent):
        return match_replies(sent, replies)
    by_node: dict[int, Message] = {}
    for reply in replies:
        by_node.setdefault(reply.metadata.src_node_id, reply)
    pairs = [(m, by_node[m.metadata.dst_node_id]) for m in sent if m.metadata.dst_node_id in by_node]
    unanswered = [m for m in sent if m.metadata.dst_node_id not in by_node]
    return pairs, unanswered


def failure(nodes: Sequence[NodeInfo], node_id: int, reason: str) -> dict[str, Any]:
    """A dropped reply's record: the node, its partition (None outside the node table) and why."""
    node = next((n for n in nodes if n.node_id == node_id), None)
    return {"node": node_id, "partition": None if node is None else node.partition_id, "reason": reason}


def collect_replies(sent: Sequence[Message], replies: Iterable[Message], nodes: Sequence[NodeInfo],
                    check: Callable[[Message, NodeInfo], str | None],
                    float32_bytes: Callable[[Message], int] | None = None) -> RoundOutcome:
    """Split the replies to `sent` into checked-good ones (with their index into `nodes`) and failures, logged.

    A reply in Flower's template names (`train_loss`) is read in fedsynth's (server_app/wire.py) before `check`
    sees it. `float32_bytes` (optional) gives what a reply would weigh uncompressed, summed into the outcome.
    """
    index_of = {n.node_id: i for i, n in enumerate(nodes)}
    outcome = RoundOutcome()
    replies = list(replies)
    pairs, unanswered = pair_replies(sent, replies)
    for message, reply in pairs:
        node_id = message.metadata.dst_node_id  # not the reply's source: the SuperLink answers for lost nodes
        mismatch = sender_mismatch(message, reply)  # another node's reply is not this node's
        if not reply.has_error() and "metrics" in reply.content.metric_records:
            reply.content["metrics"] = with_fedsynth_metric_names(reply.content.metric_records["metrics"])
        outcome.uplink_bytes += message_array_bytes(reply)
        if float32_bytes is not None:
            outcome.uplink_float32_bytes += float32_bytes(reply)
        index = index_of.get(node_id)
        if mismatch is not None:
            reason = f"{mismatch}: dropped"
        elif reply.has_error():
            reason = f"error: {reply.error.reason}"
        elif index is None:
            reason = "reply from a node that is not in the node table"
        else:
            try:
                reason = check(reply, nodes[index])
            except Exception as err:  # noqa: BLE001 - a reply must never crash the server: any fault drops it
                reason = f"malformed reply ({type(err).__name__}: {err})"
        if reason is None:
            outcome.good.append((index, reply))
        else:
            outcome.failures.append(failure(nodes, node_id, reason))
    outcome.failures += [failure(nodes, m.metadata.dst_node_id, "timeout") for m in unanswered]
    outcome.failures += [failure(nodes, reply.metadata.src_node_id, f"{sender_mismatch(message, reply)}, which "
                                 "that node answered itself: dropped")
                         for message, reply in misaddressed_replies(sent, replies, pairs)]
    outcome.failures += [failure(nodes, node, reason) for node, reason in surplus_replies(sent, replies, pairs)]
    for dropped in outcome.failures:
        log(WARNING, "dropped reply of node %s (partition %s): %s", dropped["node"], dropped["partition"],
            dropped["reason"])
    return outcome
