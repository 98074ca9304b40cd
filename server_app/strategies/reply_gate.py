"""Whether a train reply may enter the mean, and its update as the server reads it: `ReplyGate`.

FedAvg's family checks every train reply against the global model before any mean (SPEC: a bad reply is
dropped, never averaged in), in this order: the metric fields against the node's handshake counts
(server_app/reply_checks.py), the reply's size (at most 3x the model plus 1 MiB, before it is decoded),
"num-examples" and the `weighted_by_key` metric, the decoded update (names, shapes, dtypes, finite values;
compressed payloads are decoded, common/uplink/wire.py), an update that would overflow the model, the
update-norm bound (`max-update-norm` with action "refuse"), and last the algorithm's own records
(`check_extra_records`, the strategy's public hook).

A collaborator rather than methods of the strategy, so that the strategy's class shows its algorithm and a
plugin reads the same update the built-ins do (`strategy.reply_gate.delta(reply)`). It reads the strategy's
global model (`current`), codec and bounds when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from flwr.app import Message

from common.records import Weights, message_array_bytes
from common.uplink.wire import decode_reply, measured_update_norm
from server_app.reply_checks import check_train_metrics, check_weight_key, model_overflow
from server_app.robust import update_norm
from server_app.strategies.node_table import NodeInfo

class ReplyOwner(Protocol):
    """What the reply checks read on the strategy that holds them (FedAvg's family): a Protocol, so that this module
    does not import the strategy's (which imports it)."""

    _parameter_names: list[str]
    codec: Any  # common.run.codecs.Codec | None
    current: Weights
    max_update_norm: float
    node_table: Any  # server_app.strategies.node_table.NodeTable
    reply_gate: Any  # this module's ReplyGate
    round_log: Any  # server_app.strategies.round_log.RoundLog
    update_norm_action: str
    weighted_by_key: str

    def check_extra_records(self, content: Any) -> str | None: ...


def max_reply_bytes(current: Mapping[str, np.ndarray]) -> int:
    """Replies larger than this are refused before being decoded: 3x the model `current`, plus 1 MiB."""
    return 3 * sum(w.nbytes for w in current.values()) + (1 << 20)


class ReplyGate:
    """The checks of one strategy's train replies and the reading of their updates (see the module's docstring)."""

    def __init__(self, strategy: ReplyOwner) -> None:
        self.strategy = strategy

    def check_train_reply(self, reply: Message, node: NodeInfo) -> str | None:
        """Why a (non-error) train reply of `node` must be dropped, or None: every metric field (against the
        node's handshake counts), then `check_reply`."""
        handshake = self.strategy.node_table.from_handshake
        reason = check_train_metrics(reply.content.metric_records.get("metrics"),
                                     node.partition_id if handshake else None, node.num_train_examples,
                                     max_test_examples=node.num_test_examples,
                                     partition_required=handshake)
        return reason if reason is not None else self.check_reply(reply)

    def check_reply(self, reply: Message) -> str | None:
        """Why a train reply's content must be dropped, or None when it can be aggregated."""
        strategy = self.strategy
        content = reply.content
        size, limit = message_array_bytes(reply), max_reply_bytes(strategy.current)
        if size > limit:
            return f"reply of {size} bytes is oversized (limit {limit} bytes, 3x the model)"
        if "metrics" not in content.metric_records:
            return "reply lacks the 'metrics' record"
        num_examples = content.metric_records["metrics"].get("num-examples")
        if not isinstance(num_examples, int) or num_examples <= 0:
            return f"reply metric 'num-examples' = {num_examples!r} is not a positive integer"
        reason = check_weight_key(content.metric_records["metrics"], strategy.weighted_by_key)
        if reason is not None:
            return reason
        try:
            delta = self.delta(reply)
        except ValueError as err:  # a missing, mis-shaped, mistyped or non-finite model or payload
            return str(err)
        if (overflow := model_overflow(strategy.current, delta)) is not None:  # under every mean, before it
            entry = strategy.round_log.latest
            return f"round {entry.round}: {overflow}" if entry is not None else overflow
        bound = strategy.max_update_norm
        if bound > 0 and strategy.update_norm_action == "refuse" and (norm := self.update_norm(reply, delta)) > bound:
            return f"update norm {norm:.4g} exceeds max-update-norm = {bound:g}"
        return strategy.check_extra_records(content)

    def delta(self, reply: Message) -> Weights:
        """The reply's update w_i - w: {name: float32 array shaped like the global model's}, its model minus the
        global one, or its decoded compressed update.

        Compressed extra records are decoded in place first, so `check_extra_records` and `server_step` read
        them as if uncompressed (common/uplink/wire.py). Raises ValueError naming the fault.
        """
        strategy = self.strategy
        return decode_reply(reply.content, strategy.current, strategy.codec, strategy._parameter_names)

    def update_norm(self, reply: Message, delta: Weights) -> float:
        """The L2 norm of a reply's update as its client measured it: a qsgd payload's own norms (the quantised
        vector's norm is mostly quantiser noise, common/uplink/wire.py `measured_update_norm`), else `delta`'s."""
        measured = measured_update_norm(reply.content, self.strategy.codec)
        return update_norm(delta) if measured is None else measured
