"""Checks of every field of a node's reply metrics, before the server reads any of them.

A node is not trusted: its reply may lack a key, carry a list where a number
belongs, a NaN, a negative count, or claim more examples than it reported in
the start-of-run handshake (which would let one node take over a weighted
mean). Each function here takes the reply's `metrics` record (or None) and
returns why it is unusable, or None when every field the server reads is
present, of the right type and in range. Callers drop a reply with a reason
and record it as a failure, so a malformed reply never raises and is never
averaged in.

These are pure functions of a mapping, so they are property-tested with
random malformed records (tests/test_reply_checks.py). `model_overflow` checks a
reply's update against the global model: the one check of its arrays' values
that every mean needs (the plain mean included), so a node whose update alone
would leave the model unusable is named in the round it sent it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from common.algorithms.local_training_settings import LOCAL_STEPS_METRIC

# Upper bounds on what a node claims at the handshake, checked before the server sizes anything from them
# (a claim of num-partitions = 10**9 once made the server build a set of 10**9 ids: 18.7 GB, then the OOM killer).
MAX_NUM_PARTITIONS = 100_000  # a thousand times the studies' largest federation (100 nodes)
MAX_PARTITION_ID = 2**31 - 1  # the range of the ids derived from site names (common/data/site_data.py: site_key)
MAX_EXAMPLES = 2**53  # counts stay exact as float64 weights; a larger claim is refused, a smaller lie is capped
MAX_NODE_NAME = 200  # characters of a node's `name`, which labels it in logs and results
MAX_REPLY_METRICS = 256  # metrics in one train reply (fedsynth's carry ~15; each other one becomes a round metric)
# The largest float32: a model whose squared L2 norm exceeds it overflows every node's float32 training (its
# activations, losses and gradients, SAM's and the norm bounds' norms), so the next round fails on every node.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_int(value: Any) -> bool:
    """A Python integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool, not a list)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _integer(metrics: Mapping[str, Any], key: str, low: int, high: int | None = None) -> str | None:
    value = metrics.get(key)
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        return f"reply metric '{key}' = {value!r} is not an integer {bound}"
    return None


def _number(metrics: Mapping[str, Any], key: str, low: float = -math.inf, high: float = math.inf) -> str | None:
    value = metrics.get(key)
    if not is_number(value) or not low <= value <= high:
        bound = "a finite number" if (low, high) == (-math.inf, math.inf) else f"a number in [{low:g}, {high:g}]"
        return f"reply metric '{key}' = {value!r} is not {bound}"
    return None


def _all_scalars_finite(metrics: Mapping[str, Any], allow_lists: tuple[str, ...] = ()) -> str | None:
    """Every value a finite number; a list only under the named keys (and then of finite numbers)."""
    for key in metrics.keys():
        value = metrics[key]
        if key in allow_lists and isinstance(value, list):
            if not all(is_number(v) for v in value):
                return f"reply metric '{key}' holds a non-finite or non-numeric entry"
        elif not is_number(value):
            return f"reply metric '{key}' = {value!r} is not a finite number"
    return None


def _first(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r is not None), None)


def check_train_metrics(metrics: Mapping[str, Any] | None, partition_id: int | None = None,
                        max_examples: int | None = None, needs_loss: bool = True,
                        max_test_examples: int | None = None, partition_required: bool = True) -> str | None:
    """Why a train reply's metrics are unusable, or None.

    `num-examples` must be a positive integer no larger than `max_examples` (the
    node's handshake count of training examples), `num-test-examples` no larger
    than `max_test_examples` (its handshake count of test examples);
    `partition-id`, when the node is known, must be its own (a ClientApp that
    is not fedsynth's may leave it out: `partition_required` False); `train-loss` a
    finite number; a local test accuracy in [0, 1] with a non-negative
    `num-test-examples`; every other value a finite number; at most
    `MAX_REPLY_METRICS` of them.
    """
    if metrics is None:
        return "reply lacks the 'metrics' record"
    if len(metrics) > MAX_REPLY_METRICS:
        return f"reply carries {len(metrics)} metrics, more than {MAX_REPLY_METRICS}"
    reason = _first(
        _all_scalars_finite(metrics),
        _integer(metrics, "num-examples", 1),
        _integer(metrics, "partition-id", 0) if partition_required or "partition-id" in metrics else None,
        _number(metrics, "train-loss") if needs_loss else None,
    )
    if reason:
        return reason
    if max_examples is not None and metrics["num-examples"] > max_examples:
        return (f"reply metric 'num-examples' = {metrics['num-examples']} exceeds the {max_examples} training "
                "examples the node reported in the handshake")
    if partition_id is not None and metrics["partition-id"] != partition_id:
        return f"reply metric 'partition-id' = {metrics['partition-id']} but the node holds partition {partition_id}"
    if "num-test-examples" in metrics or "local-test-accuracy" in metrics:
        reason = _first(
            _integer(metrics, "num-test-examples", 0),
            _number(metrics, "local-test-accuracy", 0.0, 1.0),
            _number(metrics, "local-test-loss", 0.0),
        )
        if reason:
            return reason
        if max_test_examples is not None and metrics["num-test-examples"] > max_test_examples:
            return (f"reply metric 'num-test-examples' = {metrics['num-test-examples']} exceeds the "
                    f"{max_test_examples} test examples the node reported in the handshake")
    for key in (LOCAL_STEPS_METRIC, "synthetic-examples", "own-model-round"):
        if key in metrics and (reason := _integer(metrics, key, 0)):
            return reason
    return None


