"""The means of the metrics nodes report: count-weighted, no node's share above the weight cap.

The round's train loss and local test accuracy, and the evaluation of every node, are means of what the nodes
claim; each is weighted by the node's example count, capped as bounded influence says (server_app/influence.py;
a cap of 1 leaves the plain count-weighted mean). Split from base.py, which uses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord
from flwr.common.logger import log

from common.algorithms.local_training_settings import LOCAL_STEPS_METRIC
from common.protocol import CLIENT_STAT_PREFIX
from server_app.influence import bounded_weights
from server_app.reply_checks import check_evaluate_metrics
from server_app.strategies.node_table import NodeInfo
from server_app.wire import (
    FLOWER_METRIC_NAMES, WEIGHTED_BY_KEY, with_fedsynth_metric_names, with_flower_metric_names,
)


def weighted_metric(values: Iterable[float], counts: Iterable[float], max_share: float) -> float:
    """The count-weighted mean of a reported metric, no node's share above `max_share` (server_app/influence.py)."""
    weights = np.array(bounded_weights(list(counts), max_share), dtype=np.float64)
    return float(np.sum(np.array(list(values), dtype=np.float64) * weights) / weights.sum())


# The reply metrics fedsynth reads itself (the counts and ids, the loss, the local evaluation of the received model,
# a decentralized node's bookkeeping): every other numeric one is averaged into the round's metrics
# (`other_metric_means`), as Flower's FedAvg averages every metric of its replies.
OWN_REPLY_METRICS = frozenset({
    "num-examples", "partition-id", "train-loss", "local-test-accuracy", "local-test-loss", "num-test-examples",
    LOCAL_STEPS_METRIC, "own-model-round", "ole-direction-norm", *FLOWER_METRIC_NAMES,
})


def node_named(key: str, weighted_by_key: str = WEIGHTED_BY_KEY) -> bool:
    """Whether a reply metric's name is one fedsynth does not read itself: not in `OWN_REPLY_METRICS`, not the
    weighting key, not a per-client statistic (`CLIENT_STAT_PREFIX`, averaged with its maximum)."""
    return key not in OWN_REPLY_METRICS and key != weighted_by_key and not key.startswith(CLIENT_STAT_PREFIX)


def other_metric_means(metrics: list[Mapping[str, Any]], max_share: float,
                       weighted_by_key: str = WEIGHTED_BY_KEY) -> dict[str, Any]:
    """The `weighted_by_key`-weighted mean (capped shares) of each numeric reply metric fedsynth does not read
    itself (`node_named`), over the replies that carry it, as Flower's `aggregate_metricrecords` averages every
    metric. (The reply checks refuse a train reply whose metrics are not finite numbers, or more than
    `MAX_REPLY_METRICS` of them.)"""
    out: dict[str, Any] = {}
    for key in sorted({k for m in metrics for k in m if node_named(k, weighted_by_key)}):
        carried = [m for m in metrics if key in m]
        if all(isinstance(m[key], (int, float)) and not isinstance(m[key], bool) for m in carried):
            out[key] = weighted_metric([float(m[key]) for m in carried], [m[weighted_by_key] for m in carried],
                                       max_share)
    return out


# The prefix of the mean of a node-named metric (`other_metric_means`) in the round log, and so in fedsynth's
# metrics.jsonl: a name a node chose must not overwrite a field of the round's record ("answered",
# "central-accuracy", "clipped-updates", ...). `Result` keeps the name as it came, as Flower's FedAvg does, beside
# the strategy's own metrics (which win a clash).
REPLY_METRIC_PREFIX = "reply-"


def local_test_summary(metrics: list[Any], max_share: float, weighted_by_key: str = WEIGHTED_BY_KEY) -> dict[str, float]:
    """Test-count weighted local accuracy and loss of evaluate replies, with their min and max accuracy."""
    counts = [m[weighted_by_key] for m in metrics]
    accuracy = [m["local-test-accuracy"] for m in metrics]
    return with_flower_metric_names({
        "local-test-accuracy": weighted_metric(accuracy, counts, max_share),
        "local-test-loss": weighted_metric([m["local-test-loss"] for m in metrics], counts, max_share),
        "local-test-accuracy-min": float(min(accuracy)),
        "local-test-accuracy-max": float(max(accuracy)),
    })


def checked_evaluate_metrics(nodes: list[NodeInfo], replies: Iterable[Message], known_partitions: bool = True) -> list[MetricRecord]:
    """The metrics of the evaluate replies whose every field checks out and that have test examples.

    One reply per known node; a malformed one is logged and left out (server_app/reply_checks.py).
    """
    return [metrics for _, metrics in checked_evaluate_replies(nodes, replies, known_partitions)]


def checked_evaluate_replies(nodes: list[NodeInfo], replies: Iterable[Message],
                             known_partitions: bool = True) -> list[tuple[Message, MetricRecord]]:
    """The evaluate replies `checked_evaluate_metrics` keeps, each with its metrics (fedsynth's names added)."""
    node_of = {n.node_id: n for n in nodes}
    good: dict[int, tuple[Message, MetricRecord]] = {}
    for reply in replies:
        node = node_of.get(reply.metadata.src_node_id)
        if node is None or node.node_id in good or reply.has_error():
            continue
        metrics = reply.content.metric_records.get("metrics")
        metrics = with_fedsynth_metric_names(metrics) if metrics is not None else None
        reason = check_evaluate_metrics(metrics, node.partition_id if known_partitions else None,
                                        node.num_test_examples, partition_required=known_partitions)
        if reason is not None:
            log(WARNING, "evaluation: dropped the reply of node %s (partition %s): %s",
                node.node_id, node.partition_id, reason)
        elif metrics["num-examples"] > 0:
            good[node.node_id] = (reply, metrics)
    return list(good.values())
