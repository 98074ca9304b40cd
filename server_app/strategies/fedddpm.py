"""FedDDPM (Peng et al., "Federated Learning for Diffusion Models"): server-side correction, and the warm-up and
auxiliary set FedDDPM+ shares (FedDDPM+'s QuickTest and one-shot correction: server_app/strategies/fedddpm_plus.py).

Both start with a **warmup**: every node trains its own DDPM on its local data
for `warmup-epochs` (from the run's initial model) and uploads it once. The
server draws `|A_i| = aux-fraction * m_i` images from node i's warm model
(m_i: the sample count the node reports, none above `max-weight-share` of
their total, so a false claim cannot make the server sample without end) and keeps their union, the
**auxiliary set** A, which approximates the global data distribution. A lives
in this strategy object only: it is never put in a message (tests check every
message sent), and it is checkpointed with the server state
(`state_arrays` / `state_meta`), so a resumed run neither repeats the warmup
nor loses A. Rounds then start from the initial model w_0, as in Algorithm 1.

- **FedDDPM** (Algorithm 1): FedAvg rounds (the paper averages uniformly:
  `aggregation = "uniform"`), and after every aggregation `correction-epochs`
  epochs of the DDPM loss on A with learning rate `correction-lr`.
- **FedDDPM+** (Algorithms 2, 3): the same warm-up, plain FedAvg rounds, QuickTest and one correction
  (server_app/strategies/fedddpm_plus.py).

**The phases outside the rounds.** Each exchange that is not a round is a
pair of methods in the shape of Flower's `configure_train` / `aggregate_train`,
driven by one call of the grid's own `grid.send_and_receive(messages,
timeout=...)`, the call Flower's `start()` makes for a round (fedsynth's
ServerApp hands `start()` a `PollingGrid`, server_app/messaging.py):

- the warm-up: `configure_warmup(arrays, grid)` -> one TRAIN message per node,
  `RecordDict({"arrays": the initial model, "config": ConfigRecord(
  {"server-round": 0, "phase": "warmup"})})`; `aggregate_warmup(replies)`
  checks the warm models (a train reply: "arrays" with the initial model's
  names, shapes and dtypes; "metrics" with "num-examples" and "train-loss",
  or Flower's "train_loss"), drops bad and missing replies into the record's
  failures and samples A.
  `warmup` drives the pair, with `warmup-timeout`, from the first active
  `configure_train`: the one hook that Flower's `start()`, a wrapper strategy
  (Flower's DP wrappers are refused: flower_wrappers.py) and a hand-written
  round loop all call, so it runs once per run, after `start()`'s round-0 `evaluate_fn` and
  before round 1 samples its nodes. A resumed run (`completed_rounds > 0`)
  skips it and has A from the checkpoint.
- FedDDPM+'s `quicktest-reference = "clients"`: the `fid_stats` query,
  `ClientFeatureReference.configure_fid_stats` / `aggregate_fid_stats`
  (server_app/fid_reference.py), driven with `round-timeout` by its `get` at
  the first QuickTest (inside round 1's `aggregate_train`, with the grid of
  that round's `configure_train`) unless the run's FID evaluation asked first;
  the statistics are kept and checkpointed, so it runs once per run.

A Flower developer's ClientApp answers the warm-up like any train message: a
node that ignores "phase" trains as in a round, and its reply is its warm model.

The auxiliary set is drawn with the ancestral sampler, as in the paper
(`aux-sampler`; DDIM for quick checks), whatever sampler the evaluation uses.

The server's epochs use the optimizer of the clients' local training
(`local-optimizer`; Adam for the diffusion task by default): the paper's server
and client rates (5e-5, 2e-4) are Adam-scale rates for DDPMs, where plain SGD
at 5e-5 would leave the model unchanged.

torch and the diffusion task (common/models/diffusion.py) are imported by the methods that use them,
the constructor first: importing this module (and `fedsynth.strategies`) does not load torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.algorithms.local_training_settings import LocalTrainingSettings
from common.keys import SERVER, parameter, same_key
from common.models.diffusion_settings import DiffusionSettings
from common.run.progress import Progress
from common.run.settings import RunSettings
from common.models.diffusion_names import UNET_PRESETS
from common.run.interrupt import raise_if_stopped
from common.protocol import DIFFUSION_PHASE, MODEL, WARMUP_PHASE
from common.records import Weights, check_weights, from_record, load_weights, message_array_bytes, model_weights, to_record
from common.run.task import ServerTask, make_model
from common.run.config import paper_mean
from server_app.influence import capped_counts
from server_app.messaging import match_replies, misaddressed_replies, sender_mismatch
from server_app.strategies.flower_wrappers import refuse_unsupported_wrapper
from server_app.reply_checks import check_train_metrics
from server_app.wire import with_fedsynth_metric_names
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.parameters import documented
from server_app.strategies.round_log import Failure, PhaseEntry


# Fourth seed component of each server-side random stream.
_AUX_STREAM, _CORRECTION_STREAM = 21, 22


class WarmupFailed(RuntimeError):
    """Fewer than min-nodes nodes returned a usable warm model."""


def auxiliary_count(num_examples: int, fraction: float) -> int:
    """|A_i| = aux-fraction * m_i, rounded half up, at least one image per node that has data."""
    if num_examples <= 0:
        return 0
    return max(1, math.floor(fraction * num_examples + 0.5))


@dataclass(frozen=True)
class FedDDPMSettings:
    """FedDDPM's class settings (not a part of the run config): the diffusion task the server builds, the nodes'
    warm-up, the auxiliary set and the server's correction on it. Each key is declared by its run-config part
    (common/models/diffusion_settings.py, ...); the server sends the warm-up's itself (`configure_warmup`)."""

    task: ServerTask = parameter(ServerTask(model="unet-paper-mnist"), "The U-Net the server builds and the data.")
    device: str = same_key(RunSettings, "device")
    aux_sampler: str = same_key(DiffusionSettings, "aux_sampler", side=SERVER)
    ddim_steps: int = same_key(DiffusionSettings, "ddim_steps", side=SERVER)
    batch_size: int = same_key(LocalTrainingSettings, "batch_size", side=SERVER)
    local_optimizer: str = same_key(LocalTrainingSettings, "local_optimizer", side=SERVER)
    warmup_epochs: int = same_key(DiffusionSettings, "warmup_epochs", side=SERVER)
    warmup_steps: int = same_key(DiffusionSettings, "warmup_steps", side=SERVER)
    warmup_timeout: float = same_key(DiffusionSettings, "warmup_timeout", side=SERVER)
    aux_fraction: float = same_key(DiffusionSettings, "aux_fraction", side=SERVER)
    correction_epochs: int = same_key(DiffusionSettings, "correction_epochs", side=SERVER)
    correction_lr: float = same_key(DiffusionSettings, "correction_lr", side=SERVER)