def check_weight_key(metrics: Mapping[str, Any], weighted_by_key: str) -> str | None:
    """Why a reply's weight (its `weighted_by_key` metric) cannot be used, or None.

    The weight must be a positive finite number and, when the reply also carries `num-examples` under another
    name, equal to it: `num-examples` is what the handshake's counts bound (`check_train_metrics`), so a weight
    that disagrees with it would let a node weigh more than the examples it has.
    """
    weight = metrics.get(weighted_by_key)
    if not is_number(weight) or weight <= 0:
        return f"reply metric '{weighted_by_key}' (weighted_by_key) = {weight!r} is not a positive number"
    count = metrics.get("num-examples")
    if weighted_by_key != "num-examples" and count is not None and weight != count:
        return (f"reply metric '{weighted_by_key}' (weighted_by_key) = {weight!r} disagrees with 'num-examples' = "
                f"{count!r}")
    return None


def check_evaluate_metrics(metrics: Mapping[str, Any] | None, partition_id: int | None = None,
                           max_examples: int | None = None, partition_required: bool = True) -> str | None:
    """Why an evaluate reply's metrics are unusable, or None (`num-examples` may be 0: no local test split)."""
    if metrics is None:
        return "reply lacks the 'metrics' record"
    if len(metrics) > MAX_REPLY_METRICS:
        return f"reply carries {len(metrics)} metrics, more than {MAX_REPLY_METRICS}"
    reason = _first(
        _all_scalars_finite(metrics),
        _integer(metrics, "num-examples", 0, max_examples),
        _integer(metrics, "partition-id", 0) if partition_required or "partition-id" in metrics else None,
        _number(metrics, "local-test-accuracy", 0.0, 1.0),
        _number(metrics, "local-test-loss", 0.0),
    )
    if reason:
        return reason
    if partition_id is not None and metrics["partition-id"] != partition_id:
        return f"reply metric 'partition-id' = {metrics['partition-id']} but the node holds partition {partition_id}"
    return None


def check_handshake_metrics(metrics: Mapping[str, Any] | None) -> str | None:
    """Why a handshake reply is unusable, or None (`num-partitions` is absent where nodes hold their own data).

    Every value is bounded above (MAX_*), so nothing the server sizes from a claim can exhaust its memory.
    """
    if metrics is None:
        return "handshake reply lacks the 'metrics' record"
    reason = _first(
        _all_scalars_finite(metrics),
        _integer(metrics, "partition-id", 0, MAX_PARTITION_ID),
        _integer(metrics, "num-train-examples", 0, MAX_EXAMPLES),
        _integer(metrics, "num-test-examples", 0, MAX_EXAMPLES),
        *(_integer(metrics, key, 1, MAX_NUM_PARTITIONS) for key in ("num-partitions",) if key in metrics),
    )
    if reason:
        return reason
    if "num-partitions" in metrics and metrics["partition-id"] >= metrics["num-partitions"]:
        return (f"handshake metric 'partition-id' = {metrics['partition-id']} is not below "
                f"'num-partitions' = {metrics['num-partitions']}")
    return None


def check_node_name(name: str) -> str | None:
    """Why a node's `name` (handshake config record) is unusable, or None: at most MAX_NODE_NAME printable characters."""
    if len(name) > MAX_NODE_NAME:
        return f"node name of {len(name)} characters is longer than {MAX_NODE_NAME}"
    if not name.isprintable():
        return f"node name {name[:40]!r} holds control characters"
    return None


def model_overflow(current: Mapping[str, np.ndarray], delta: Mapping[str, np.ndarray]) -> str | None:
    """Why the model a reply's update gives, `current + delta` (its floating arrays, in float64), cannot be a
    global model, or None: every value must be finite in float32 and its squared L2 norm at most FLOAT32_MAX.

    The node's own model is what it sent (or its decoded update applied): a NaN, a value beyond float32's range
    (a qsgd norm of 3e38) or values that make the squared norm overflow (top-k values of 1e30) would pass any
    mean into the global model and fail the next round on every node. The server's own step (`server_lr`,
    momentum) is not the node's doing and is not part of this check, nor is a global model whose squared norm
    overflowed already (a factory's huge initial weights, documented as accepted): no reply is blamed for it.
    """
    squares, before = 0.0, 0.0
    for name, update in delta.items():
        if not np.issubdtype(update.dtype, np.floating) or name not in current:
            continue
        start = np.asarray(current[name], dtype=np.float64)
        model = start + np.asarray(update, dtype=np.float64)
        if not np.all(np.isfinite(model)) or np.max(np.abs(model), initial=0.0) > FLOAT32_MAX:
            return f"its update would make the global model non-finite in float32 (array '{name}')"
        with np.errstate(over="ignore"):
            squares += float(np.dot(model.ravel(), model.ravel()))
            before += float(np.dot(start.ravel(), start.ravel()))
    if not squares <= FLOAT32_MAX and before <= FLOAT32_MAX:
        return (f"its update would make the global model's squared L2 norm {squares:.3g} overflow float32 "
                f"(> {FLOAT32_MAX:.3g}): every node's next round would be non-finite")
    return None
