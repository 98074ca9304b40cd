"""FedDDPM's warm-up, the exchange before the first round: `WarmupPhase`.

Every node of the node table trains its own DDPM from the run's initial model for the warm-up's epochs (or its
steps: `WarmupSettings`) and uploads it once; the server checks the warm models and samples the auxiliary set A
from them (|A_i| = aux-fraction * m_i images from node i's model, m_i capped at `max-weight-share` of the total).
The exchange has the shape of Flower's `configure_train` / `aggregate_train` around one
`grid.send_and_receive` (`FedDDPM.warmup` drives it): `configure(arrays, grid)` -> one TRAIN message per node,
`aggregate(replies)` -> the warm-up's record, with A kept on the strategy (`auxiliary`, `aux_counts`) and the
record in its round log.

A collaborator rather than methods of FedDDPM, so that the strategy's class shows its algorithm; it holds the
exchange's own state (the messages sent, the initial model they carried, the start time) and reads the
strategy's settings (`warmup_epochs`, `aux_fraction`, ...) when it runs. torch is imported by the sampling only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.algorithms.local_training_settings import ROUND_LR_KEY, round_lr_entry
from common.keys import message_config
from common.models.diffusion_settings import WarmupSettings
from common.protocol import DIFFUSION_PHASE, MODEL, WARMUP_PHASE
from common.records import Weights, check_weights, from_record, load_weights, message_array_bytes, to_record
from common.run.progress import Progress
from common.run.task import make_model
from server_app.influence import capped_counts
from server_app.messaging import match_replies, misaddressed_replies, sender_mismatch
from server_app.reply_checks import check_train_metrics
from server_app.strategies.round_log import Failure, PhaseEntry
from server_app.wire import with_fedsynth_metric_names

class WarmupOwner(Protocol):
    """What the warm-up reads and writes on FedDDPM (its settings, its node table, the auxiliary set it keeps): a
    Protocol, so that this module does not import FedDDPM's (which imports it)."""

    aux_counts: Any
    aux_sampler: str
    auxiliary: Any
    device: str
    diffusion: Any  # server_app.strategies.server_training.DiffusionTraining
    lr_schedule: Any  # Callable[[int], float] | None
    max_weight_share: float
    min_nodes: int
    node_table: Any  # server_app.strategies.node_table.NodeTable
    round_log: Any  # server_app.strategies.round_log.RoundLog
    seed: int
    task: Any  # common.run.task.ServerTask
    train_config: dict[str, Any]
    warmed_up: bool

    def _refresh_nodes(self, grid: Any) -> Any: ...

_AUX_STREAM = 21  # fourth seed component of the auxiliary set's samples (FedDDPM's correction: 22)


class WarmupFailed(RuntimeError):
    """Fewer than min-nodes nodes returned a usable warm model."""


def auxiliary_count(num_examples: int, fraction: float) -> int:
    """|A_i| = aux-fraction * m_i, rounded half up, at least one image per node that has data."""
    if num_examples <= 0:
        return 0
    return max(1, math.floor(fraction * num_examples + 0.5))