@documented
class FedDDPM(FedAvg):
    """FedDDPM (Peng et al.): each node first trains its own DDPM and uploads it once (the warm-up); the server
    samples an auxiliary set from those models, then runs FedAvg rounds and, after each aggregation,
    `correction_epochs` epochs on the auxiliary set. The server builds `task`'s model (a U-Net) for both.
    """

    settings = FedDDPMSettings
    parameter_defaults = {"aggregation": paper_mean("fedddpm")}  # its paper's mean (paper_rules.py)

    def __post_init__(self) -> None:
        if self.task.model not in UNET_PRESETS:
            raise ValueError(f"{type(self).__name__}'s model must be one of the U-Net presets {', '.join(UNET_PRESETS)} "
                             f"(its server samples and corrects through diffusers' UNet2DModel), not {self.task.model!r}: "
                             "a 'package.module:factory' model is not supported for the diffusion strategies")
        from common.metrics.evaluation import resolve_device
        from common.models.diffusion import SamplerSpec, linear_schedule, num_timesteps

        self.device = resolve_device(self.device)
        self.aux_sampler = SamplerSpec(self.aux_sampler, num_timesteps(self.task), self.ddim_steps)
        self.optimizer = self.local_optimizer if self.local_optimizer != "auto" else "adam"  # `auto`: Adam for a DDPM
        self.auxiliary: np.ndarray | None = None       # A, float32 (n, C, H, W) in [-1, 1]; server only
        self.aux_counts: dict[int, int] = {}           # partition id -> |A_i|
        self.schedule = linear_schedule(num_timesteps(self.task))
        self._round = 0
        self._round_metrics: dict[str, float] = {}
        self.warmed_up = False  # the warm-up ran (a resumed run skips it: completed_rounds > 0)
        self._warmup_sent: list[Message] = []   # configure_warmup's messages, which aggregate_warmup's replies answer
        self._warmup_initial: Weights = {}      # the model they carried: a warm model must have its names and shapes
        self._warmup_started = 0.0              # when configure_warmup ran (the record's times)

    # ----- server state that a checkpoint must keep ---------------------------------
    def _state_arrays(self) -> dict[str, Weights]:
        return {"auxiliary": {"images": self.auxiliary}} if self.auxiliary is not None else {}

    def _load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        group = groups.get("auxiliary")
        if group is not None:
            self.auxiliary = np.asarray(group["images"], dtype=np.float32)

    def _state_meta(self) -> dict[str, Any]:
        return {"aux-counts": {str(pid): n for pid, n in self.aux_counts.items()}}

    def _load_state_meta(self, meta: Mapping[str, Any]) -> None:
        self.aux_counts = {int(pid): int(n) for pid, n in meta.get("aux-counts", {}).items()}

    def _dp_obstacle(self, side: str) -> str | None:
        """The warm models reach the server in the warm-up, outside the rounds a DP wrapper sees."""
        return ("its nodes upload their warm models in the warm-up, outside the rounds the wrapper clips and noises, "
                "and the server samples its auxiliary set from them")

    # ----- the run ---------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Before the first round of a run (not of a resumed one): the warm-up phase (`warmup`), then round 1."""
        refuse_unsupported_wrapper(self)  # before the warm-up sends anything
        if self._round_is_active(server_round) and not self.warmed_up and self.completed_rounds == 0:
            self.warmup(grid, arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def run_summary(self, rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What this algorithm adds to summary.json."""
        return {"aux-size": 0 if self.auxiliary is None else int(len(self.auxiliary)),
                "aux-sampler": self.aux_sampler.label}

    # ----- the warm-up phase: configure_warmup, one grid.send_and_receive, aggregate_warmup ----------
    def warmup(self, grid: Grid, arrays: ArrayRecord) -> dict[str, Any]:
        """The whole warm-up phase: `_configure_warmup`, one `grid.send_and_receive`, `_aggregate_warmup`.

        The first active `configure_train` calls it (the one hook that Flower's `start()`, a wrapper strategy
        (Flower's DP wrappers are refused: flower_wrappers.py) and a hand-written round loop all call), so the warm-up
        comes after `start()`'s round-0 `evaluate_fn` and before round 1's node sampling, once per run. The
        exchange goes through the grid's own `send_and_receive`, as a round's does, with `warmup-timeout`.
        Returns the warm-up's record (see `_aggregate_warmup`).
        """
        raise_if_stopped()
        messages = list(self._configure_warmup(arrays, grid))
        replies = grid.send_and_receive(messages, timeout=self.warmup_timeout)
        return self._aggregate_warmup(replies)

    def _configure_warmup(self, arrays: ArrayRecord, grid: Grid) -> Iterable[Message]:
        """One TRAIN message per node of the node table: the run's initial model and the warm-up's config.

        Content: `RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 0, "phase": "warmup",
        "warmup-epochs": ..., "warmup-steps": ..., "lr": ...})})`, beside `start()`'s `train_config` (fedsynth's
        app puts the local training recipe there: batch-size, the optimizer, ...). A node answers it as a train
        message, except that it trains its own DDPM from `arrays` for "warmup-steps" steps (0: "warmup-epochs"
        epochs) at "lr" (round 1's: `lr_schedule(1)`, else `start()`'s `train_config` "lr"; absent when neither is
        given) and replies with that model (see `_aggregate_warmup`).
        """
        self._ensure_nodes(grid)
        self._warmup_started = time.monotonic()
        self._warmup_initial = from_record(arrays)
        record = to_record(self._warmup_initial)
        config = {**self.train_config, "server-round": 0, DIFFUSION_PHASE: WARMUP_PHASE,
                  "warmup-epochs": self.warmup_epochs, "warmup-steps": self.warmup_steps, **self._warmup_lr()}
        messages = [
            Message(RecordDict({MODEL: record, "config": ConfigRecord(config)}), dst_node_id=node.node_id,
                    message_type=MessageType.TRAIN)
            for node in self.node_table.nodes
        ]
        log(INFO, "warmup: %d nodes train their own DDPM for %s", len(messages), self._warmup_length())
        self._warmup_sent = messages
        return messages

    def _warmup_lr(self) -> dict[str, float]:
        """The warm-up's `lr` entry: round 1's rate of the schedule, else `start()`'s train config's, else none."""
        if self.lr_schedule is not None:
            return {"lr": self.lr_schedule(1)}
        return {"lr": float(self.train_config["lr"])} if "lr" in self.train_config else {}

    def _aggregate_warmup(self, replies: Iterable[Message]) -> dict[str, Any]:
        """Check the warm models that came back and sample the auxiliary set A from them; returns the record.

        A usable reply is a train reply `RecordDict({"arrays": ArrayRecord(the warm model: the names, shapes and
        dtypes of the initial one, finite), "metrics": MetricRecord({"num-examples": int in 1..the node's handshake
        count, "train-loss" (or Flower's "train_loss"): float, "partition-id": int, required after a
        handshake})})`.
        Error replies, unusable ones and nodes that did not answer within `warmup-timeout` are dropped and listed
        in the record's "failures"; fewer than `min-nodes` warm models raise WarmupFailed. The record (round 0,
        phase "warmup") also goes to the round log (`round_log.phases`, with A) for the results folder.
        """
        replies = list(replies)
        partition_of_node = {n.node_id: n.partition_id for n in self.node_table.nodes}
        warm: list[tuple[int, int, Weights, float]] = []
        failures: list[dict[str, Any]] = []
        pairs, unanswered = match_replies(self._warmup_sent, replies)
        for message, reply in pairs:
            node_id = message.metadata.dst_node_id  # the SuperLink answers for a lost node
            if not reply.has_error() and "metrics" in reply.content.metric_records:
                # a reply in Flower's template names (train_loss) is read in fedsynth's, as a round's is
                reply.content["metrics"] = with_fedsynth_metric_names(reply.content.metric_records["metrics"])
            reason, weights = self._check_warm_reply(reply, self._warmup_initial)
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
                     for m, r in misaddressed_replies(self._warmup_sent, replies, pairs)]
        for failure in failures:
            log(WARNING, "warmup: dropped node %s (partition %s): %s", failure["node"], failure["partition"], failure["reason"])
        if len(warm) < self.min_nodes:
            raise WarmupFailed(f"only {len(warm)} node(s) returned a warm model, fewer than min-nodes="
                               f"{self.min_nodes}; failures: {failures[:3]}. A node answers the warm-up (a train "
                               "message whose config has phase = 'warmup') with RecordDict({'arrays': its warm model, "
                               "'metrics': {'num-examples': m_i, 'train-loss': float}}); "
                               "fedsynth.client.warmup_reply(msg, model, num_examples=m_i, train_loss=l) builds it")
        warm.sort(key=lambda item: item[0])
        start = self._warmup_started
        train_time = time.monotonic() - start
        self.auxiliary = self._sample_auxiliary([(pid, m, w) for pid, m, w, _ in warm])
        self.warmed_up = True
        values = {"train-loss": float(np.mean([loss for *_, loss in warm])), "aux-size": int(len(self.auxiliary)),
                  "warmup-time": train_time, "aux-sampling-time": time.monotonic() - start - train_time}
        entry = PhaseEntry(phase=WARMUP_PHASE, sampled=len(self._warmup_sent), answered=len(warm),
                           failures=tuple(Failure.of(f) for f in failures),
                           uplink_bytes=sum(message_array_bytes(r) for r in replies),
                           downlink_bytes=sum(message_array_bytes(m) for m in self._warmup_sent),
                           values=values, duration=time.monotonic() - start, product=self.auxiliary)
        self.round_log.add_phase(entry)
        log(INFO, "warmup done: auxiliary set of %d images (%s) in %.1fs", len(self.auxiliary),
            self.aux_sampler.label, entry.duration)
        return entry.as_record()

    def _check_warm_reply(self, reply: Message, initial: Weights) -> tuple[str | None, Weights]:
        if reply.has_error():
            return f"error: {reply.error.reason}", {}
        content = reply.content
        if MODEL not in content.array_records:
            return "warmup reply lacks the model", {}
        node = next((n for n in self.node_table.nodes if n.node_id == reply.metadata.src_node_id), None)
        if node is None:
            return "warmup reply from a node that did not complete the handshake", {}
        handshake = self.node_table.from_handshake
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

    def _sample_auxiliary(self, warm: list[tuple[int, int, Weights]]) -> np.ndarray:
        """A = union of |A_i| samples of each node's warm model (ancestral sampler unless `aux-sampler` says otherwise)."""
        from common.models.diffusion import image_shape, sample, seeded_generator

        model = make_model(self.task).to(self.device)
        spec, shape = self.aux_sampler, image_shape(self.task)
        parts = []
        # |A_i| scales with the count node i claims: no node's count above max-weight-share of the total,
        # so one node's claim cannot make the server sample without end (server_app/influence.py)
        claims = capped_counts([num_examples for _, num_examples, _ in warm], self.max_weight_share)
        counts = [auxiliary_count(int(claim), self.aux_fraction) for claim in claims]
        progress = Progress("auxiliary set", sum(counts), "images")
        progress.start(f" to sample from {len(warm)} warm models ({spec.label}; per node: {counts})")
        for (partition_id, _, weights), count in zip(warm, counts):
            load_weights(model, weights)
            model.to(self.device)
            parts.append(sample(model, spec, count, shape, seeded_generator(self.seed, partition_id, 0, _AUX_STREAM),
                                self.device, on_batch=progress.advance))
            self.aux_counts[partition_id] = count
        return np.concatenate(parts).astype(np.float32)

    # ----- the server's correction -------------------------------------------------------------
    def _correct(self, weights: Weights, epochs: int, lr: float) -> Weights:
        """`epochs` epochs of the DDPM loss on A from `weights` at learning rate `lr`."""
        if self.auxiliary is None or epochs <= 0:
            return weights
        import torch

        from common.models.diffusion import seeded_generator, train_on_images

        start = time.monotonic()
        model = make_model(self.task)
        load_weights(model, weights)
        model.to(self.device)
        loss = train_on_images(
            model, torch.from_numpy(self.auxiliary).to(self.device), self.schedule, epochs=epochs,
            batch_size=self.batch_size, lr=lr, optimizer=self.optimizer,
            generator=seeded_generator(self.seed, self._round, 0, _CORRECTION_STREAM),
        )
        self._round_metrics.update({"correction-loss": loss, "correction-epochs": epochs, "correction-lr": lr,
                                    "correction-time": time.monotonic() - start})
        return model_weights(model)

    def _after_aggregation(self, weights: Weights) -> Weights:
        """FedDDPM: correct after every aggregation at `correction-lr` (eta)."""
        return self._correct(weights, self.correction_epochs, self.correction_lr)

    def _server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        return self._after_aggregation(super()._server_step(mean_delta, replies))

    def _aggregate_good(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self._round, self._round_metrics = server_round, {}
        arrays, metrics = super()._aggregate_good(server_round, replies)
        if metrics is not None:
            for key, value in self._round_metrics.items():
                metrics[key] = value
        return arrays, metrics

    def summary(self) -> None:
        super().summary()
        log(INFO, "%s: warmup %s, aux-fraction %g (%s), correction-epochs %d at %g", type(self).__name__,
            self._warmup_length(), self.aux_fraction, self.aux_sampler.label, self.correction_epochs, self.correction_lr)

    def _warmup_length(self) -> str:
        """`warmup-steps` steps or `warmup-epochs` epochs, for logs."""
        return f"{self.warmup_steps} steps" if self.warmup_steps else f"{self.warmup_epochs} epochs"
