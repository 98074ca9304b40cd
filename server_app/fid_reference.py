"""FID's reference statistics without real images on the server: the nodes' pooled feature sums.

FID compares a Gaussian fit of the generated images' features with one of the
real images' features (common/metrics/fid.py). When the server holds no images
(`partition = "node"`), or FedDDPM+'s QuickTest is told to use the clients'
data (`quicktest-reference = "clients"`), the server asks every node once with
the `fid_stats` query for (sum f, sum f f^T, n) of its training images'
features under the run's extractor; the sums add up across nodes to exactly
the mean and covariance of the pooled features (`stats_from_sums`), so the FID
against them equals the FID against the pooled images up to round-off.

The extractor must compute the same features on every node: the server sends
the weights of the classifier or random extractor with the query (common/
fid_features.py); Inception is loaded by each node from its own weights file.

The statistics are gathered once per run, at the first evaluation that needs
them (FedDDPM+'s first QuickTest inside `aggregate_train`, or the results'
FID in `start()`'s `evaluate_fn`), and kept in the server's checkpoints
(`arrays` / `load`), so a resumed run does not ask again. The query is a phase
in the shape of Flower's `configure_train` / `aggregate_train`:
`ClientFeatureReference.configure_fid_stats` builds one `query.fid_stats`
message per node, `ClientFeatureReference.get` sends them with one call of the
grid's own `grid.send_and_receive(messages, timeout=round-timeout)`, and
`aggregate_fid_stats` pools the usable replies (a node answers with
`RecordDict({"fid-sums": ArrayRecord({"sum-f", "sum-ff"}), "metrics":
MetricRecord({"num-examples": n})})`). With this reference the run reports FID only: KID's
cubic-kernel MMD would need, besides these sums, each node's sum of third
tensor powers of its features (d^3 = 2.1 million numbers at d = 128, about six
times the unet-small model, and the third moments of the site's features), too
much to send for a second score of the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.metrics.fid import GaussianStats, stats_from_sums
from common.protocol import FID_EXTRACTOR, FID_STATS, FID_SUMS
from common.records import Weights, from_record, message_array_bytes, to_record
from common.run.interrupt import raise_if_stopped
from server_app.messaging import match_replies, sender_mismatch
from server_app.reply_checks import is_int

if TYPE_CHECKING:  # the extractors are torch's: imported where one is used, so FedAvg's import does not load torch
    from common.metrics.fid_features import FeatureExtractor

GROUP = "fid-reference"  # the checkpoint group


class NoFeatureSums(RuntimeError):
    """No node returned usable feature sums."""


class _Node(Protocol):
    node_id: int
    num_train_examples: int


@dataclass(frozen=True)
class Gathered:
    """What one `fid_stats` query round brought: the pooled statistics and what it cost."""

    stats: GaussianStats
    nodes: int
    bytes: int


def check_feature_sums(reply: Message, dim: int | None,
                       max_examples: int | None = None) -> tuple[str | None, Weights, int]:
    """(why unusable or None, {sum-f, sum-ff}, n) of a node's `fid_stats` reply; n at most `max_examples`."""
    if reply.has_error():
        return f"error: {reply.error.reason}", {}, 0
    record = reply.content.array_records.get(FID_SUMS)
    metrics = reply.content.metric_records.get("metrics")
    if record is None or metrics is None:
        return f"reply lacks '{FID_SUMS}' or 'metrics'", {}, 0
    sums = from_record(record)
    n = metrics.get("num-examples")
    if set(sums) != {"sum-f", "sum-ff"} or not is_int(n) or n < 0:
        return "malformed feature sums", {}, 0
    if max_examples is not None and n > max_examples:
        return f"'num-examples' = {n} exceeds the node's {max_examples} training examples", {}, 0
    d = sums["sum-f"].shape[0] if sums["sum-f"].ndim == 1 else -1
    if d < 1 or sums["sum-ff"].shape != (d, d) or (dim is not None and d != dim):
        return f"feature sums of shapes {sums['sum-f'].shape} and {sums['sum-ff'].shape}", {}, 0
    if not (np.all(np.isfinite(sums["sum-f"])) and np.all(np.isfinite(sums["sum-ff"]))):
        return "non-finite feature sums", {}, 0
    return None, sums, n


def feature_dim(extractor: FeatureExtractor, image_shape: tuple[int, int, int]) -> int:
    """Width of the extractor's features (of one blank image of the run's shape)."""
    return int(extractor.features(np.zeros((1, *image_shape), dtype=np.float32)).shape[1])


