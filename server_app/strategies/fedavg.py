"""FedAvg as a Flower Message-API strategy, and the base of every centralized strategy.

Differences from Flower's own FedAvg, each for a reason in SPEC:
- nodes are sampled with a generator seeded by (seed, round) over the partition
  ids learned in the start-of-run handshake, so sampling is reproducible (Flower
  samples node ids with Python's `random`);
- each reply is checked against the global model before aggregation (names,
  shapes, dtypes, finite values); a bad reply is dropped, never averaged in;
- replies are summed in partition order, so results are bitwise reproducible;
- the server applies `w + server_lr * mean(w_i - w)`, weighted by sample count or
  uniformly (`aggregation`), and subclasses change only `downlink_records`,
  `check_extra_records` and `server_step`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from common.config import RunConfig
from common.protocol import CLIENT_STAT_PREFIX, MODEL, NODE_STATE_PREFIX
from common.records import Weights, check_weights, from_record, message_array_bytes, to_record
from common.uplink import compression_spec, decode_reply
from server_app.fid_reference import ClientFeatureReference
from server_app.influence import bounded_weights
from server_app.robust import ROBUST_AGGREGATIONS, clip_update, combine_updates, update_norm
from server_app.strategies.node_models import NodeModels

if TYPE_CHECKING:
    from common.results import RunResults


@dataclass(frozen=True)
class NodeInfo:
    """What the handshake learned about one node."""

    node_id: int
    partition_id: int
    num_train_examples: int
    num_test_examples: int
    name: str = ""  # node config `name` (partition = node: the site's label in logs and results)


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


def weighted_mean(values: list[Weights], weights: list[float]) -> Weights:
    """sum_i p_i * values_i with p normalised, accumulated in float64, returned as float32."""
    total = float(sum(weights))
    return {
        name: (sum(v[name].astype(np.float64) * (w / total) for v, w in zip(values, weights))).astype(np.float32)
        for name in values[0]
    }


class FedAvgStrategy(Strategy):
    """FedAvg (McMahan et al., 2017): the sampled clients' models averaged on the server."""

    def __init__(self, cfg: RunConfig, nodes: list[NodeInfo]) -> None:
        self.cfg = cfg
        self.nodes = sorted(nodes, key=lambda n: n.partition_id)
        self.current: Weights = {}
        self.restore_pending: set[int] = set()
        self.node_models = NodeModels(cfg)
        self.feature_reference = ClientFeatureReference(cfg, self.nodes)  # FID without server data (diffusion task)

    # ----- hooks for subclasses -------------------------------------------------
    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        """Extra records sent with the model (SCAFFOLD's c, the previous update, ...)."""
        return {}

    def check_extra_records(self, content: RecordDict) -> str | None:
        """Why a reply's algorithm-specific records are unusable, or None."""
        return None

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        """The new global model from the mean client update."""
        lr = self.cfg.server_lr
        return {name: (self.current[name] + lr * mean_delta[name]).astype(np.float32) for name in self.current}

    def stop_requested(self) -> bool:
        """True once the algorithm has finished before num-server-rounds (FedDDPM+ after its correction)."""
        return False

    def run(self, grid: Grid, results: "RunResults") -> dict[str, Any]:
        """Run the whole federation with this strategy (the ServerApp's entry point).

        Centralized strategies use the shared round loop; a scheme with another
        round structure (decentralized relaying) provides its own `run`.
        """
        from server_app.loop import run_rounds

        return run_rounds(grid, self.cfg, self, results)

    # ----- server state that a checkpoint must keep ---------------------------------
    def state_arrays(self) -> dict[str, Weights]:
        """Algorithm state beyond the global model, as named groups of arrays.

        Subclasses with server state (momentum, control variates, trajectories,
        auxiliary data) return it here and restore it in `load_state_arrays`;
        checkpoints store these groups without pickling.
        """
        return {}

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        """Restore what `state_arrays` returned."""

    def state_meta(self) -> dict[str, Any]:
        """JSON-serialisable scalar state (counters, EMA values, flags)."""
        return {}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        """Restore what `state_meta` returned."""

    def node_state_records(self, partition_id: int) -> dict[str, ArrayRecord]:
        """Node state the server can rebuild for a node (e.g. SCAFFOLD's c_i), sent after a resume.

        A resumed simulation starts with empty `Context.state` on every node; the
        records returned here reach each node with its first message after the
        resume, and the ClientApp writes them into its state.
        """
        return {}

    def checkpoint_arrays(self) -> dict[str, Weights]:
        """Every array group a checkpoint keeps: the algorithm's state, the nodes' kept models, FID's reference."""
        return {**self.state_arrays(), **self.node_models.arrays(), **self.feature_reference.arrays()}

    def load_checkpoint_arrays(self, groups: Mapping[str, Weights]) -> None:
        """Restore what `checkpoint_arrays` returned."""
        self.load_state_arrays(self.node_models.load(self.feature_reference.load(groups)))

    def on_resume(self) -> None:
        """Called once after a checkpoint was loaded: schedule node state to be re-sent."""
        self.restore_pending = {node.partition_id for node in self.nodes}

    # ----- Strategy API -----------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """One message per sampled node: the global model, the round's config and extra records."""
        self.current = from_record(arrays)
        extra = self.downlink_records(server_round)
        messages = []
        for node in sample_nodes(self.nodes, self.cfg.fraction_train, self.cfg.seed, server_round):
            content = RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "server-round": server_round})})
            for name, record in extra.items():
                content[name] = record
            if node.partition_id in self.restore_pending:
                restored = {**self.node_state_records(node.partition_id), **self.node_models.records(node.partition_id)}
                for name, record in restored.items():
                    content[f"{NODE_STATE_PREFIX}{name}"] = record
            messages.append(Message(content, dst_node_id=node.node_id, message_type=MessageType.TRAIN))
        return messages

    def check_reply(self, reply: Message) -> str | None:
        """Why a train reply must be dropped, or None when it can be aggregated."""
        content = reply.content
        size, limit = message_array_bytes(reply), self.max_reply_bytes()
        if size > limit:
            return f"reply of {size} bytes is oversized (limit {limit} bytes, 3x the model)"
        if "metrics" not in content.metric_records:
            return "reply lacks the 'metrics' record"
        num_examples = content.metric_records["metrics"].get("num-examples")
        if not isinstance(num_examples, int) or num_examples <= 0:
            return f"reply metric 'num-examples' = {num_examples!r} is not a positive integer"
        try:
            delta = self.client_delta(reply)
        except ValueError as err:  # a missing, mis-shaped, mistyped or non-finite model or payload
            return str(err)
        bound = self.cfg.max_update_norm
        if bound > 0 and self.cfg.update_norm_action == "refuse" and (norm := update_norm(delta)) > bound:
            return f"update norm {norm:.4g} exceeds max-update-norm = {bound:g}"
        return self.check_extra_records(content)

    def client_delta(self, reply: Message) -> Weights:
        """The reply's update w_i - w: its model minus the global one, or its decoded compressed update.

        Compressed extra records are decoded in place first, so `check_extra_records`
        and `server_step` read them as if uncompressed (common/uplink.py). Raises
        ValueError naming the fault.
        """
        return decode_reply(reply.content, self.current, compression_spec(self.cfg))

    def max_reply_bytes(self) -> int:
        """Replies larger than this are refused before being decoded (3x the model, plus 1 MiB)."""
        return 3 * sum(w.nbytes for w in self.current.values()) + (1 << 20)

    def aggregation_weights(self, replies: list[Message]) -> list[float]:
        """Sample counts (`weighted`), no share above `max-weight-share` (server_app/influence.py), or ones (`uniform`)."""
        if self.cfg.aggregation != "weighted":
            return [1.0] * len(replies)
        counts = [float(r.content.metric_records["metrics"]["num-examples"]) for r in replies]
        return bounded_weights(counts, self.cfg.max_weight_share)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the updates of checked replies (in partition order) and take the server step."""
        replies = sorted(replies, key=partition_of)
        if not replies:
            return None, None
        self.restore_pending -= {partition_of(r) for r in replies}
        deltas = [self.client_delta(r) for r in replies]
        if self.node_models.keys:  # the uplink is uncompressed: each reply holds the node's model
            for reply in replies:
                self.node_models.keep(partition_of(reply), from_record(reply.content.array_records[MODEL]))
        if self.cfg.max_update_norm > 0:  # "refuse" dropped the longer ones in check_reply; "clip" scales them
            deltas = [clip_update(d, self.cfg.max_update_norm) for d in deltas]
        if self.cfg.aggregation in ROBUST_AGGREGATIONS:
            mean_delta = combine_updates(deltas, self.cfg.aggregation, self.cfg.trim_fraction, self.cfg.byzantine_nodes)
        else:
            mean_delta = weighted_mean(deltas, self.aggregation_weights(replies))
        self.current = self.server_step(mean_delta, replies)
        return to_record(self.current), aggregate_metrics(replies, self.cfg.max_weight_share)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Every node evaluates the model on its local test split."""
        return [
            Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "server-round": server_round})}),
                    dst_node_id=node.node_id, message_type=MessageType.EVALUATE)
            for node in self.nodes
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Test-sample weighted local accuracy and loss (no node's share above `max-weight-share`)."""
        metrics = checked_evaluate_metrics(self.nodes, replies)
        if not metrics:
            return None
        return MetricRecord({**local_test_summary(metrics, self.cfg.max_weight_share), "num-nodes": len(metrics)})

    def summary(self) -> None:
        """Log what this strategy will do."""
        log(INFO, "%s: %d nodes, fraction-train %.2f, aggregation %s, server-lr %g",
            type(self).__name__, len(self.nodes), self.cfg.fraction_train, self.cfg.aggregation, self.cfg.server_lr)


def checked_evaluate_metrics(nodes: list[NodeInfo], replies: Iterable[Message]) -> list[MetricRecord]:
    """The metrics of the evaluate replies whose every field checks out and that have test examples.

    One reply per known node; a malformed one is logged and left out (server_app/reply_checks.py).
    """
    from server_app.reply_checks import check_evaluate_metrics

    node_of = {n.node_id: n for n in nodes}
    good: dict[int, MetricRecord] = {}
    for reply in replies:
        node = node_of.get(reply.metadata.src_node_id)
        if node is None or node.node_id in good or reply.has_error():
            continue
        metrics = reply.content.metric_records.get("metrics")
        reason = check_evaluate_metrics(metrics, node.partition_id, node.num_test_examples)
        if reason is not None:
            log(WARNING, "final evaluation: dropped the reply of node %s (partition %s): %s",
                node.node_id, node.partition_id, reason)
        elif metrics["num-examples"] > 0:
            good[node.node_id] = metrics
    return list(good.values())


def partition_of(reply: Message) -> int:
    """The partition id a reply reports (for a fixed aggregation order)."""
    return int(reply.content.metric_records["metrics"].get("partition-id", 0))


def weighted_metric(values: Iterable[float], counts: Iterable[float], max_share: float) -> float:
    """The count-weighted mean of a reported metric, no node's share above `max_share` (server_app/influence.py)."""
    weights = np.array(bounded_weights(list(counts), max_share), dtype=np.float64)
    return float(np.sum(np.array(list(values), dtype=np.float64) * weights) / weights.sum())


def local_test_summary(metrics: list[Mapping[str, Any]], max_share: float) -> dict[str, float]:
    """Test-count weighted local accuracy and loss of evaluate replies, with their min and max accuracy."""
    counts = [m["num-examples"] for m in metrics]
    accuracy = [m["local-test-accuracy"] for m in metrics]
    return {
        "local-test-accuracy": weighted_metric(accuracy, counts, max_share),
        "local-test-loss": weighted_metric([m["local-test-loss"] for m in metrics], counts, max_share),
        "local-test-accuracy-min": float(min(accuracy)),
        "local-test-accuracy-max": float(max(accuracy)),
    }


def reply_metric_means(metrics: list[Mapping[str, Any]], max_share: float) -> dict[str, float]:
    """Sample-weighted train loss and test-count weighted local test accuracy of train replies (capped shares)."""
    out = {"train-loss": weighted_metric([m["train-loss"] for m in metrics], [m["num-examples"] for m in metrics],
                                         max_share)}
    tested = [m for m in metrics if m.get("num-test-examples", 0) > 0]
    if tested:
        out["local-test-accuracy"] = weighted_metric([m["local-test-accuracy"] for m in tested],
                                                     [m["num-test-examples"] for m in tested], max_share)
    return out


def aggregate_metrics(replies: list[Message], max_share: float) -> MetricRecord:
    """Sample-weighted train loss and the received global model's local test accuracy (capped shares)."""
    metrics = [r.content.metric_records["metrics"] for r in replies]
    out: dict[str, Any] = {**reply_metric_means(metrics, max_share),
                           "num-examples": int(sum(m["num-examples"] for m in metrics))}
    # Per-client statistics a rule reports (FedCOG's generation time): mean and max over the replies.
    for key in sorted({k for m in metrics for k in m.keys() if k.startswith(CLIENT_STAT_PREFIX)}):
        values = np.array([float(m[key]) for m in metrics if key in m], dtype=np.float64)
        out[key], out[f"{key}-max"] = float(values.mean()), float(values.max())
    return MetricRecord(out)