class WarmupPhase:
    """FedDDPM's warm-up exchange for `strategy` (see the module's docstring)."""

    def __init__(self, strategy: WarmupOwner) -> None:
        self.strategy = strategy
        self.sent: list[Message] = []   # configure's messages, which aggregate's replies answer
        self.initial: Weights = {}      # the model they carried: a warm model must have its names and shapes
        self.started = 0.0              # when configure ran (the record's times)

    def length(self) -> str:
        """The warm-up's steps, or its epochs when it counts none, for logs."""
        s = self.strategy
        warmup = s.diffusion
        return f"{warmup.warmup_steps} steps" if warmup.warmup_steps else f"{warmup.warmup_epochs} epochs"

    def configure(self, arrays: ArrayRecord, grid: Grid) -> list[Message]:
        """One TRAIN message per node of the node table: the run's initial model and the warm-up's config.

        Content: `RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 0, "phase": "warmup",
        <the warm-up's length>, **round_lr_entry(...)})})`, beside `start()`'s `train_config` (fedsynth's app puts
        the local training recipe there: the batch size, the optimizer, ...); the length is `WarmupSettings`' fields
        under their run-config keys (common/models/diffusion_settings.py), its epochs and its steps. A node answers
        it as a train message, except that it trains its own DDPM from `arrays` for the warm-up's steps (0: its
        epochs) at the learning rate of `lr()` (round 1's: `lr_schedule(1)`, else `start()`'s `train_config`'s;
        absent when neither is given) and replies with that model (see `aggregate`).
        """
        s = self.strategy
        s._refresh_nodes(grid)
        self.started = time.monotonic()
        self.initial = from_record(arrays)
        record = to_record(self.initial)
        config = {**s.train_config, "server-round": 0, DIFFUSION_PHASE: WARMUP_PHASE,
                  **message_config(WarmupSettings, s.diffusion), **self.lr()}
        messages = [
            Message(RecordDict({MODEL: record, "config": ConfigRecord(config)}), dst_node_id=node.node_id,
                    message_type=MessageType.TRAIN)
            for node in s.node_table.nodes
        ]
        log(INFO, "warmup: %d nodes train their own DDPM for %s", len(messages), self.length())
        self.sent = messages
        return messages

    def lr(self) -> dict[str, float]:
        """The warm-up's learning-rate entry: round 1's rate of the schedule, else `start()`'s train config's, else
        none."""
        s = self.strategy
        if s.lr_schedule is not None:
            return round_lr_entry(s.lr_schedule(1))
        return round_lr_entry(float(s.train_config[ROUND_LR_KEY])) if ROUND_LR_KEY in s.train_config else {}

    def aggregate(self, replies: Iterable[Message]) -> dict[str, Any]:
        """Check the warm models that came back and sample the auxiliary set A from them; returns the record.

        A usable reply is a train reply `RecordDict({"arrays": ArrayRecord(the warm model: the names, shapes and
        dtypes of the initial one, finite), "metrics": MetricRecord({"num-examples": int in 1..the node's handshake
        count, "train-loss" (or Flower's "train_loss"): float, "partition-id": int, required after a
        handshake})})`.
        Error replies, unusable ones and nodes that did not answer within `warmup-timeout` are dropped and listed
        in the record's "failures"; fewer than `min-nodes` warm models raise WarmupFailed. The record (round 0,
        phase "warmup") also goes to the round log (`round_log.phases`, with A) for the results folder.
        """
        s = self.strategy
        replies = list(replies)
        partition_of_node = {n.node_id: n.partition_id for n in s.node_table.nodes}
        warm: list[tuple[int, int, Weights, float]] = []
        failures: list[dict[str, Any]] = []
        pairs, unanswered = match_replies(self.sent, replies)
        for message, reply in pairs:
            node_id = message.metadata.dst_node_id  # the SuperLink answers for a lost node
            if not reply.has_error() and "metrics" in reply.content.metric_records:
                # a reply in Flower's template names (train_loss) is read in fedsynth's, as a round's is
                reply.content["metrics"] = with_fedsynth_metric_names(reply.content.metric_records["metrics"])
            reason, weights = self.check_reply(reply, self.initial)
            mismatch = sender_mismatch(message, reply)  # another node's reply is not this node's warm model
            reason = f"{mismatch}: dropped" if mismatch is not None else reason
            if reason is not None:
                failures.append({"node": node_id, "partition": partition_of_node.get(node_id), "reason": reason})
                continue
            metrics = reply.content.metric_records["metrics"]
            warm.append((partition_of_node[node_id], int(metrics["num-examples"]), weights, float(metrics["train-loss"])))
        failures += [{"node": m.metadata.dst_node_id, "partition": partition_of_node.get(m.metadata.dst_node_id),
                      "reason": "timeout"} for m in unanswered]
        failures += [{"node": r.metadata.src_node_id, "partition": partition_of_node.get(r.metadata.src_node_id),
                      "reason": f"{sender_mismatch(m, r)}, which that node answered itself: dropped"}
                     for m, r in misaddressed_replies(self.sent, replies, pairs)]
        for failure in failures:
            log(WARNING, "warmup: dropped node %s (partition %s): %s", failure["node"], failure["partition"], failure["reason"])
        if len(warm) < s.min_nodes:
            raise WarmupFailed(f"only {len(warm)} node(s) returned a warm model, fewer than min-nodes="
                               f"{s.min_nodes}; failures: {failures[:3]}. A node answers the warm-up (a train "
                               "message whose config has phase = 'warmup') with RecordDict({'arrays': its warm model, "
                               "'metrics': {'num-examples': m_i, 'train-loss': float}}); "
                               "fedsynth.client.warmup_reply(msg, model, num_examples=m_i, train_loss=l) builds it")
        warm.sort(key=lambda item: item[0])
        start = self.started
        train_time = time.monotonic() - start
        s.auxiliary = self.sample_auxiliary([(pid, m, w) for pid, m, w, _ in warm])
        s.warmed_up = True
        values = {"train-loss": float(np.mean([loss for *_, loss in warm])), "aux-size": int(len(s.auxiliary)),
                  "warmup-time": train_time, "aux-sampling-time": time.monotonic() - start - train_time}
        entry = PhaseEntry(phase=WARMUP_PHASE, sampled=len(self.sent), answered=len(warm),
                           failures=tuple(Failure.of(f) for f in failures),
                           uplink_bytes=sum(message_array_bytes(r) for r in replies),
                           downlink_bytes=sum(message_array_bytes(m) for m in self.sent),
                           values=values, duration=time.monotonic() - start, product=s.auxiliary)
        s.round_log.add_phase(entry)
        log(INFO, "warmup done: auxiliary set of %d images (%s) in %.1fs", len(s.auxiliary),
            s.aux_sampler.label, entry.duration)
        return entry.as_record()

    def check_reply(self, reply: Message, initial: Weights) -> tuple[str | None, Weights]:
        """(why a warm-up reply is unusable or None, its warm model {name: array} or {} when unusable)."""
        s = self.strategy
        if reply.has_error():
            return f"error: {reply.error.reason}", {}
        content = reply.content
        if MODEL not in content.array_records:
            return "warmup reply lacks the model", {}
        node = next((n for n in s.node_table.nodes if n.node_id == reply.metadata.src_node_id), None)
        if node is None:
            return "warmup reply from a node that did not complete the handshake", {}
        handshake = s.node_table.from_handshake
        reason = check_train_metrics(content.metric_records.get("metrics"),
                                     node.partition_id if handshake else None, node.num_train_examples,
                                     max_test_examples=node.num_test_examples, partition_required=handshake)
        if reason is not None:
            return f"warmup {reason}", {}
        try:
            weights = from_record(content.array_records[MODEL])
        except Exception as err:  # noqa: BLE001 - a reply must never crash the server
            return f"malformed warm model ({type(err).__name__}: {err})", {}
        problem = check_weights(weights, initial, "warm model")
        return problem, weights

    def sample_auxiliary(self, warm: list[tuple[int, int, Weights]]) -> np.ndarray:
        """A = union of |A_i| samples of each node's warm model (ancestral sampler unless `aux-sampler` says otherwise)."""
        s = self.strategy
        from common.models.diffusion import image_shape, sample, seeded_generator

        model = make_model(s.task).to(s.device)
        spec, shape = s.aux_sampler, image_shape(s.task)
        parts = []
        # |A_i| scales with the count node i claims: no node's count above max-weight-share of the total,
        # so one node's claim cannot make the server sample without end (server_app/influence.py)
        claims = capped_counts([num_examples for _, num_examples, _ in warm], s.max_weight_share)
        counts = [auxiliary_count(int(claim), s.diffusion.aux_fraction) for claim in claims]
        progress = Progress("auxiliary set", sum(counts), "images")
        progress.start(f" to sample from {len(warm)} warm models ({spec.label}; per node: {counts})")
        for (partition_id, _, weights), count in zip(warm, counts):
            load_weights(model, weights)
            model.to(s.device)
            parts.append(sample(model, spec, count, shape, seeded_generator(s.seed, partition_id, 0, _AUX_STREAM),
                                s.device, on_batch=progress.advance))
            s.aux_counts[partition_id] = count
        return np.concatenate(parts).astype(np.float32)
