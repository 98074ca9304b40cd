"""The means of the metrics nodes report: count-weighted, no node's share above the weight cap.

The round's train loss and local test accuracy, and the evaluation of every node, are means of what the nodes
claim; each is weighted by the node's example count, capped as bounded influence says (server_app/influence.py;
a cap of 1 leaves the plain count-weighted mean). Split from base.py, which uses them.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord
from flwr.common.logger import log

from server_app.influence import bounded_weights
from server_app.reply_checks import check_evaluate_metrics
from server_app.strategies.node_table import NodeInfo
from server_app.wire import WEIGHTED_BY_KEY, with_fedsynth_metric_names, with_flower_metric_names


def weighted_metric(values: Iterable[float], counts: Iterable[float], max_share: float) -> float:
    """The count-weighted mean of a reported metric, no node's share above `max_share` (server_app/influence.py)."""
    weights = np.array(bounded_weights(list(counts), max_share), dtype=np.float64)
    return float(np.sum(np.array(list(values), dtype=np.float64) * weights) / weights.sum())


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
