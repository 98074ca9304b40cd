"""The round's mean of the checked updates, with bounded influence, and the model's buffers: `UpdateMean`.

FedAvg's family combines the decoded updates of the good replies (in partition order, so that results are
bitwise reproducible) into one mean update for the server step:

- each update is scaled by its clip factor when an update-norm bound is set (`max-update-norm`,
  `max-update-norm-ratio`; server_app/robust.py `clip_factors`), a factor kept per partition so that records
  that follow the update (SCAFFOLD's control delta) are scaled with it;
- the mean is the `aggregation` rule's: the `weighted_by_key`-weighted mean with no share above
  `max-weight-share` (`weighted`), the plain one (`uniform`), or a robust one (median, trimmed mean, Krum);
- a model's buffers (BatchNorm's running statistics and batch counter) are not updates to step along: the
  floating ones become the weighted mean of the replies' values, the integer ones the replies' maximum
  (`aggregate_buffers`), each in its own dtype and shape.

A collaborator rather than methods of the strategy, so that the strategy's class shows its algorithm and a
plugin's server step uses the built-ins' weights and buffers (`strategy.update_mean.weights(replies)`,
`strategy.update_mean.buffers(replies)`). It reads the strategy's rule and bounds when it runs. The math is in
the pure functions below and in server_app/robust.py.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from flwr.app import Message

from common.records import Weights
from common.uplink.wire import reply_buffers
from server_app.influence import bounded_weights, cap_binds
from server_app.robust import ROBUST_AGGREGATIONS, clip_factors, combine_updates, scale_update

class MeanOwner(Protocol):
    """What the mean of updates reads on the strategy that holds it (FedAvg's family): its rule and bounds, the
    model and the reply checks; a Protocol, so that this module does not import the strategy's (which imports it)."""

    _parameter_names: list[str]
    aggregation: str
    byzantine_nodes: int
    codec: Any  # common.run.codecs.Codec | None
    current: Weights
    max_update_norm: float
    max_update_norm_ratio: float
    max_weight_share: float
    node_table: Any  # server_app.strategies.node_table.NodeTable
    reply_gate: Any  # server_app.strategies.reply_gate.ReplyGate
    trim_fraction: float
    update_mean: Any  # this module's UpdateMean
    weighted_by_key: str


def weighted_mean(values: list[Weights], weights: list[float]) -> Weights:
    """sum_i p_i * values_i with p normalised, accumulated in float64, returned as float32."""
    total = float(sum(weights))
    return {
        name: (sum(v[name].astype(np.float64) * (w / total) for v, w in zip(values, weights))).astype(np.float32)
        for name in values[0]
    }


def aggregate_buffers(values: list[Weights], weights: list[float]) -> Weights:
    """The global model's new buffers from the replies' buffers (same names in each), each in its own dtype.

    Floating buffers (BatchNorm's running mean and variance) are the `weights`-weighted
    mean, accumulated in float64: a mean of variances is a variance (never negative), and
    with server-lr 1 it is what FedAvg's step gives them. Integer buffers (BatchNorm's 0-d
    int64 `num_batches_tracked`) are the replies' maximum, not a float mean: a batch count
    must stay a whole number of its dtype, and the maximum is the count of the node that
    saw the most batches, so it never decreases over rounds. (Keeping the server's value
    instead would leave it at 0 forever, and a BatchNorm with `momentum=None` averages its
    statistics with the factor 1 / num_batches_tracked, so it would overwrite them on every
    node's first batch.)
    """
    total = float(sum(weights))
    out: Weights = {}
    for name, first in values[0].items():
        if np.issubdtype(first.dtype, np.floating):
            mean = sum(v[name].astype(np.float64) * (w / total) for v, w in zip(values, weights))
            out[name] = np.asarray(mean).astype(first.dtype)
        else:
            out[name] = np.maximum.reduce([np.asarray(v[name]) for v in values]).astype(first.dtype)
    return out


class UpdateMean:
    """The mean update of one strategy's rounds and its buffers (see the module's docstring)."""

    def __init__(self, strategy: MeanOwner) -> None:
        self.strategy = strategy

    def bounds_on(self) -> bool:
        """Whether bounded influence (an update-norm bound or the weight cap) can change this round's mean."""
        s = self.strategy
        return s.max_update_norm > 0 or s.max_update_norm_ratio > 0 or s.max_weight_share < 1

    def weights(self, replies: list[Message]) -> list[float]:
        """Each reply's weight in the mean: its `weighted_by_key` metric (`weighted`), no share above
        `max-weight-share` (server_app/influence.py), or ones (`uniform`); floats, in the replies' order."""
        s = self.strategy
        if s.aggregation != "weighted":
            return [1.0] * len(replies)
        counts = [float(r.content.metric_records["metrics"][s.weighted_by_key]) for r in replies]
        return bounded_weights(counts, s.max_weight_share)

    def buffers(self, replies: list[Message]) -> Weights:
        """The new values of the model's buffers from checked replies ({name: array in the buffer's own dtype and
        shape}, `aggregate_buffers`); {} for a model without buffers."""
        s = self.strategy
        names = s._parameter_names
        if len(names) == len(s.current):
            return {}
        ordered = sorted(replies, key=s.node_table.partition_of)
        values = [reply_buffers(r.content, s.current, s.codec, names) for r in ordered]
        return aggregate_buffers(values, self.weights(ordered))

    def clip_factors(self, replies: list[Message], deltas: list[Weights]) -> list[float]:
        """Each update's clip factor in (0, 1] ("refuse" dropped the longer ones in the reply checks; "clip"
        scales them; then the round's median bound); all 1.0 without an update-norm bound."""
        s = self.strategy
        norm_bounded = s.max_update_norm > 0 or s.max_update_norm_ratio > 0
        return clip_factors([s.reply_gate.update_norm(r, d) if norm_bounded else 0.0 for r, d in zip(replies, deltas)],
                            s.max_update_norm, s.max_update_norm_ratio)

    def mean(self, replies: list[Message], deltas: list[Weights], factors: list[float]) -> Weights:
        """The aggregation rule's mean of the scaled updates: {name: float32 array} over the deltas' names."""
        s = self.strategy
        scaled = [scale_update(d, f) for d, f in zip(deltas, factors)]
        if s.aggregation in ROBUST_AGGREGATIONS:
            return combine_updates(scaled, s.aggregation, s.trim_fraction, s.byzantine_nodes)
        return weighted_mean(scaled, self.weights(replies))

    def bound_metrics(self, replies: list[Message], factors: list[float]) -> dict[str, int]:
        """What bounded influence changed this round: "clipped-updates" and "weight-cap-bound" (0 or 1)."""
        s = self.strategy
        return {"clipped-updates": sum(1 for f in factors if f < 1.0),
                "weight-cap-bound": int(s.aggregation == "weighted" and cap_binds(
                    [float(r.content.metric_records["metrics"][s.weighted_by_key]) for r in replies],
                    s.max_weight_share))}