class ClientFeatureReference:
    """The nodes' pooled feature statistics of one run: asked for once, then kept (and checkpointed)."""

    def __init__(self, nodes: Sequence[_Node], timeout: float) -> None:
        self.nodes = nodes
        self.timeout = timeout  # seconds the query waits for the nodes' sums (fedsynth's app: round-timeout)
        self.stats: GaussianStats | None = None
        self._sent: list[Message] = []   # configure_fid_stats's messages, which aggregate_fid_stats's replies answer
        self._dim = 0                    # the extractor's feature width: the shape every node's sums must have
        self._extractor_name = ""

    def get(self, grid: Grid | None, extractor: FeatureExtractor,
            image_shape: tuple[int, int, int]) -> tuple[GaussianStats, dict[str, Any]]:
        """(the statistics, the gathering's metrics: empty unless this call asked the nodes).

        The first call is the `fid_stats` phase: `configure_fid_stats`, one `grid.send_and_receive` (Flower's
        call, with `timeout`: fedsynth's app gives `round-timeout`), `aggregate_fid_stats`; later calls, and a resumed run's, return the kept
        statistics.
        """
        if self.stats is not None:
            return self.stats, {}
        if grid is None:
            raise RuntimeError("the nodes' feature sums need the grid")
        raise_if_stopped()
        messages = list(self.configure_fid_stats(extractor, image_shape))
        gathered = self.aggregate_fid_stats(grid.send_and_receive(messages, timeout=self.timeout))
        self.stats = gathered.stats
        return self.stats, {"fid-reference-nodes": gathered.nodes, "fid-reference-images": gathered.stats.count,
                            "fid-reference-bytes": gathered.bytes}

    def configure_fid_stats(self, extractor: FeatureExtractor, image_shape: tuple[int, int, int]) -> Iterable[Message]:
        """One `query.fid_stats` message per node, asking for the feature sums of its training images.

        Content: `RecordDict({"config": ConfigRecord({"fid-features": extractor name}), "fid-extractor":
        ArrayRecord(the extractor's weights; only for the classifier and random extractors, which travel)})`.
        """
        from common.metrics.fid_features import TRAVELLING_EXTRACTORS, extractor_weights

        self._dim = feature_dim(extractor, image_shape)
        weights = to_record(extractor_weights(extractor)) if extractor.name in TRAVELLING_EXTRACTORS else None
        messages = []
        for node in self.nodes:
            content = RecordDict({"config": ConfigRecord({"fid-features": extractor.name})})
            if weights is not None:
                content[FID_EXTRACTOR] = weights
            messages.append(Message(content, dst_node_id=node.node_id, message_type=f"query.{FID_STATS}"))
        self._sent = messages
        self._extractor_name = extractor.name
        return messages

    def aggregate_fid_stats(self, replies: Iterable[Message]) -> Gathered:
        """Pool the usable replies to `configure_fid_stats`'s messages into the nodes' feature statistics.

        A usable reply: `RecordDict({"fid-sums": ArrayRecord({"sum-f": (d,), "sum-ff": (d, d)}, finite, d the
        extractor's width), "metrics": MetricRecord({"num-examples": n, at most the node's handshake count})})`.
        Others, and nodes that did not answer, are left out with a warning; no usable reply (or fewer than 2
        images in all) raises NoFeatureSums.
        """
        replies, dim, messages = list(replies), self._dim, self._sent
        sum_f, sum_ff, count, used = np.zeros(dim), np.zeros((dim, dim)), 0, 0
        node_of = {n.node_id: n for n in self.nodes}
        for message, reply in match_replies(messages, replies)[0]:
            node = node_of[message.metadata.dst_node_id]
            try:
                problem = sender_mismatch(message, reply)
                if problem is None:
                    problem, sums, n = check_feature_sums(reply, dim, node.num_train_examples)
            except Exception as err:  # noqa: BLE001 - a reply must never crash the server
                problem, sums, n = f"malformed reply ({type(err).__name__}: {err})", {}, 0
            if problem is not None:
                log(WARNING, "FID reference: dropped node %s: %s", node.node_id, problem)
                continue
            sum_f, sum_ff, count, used = sum_f + sums["sum-f"], sum_ff + sums["sum-ff"], count + n, used + 1
        if used == 0 or count < 2:
            raise NoFeatureSums(f"no usable feature sums from the {len(messages)} nodes for FID's reference "
                                f"({used} answered, {count} images)")
        if used < len(messages):
            log(WARNING, "FID reference: %d of %d nodes' images (the others did not answer usably)", used,
                len(messages))
        log(INFO, "FID reference: feature sums of %d images from %d nodes (%s features)", count, used,
            self._extractor_name)
        spent = sum(message_array_bytes(m) for m in messages) + sum(message_array_bytes(r) for r in replies)
        return Gathered(stats_from_sums(sum_f, sum_ff, count), used, spent)

    def asker(self, grid: Grid) -> Callable[[FeatureExtractor, tuple[int, int, int]],
                                            tuple[GaussianStats, dict[str, Any]]]:
        """`get` bound to the run's grid (what the diffusion evaluator calls)."""
        return lambda extractor, image_shape: self.get(grid, extractor, image_shape)

    def arrays(self) -> dict[str, Weights]:
        """The checkpoint group of the statistics (none before they were gathered)."""
        if self.stats is None:
            return {}
        return {GROUP: {"mean": self.stats.mean, "cov": self.stats.cov,
                        "count": np.asarray([self.stats.count], dtype=np.int64)}}

    def load(self, groups: Mapping[str, Weights]) -> dict[str, Weights]:
        """Restore the statistics from checkpoint groups; returns the other groups."""
        group = groups.get(GROUP)
        if group is not None:
            self.stats = GaussianStats(np.asarray(group["mean"], dtype=np.float64),
                                       np.asarray(group["cov"], dtype=np.float64), int(np.asarray(group["count"])[0]))
        return {name: arrays for name, arrays in groups.items() if name != GROUP}
