"""FedAvg as a Flower Message-API strategy, and the base of every centralized strategy.

Differences from Flower's own FedAvg, each for a reason in SPEC:
- nodes are sampled with a generator seeded by (seed, round) over the partition
  ids learned in the start-of-run handshake, so sampling is reproducible (Flower
  samples node ids with Python's `random`);
- each reply is checked against the global model before aggregation (names,
  shapes, dtypes, finite values; the reply gate, server_app/strategies/reply_gate.py);
  a bad reply is dropped, never averaged in;
- replies are summed in partition order, so results are bitwise reproducible
  (the mean of updates, server_app/strategies/update_mean.py);
- the server applies `w + server_lr * mean(w_i - w)`, weighted by sample count or
  uniformly (`aggregation`), and subclasses change only the public hooks
  `downlink_records`, `check_extra_records`, `server_step` and the server state's
  (`state_arrays`, `state_meta`, their `load_` pairs, `on_resume`);
- that step moves the trainable parameters only. A model's buffers (BatchNorm's
  running statistics and batch counter) are not updates to step along: the
  floating ones become the weighted mean of the replies' values, the integer
  ones (`num_batches_tracked`) the replies' maximum (`aggregate_buffers`), each
  in its own dtype and shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import astuple
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.algorithms.accepted_scale import ACCEPTED_ROUND_KEY, ACCEPTED_SCALE_KEY
from common.algorithms.local_training_settings import ROUND_LR_KEY, round_lr_entry
from common.protocol import CLIENT_STAT_PREFIX, MODEL, NODE_STATE_PREFIX
from common.records import Weights, from_record, parameter_names, to_record
from common.uplink.wire import float32_equivalent_bytes
from server_app.fid_reference import ClientFeatureReference
from server_app.outcome import non_finite_arrays
from server_app.strategies.base import RoundStrategy, weighted_metric, with_own_aggregation
from server_app.strategies.flower_wrappers import refuse_unsupported_wrapper
from server_app.strategies.node_table import NodeInfo, sample_nodes
from server_app.strategies.node_models import NodeModels
from server_app.strategies.parameters import DEFAULTS, documented, settings_config
from server_app.strategies.reply_gate import ReplyGate
from server_app.strategies.wiring import NO_WIRING, AppWiring
from server_app.strategies.update_mean import UpdateMean, aggregate_buffers, weighted_mean  # noqa: F401 - re-exported
from server_app.wire import WEIGHTED_BY_KEY, reply_contract_text, with_flower_metric_names
from common.run.aggregation import Aggregation, Bounded, aggregation_rule, bounds
from common.algorithms.codec_settings import CodecSettings
from common.keys import message_config


def parameter_change(new: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray], names: list[str]) -> Weights:
    """`new - current` over the trainable parameters `names`: the previous global update clients move along."""
    return {name: new[name] - current[name] for name in names}


@documented
class FedAvg(RoundStrategy):
    """FedAvg (McMahan et al., 2017) with fedsynth's reply checks and seeded sampling.

    The server step is the paper's: w + server_lr * the sample-weighted mean of the updates (`aggregation`).
    Bounded influence (a weight cap and an update-norm bound) is an option of that mean:
    `FedAvg(aggregation=Bounded(mean))`, by default with the bounds of the run config's option (`BOUNDED_INFLUENCE`).
    Nodes train with any rule (`fedsynth.client.train_sgd`, or a Flower template's own train function). fedsynth's app builds it from its run config
    (server_app/registry.py `build_strategy`) with `fraction_evaluate = 0` (its clients evaluate the received
    model inside each train reply); Flower's default is 1.0.
    """

    # FID's reference from the nodes' feature sums: fedsynth's app attaches one (server_app/registry.py)
    feature_reference: ClientFeatureReference | None = None
    # Its nodes keep a state that changes with their update (SCAFFOLD's c_i, FedDyn's g_i): a node whose update the
    # bounds scaled is told the scale in its next message, so that its state stays the server's (`configure_train`)
    notifies_accepted_scale: bool = False

    def __init__(self, *, fraction_train: float = DEFAULTS.fraction_train,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = DEFAULTS.min_nodes,
                 max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                 seed: int = DEFAULTS.seed,
                 server_lr: float = DEFAULTS.server_lr,
                 aggregation: Aggregation = DEFAULTS.aggregation,
                 codec: CodecSettings | None = None,
                 wiring: AppWiring | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        wiring, limits = wiring or NO_WIRING, bounds(aggregation)
        super().__init__(min_nodes=min_nodes, max_failed_rounds=max_failed_rounds, fraction_evaluate=fraction_evaluate,
                         max_weight_share=limits.weight_share, seed=seed, nodes=wiring.nodes,
                         weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.fraction_train, self.server_lr = fraction_train, server_lr
        self.bounded_influence = aggregation.influence if isinstance(aggregation, Bounded) else None  # the bounds given
        self.aggregation, self.trim_fraction, self.byzantine_nodes = astuple(aggregation_rule(aggregation))
        self.max_update_norm, self.max_update_norm_ratio, self.update_norm_action = (
            limits.update_norm, limits.update_norm_ratio, limits.action)
        # what the nodes are asked for and the server decodes with (None: no compression)
        self.codec = CodecSettings.of(codec if codec is not None else CodecSettings())
        self.node_settings, self.lr_schedule = wiring.sent_settings(), wiring.lr_schedule
        self._declared_parameter_names, self._trainable_cache = wiring.parameter_names, None  # `_parameter_names`
        self.current: Weights = {}  # the round's global model
        self.restore_pending: set[int] = set()  # partitions whose node state is re-sent after a resume
        self.node_models = NodeModels()  # the nodes' kept models: fedsynth's app gives the run's (registry.py)
        self.update_scales: dict[int, float] = {}  # the round's clip factor of each partition's update (1: none)
        self.accepted_scales: dict[int, tuple[float, int]] = {}  # partition -> (scale, round) to tell its node
        self.reply_gate, self.update_mean = ReplyGate(self), UpdateMean(self)  # reply_gate.py, update_mean.py

    def _on_nodes_joined(self) -> None:
        if self.feature_reference is not None:
            self.feature_reference.nodes = self.node_table.nodes

    @property
    def _parameter_names(self) -> list[str]:
        """The global model's trainable arrays, in its order: what updates, control variates and corrections cover.

        The names given as `parameter_names` (fedsynth's app gives the run's model's `named_parameters`) when
        the global model has them all; otherwise (none given, or another model) torch's naming of normalisation
        statistics decides from the arrays alone (`common.records.parameter_names`).
        """
        if getattr(self, "_trainable_cache", None) is None:
            declared = self._declared_parameter_names
            if declared is not None and set(declared) <= self.current.keys():
                self._trainable_cache = [name for name in self.current if name in set(declared)]
            else:
                self._trainable_cache = parameter_names(self.current)
        return self._trainable_cache

    @_parameter_names.setter
    def _parameter_names(self, names: list[str]) -> None:
        self._trainable_cache = list(names)

    # ----- hooks for subclasses -------------------------------------------------
    # The algorithm's extra train-reply records and metrics (name -> what it holds, and which call sends it),
    # named by the error that ends a first round of broken replies (`_reply_contract`).
    reply_records: dict[str, str] = {}
    reply_metrics: dict[str, str] = {}

    def _reply_contract(self) -> str:
        """What a good train reply carries with this strategy's codec and records, and the call that builds it."""
        return reply_contract_text(self.codec.compression, self.reply_records, self.reply_metrics)

    def _dp_obstacle(self, side: str) -> str | None:
        """Flower's DP clipping works on a reply that is the uncompressed model and nothing else (client-side:
        also on a train message that is the model and the config)."""
        if self.codec.compression != "none":
            return (f"its nodes reply with the {self.codec.compression} codec's payload ('compressed-update'), not the "
                    f"model, which Flower's {side} clipping cannot clip; build it with codec=None")
        if self.reply_records:
            names = ", ".join(f"'{name}'" for name in self.reply_records)
            if side == "server-side":
                return (f"Flower's server-side clipping clips every array record of a reply as the model and would "
                        f"corrupt {names}")
            return f"Flower's client-side clipping mod refuses a reply with more array records than the model ({names})"
        # train messages that carry records besides the model and the config (SCAFFOLD's c, ...)
        if side == "client-side" and type(self).downlink_records is not FedAvg.downlink_records:
            return ("Flower's client-side clipping mod refuses a train message with more array records than the model, "
                    "and this strategy sends its own")
        return None

    def client_config(self) -> dict[str, Any]:
        """Returns {run-config key: int | float | str | bool}, the settings the nodes' rule reads, sent in every
        train message's config (as FedProx sends its proximal weight): the uplink codec, `node_settings`
        (common/run/client_settings.py) and the class's settings group's node-side keys (`settings_config`). A
        plugin overrides it only for a value worked out at run time; a declared setting travels by itself."""
        return {**message_config(CodecSettings, self.codec), **self.node_settings, **settings_config(self)}

    # ----- public hooks: the algorithm's server rule (a plugin overrides them) ------------------------
    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        """Returns the records round `server_round` (int, from 1) sends beside the model, the same to every
        sampled node: {record name: ArrayRecord} (SCAFFOLD's "scaffold-c", the "previous-update", ...: float32
        arrays shaped like the model's trainable parameters). Default: {} (the model and the config only)."""
        return {}

    def check_extra_records(self, content: RecordDict) -> str | None:
        """Why a train reply's own records are unusable, or None. `content` is the reply's RecordDict, after the
        model and its metrics passed the checks (compressed records already decoded in place); the text
        returned is the failure's reason in the round log, and the reply is dropped. Default: None."""
        return None

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        """The new global model. `mean_delta`: the round's mean update {name: float32 array} over the trainable
        parameters (`_parameter_names`), bounded and weighted by the aggregation rule; `replies`: the round's
        good train replies (Messages, checked). Returns {name: array} for every array of the global model
        (`self.current`), in its dtype and shape. Default: `current + server_lr * mean_delta` (float32), the
        buffers from the replies' (`update_mean.buffers`)."""
        lr = self.server_lr
        new = {name: (self.current[name] + lr * mean_delta[name]).astype(np.float32) for name in self.current}
        new.update(self.update_mean.buffers(replies))
        return new

    # ----- server state that a checkpoint must keep ---------------------------------
    def state_meta(self) -> dict[str, Any]:
        """The scalar state: the bounds' scale notices the nodes have not answered yet ({"accepted-scales":
        {partition (str): [scale (float), round (int)]}}, absent when there is none)."""
        return {"accepted-scales": {str(p): list(n) for p, n in self.accepted_scales.items()}} if (
            self.accepted_scales) else {}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        """Restore what `state_meta` returned."""
        self.accepted_scales = {int(p): (float(n[0]), int(n[1])) for p, n in meta.get("accepted-scales", {}).items()}

    def _node_state_records(self, partition_id: int) -> dict[str, ArrayRecord]:
        """Node state the server can rebuild for a node (e.g. SCAFFOLD's c_i), sent after a resume.

        A resumed simulation starts with empty `Context.state` on every node; the
        records returned here reach each node with its first message after the
        resume, and the ClientApp writes them into its state.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """`RoundStrategy.state_dict`, its arrays with the nodes' kept models and FID's reference beside the
        algorithm's `state_arrays()`."""
        state = super().state_dict()
        reference = self.feature_reference.arrays() if self.feature_reference is not None else {}
        state["arrays"] = {**state["arrays"], **self.node_models.arrays(), **reference}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()`; then every sampled node is sent its state back (`on_resume`)."""
        groups = state["arrays"]
        if self.feature_reference is not None:
            groups = self.feature_reference.load(groups)
        super().load_state_dict({**state, "arrays": self.node_models.load(groups)})

    def on_resume(self) -> None:
        """Called once after a checkpoint was loaded: schedule node state to be re-sent."""
        self.restore_pending = {node.partition_id for node in self.node_table.nodes}

    # ----- Strategy API -----------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """One message per sampled node: the global model, the round's config and extra records."""
        refuse_unsupported_wrapper(self)
        if not self.round_book.is_active(server_round):
            return self.round_book.skip()
        available = self._refresh_nodes(grid)
        self.current = from_record(arrays)
        extra = self.downlink_records(server_round)
        round_config = {**self.client_config(), **config, "server-round": server_round}
        if self.lr_schedule is not None:
            round_config[ROUND_LR_KEY] = self.lr_schedule(server_round)
        messages = []
        for node in sample_nodes(available, self.fraction_train, self.seed, server_round):
            # a node whose last update the bounds scaled is told the scale and its round (`notifies_accepted_scale`),
            # unless its state is re-sent after a resume (SCAFFOLD's c_i): the re-sent state is the server's already
            notice, own = self.accepted_scales.get(node.partition_id), {}
            if notice is not None and not (node.partition_id in self.restore_pending
                                           and self._node_state_records(node.partition_id)):
                own = {ACCEPTED_SCALE_KEY: notice[0], ACCEPTED_ROUND_KEY: notice[1]}
            content = RecordDict({"arrays": arrays, "config": ConfigRecord({**round_config, **own})})
            for name, record in extra.items():
                content[name] = record
            if node.partition_id in self.restore_pending:
                restored = {**self._node_state_records(node.partition_id), **self.node_models.records(node.partition_id)}
                for name, record in restored.items():
                    content[f"{NODE_STATE_PREFIX}{name}"] = record
            messages.append(Message(content, dst_node_id=node.node_id, message_type=MessageType.TRAIN))
        fields = round_lr_entry(round_config[ROUND_LR_KEY]) if ROUND_LR_KEY in round_config else {}
        return self.round_book.begin(server_round, messages, **fields)

    def _check_train_reply(self, reply: Message, node: NodeInfo) -> str | None:
        """Why a train reply must be dropped, or None (the reply gate's checks, server_app/strategies/reply_gate.py)."""
        return self.reply_gate.check_train_reply(reply, node)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Drop failed, late and malformed replies (each recorded in `round_log`), then aggregate the rest.

        Fewer than `min_nodes` good replies leave the model unchanged (None, None). The metrics are the
        strategy's and the means of the replies' other numeric metrics (`RoundBook.finish`).
        """
        replies = list(replies)
        if self.round_log.latest is None:  # a round that sent nothing
            return None, None
        sent = self.round_book.sent
        model_record = sent[0].content.array_records.get("arrays") if sent else None
        model_bytes = model_record.count_bytes() if model_record is not None else 0  # a compressed reply replaces it
        outcome = self.round_book.collect(replies, lambda reply: float32_equivalent_bytes(reply, model_bytes))
        good = [reply for _, reply in outcome.good]
        if len(good) < self.min_nodes:
            self.round_log.update(skipped=True)
            self.round_book.finish(None, [])
            self.round_book.enough_replies(server_round, len(good))  # raises after max-failed-rounds
            return None, None
        self.round_book.enough_replies(server_round, len(good))
        arrays, metrics = self._aggregate_good(server_round, good)
        return arrays, self.round_book.finish(metrics, good)

    def _aggregate_good(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the updates of checked replies (in partition order) and take the server step."""
        partition_of = self.node_table.partition_of
        replies = sorted(replies, key=partition_of)
        if not replies:
            return None, None
        self.restore_pending -= {partition_of(r) for r in replies}
        deltas = [self.reply_gate.delta(r) for r in replies]
        if self.node_models.keys:  # the uplink is uncompressed: each reply holds the node's model
            for reply in replies:
                self.node_models.keep(partition_of(reply), from_record(reply.content.array_records[MODEL]))
        factors = self.update_mean.clip_factors(replies, deltas)
        self.update_scales = {partition_of(r): f for r, f in zip(replies, factors)}
        if self.notifies_accepted_scale:
            for reply in replies:  # it answered a message that carried its last notice: the node applied it
                self.accepted_scales.pop(partition_of(reply), None)
            self.accepted_scales.update({p: (f, server_round) for p, f in self.update_scales.items() if f < 1.0})
        mean_delta = self.update_mean.mean(replies, deltas, factors)
        self.current = self.server_step(mean_delta, replies)
        metrics = with_own_aggregation(aggregate_metrics(replies, self.max_weight_share, self.weighted_by_key),
                                       self.train_metrics_aggr_fn, replies, self.weighted_by_key)
        if non_finite := non_finite_arrays(self.current):  # a record, so the library path says it too
            metrics["non-finite-model"] = len(non_finite)
            log(WARNING, "round %d: the server step gave a global model with NaN or inf in %d array(s), e.g. "
                "'%s'; lower lr or server_lr (%g)", server_round, len(non_finite), non_finite[0], self.server_lr)
        if self.update_mean.bounds_on():  # what bounded influence changed this round (absent when it is off)
            for key, value in self.update_mean.bound_metrics(replies, factors).items():
                metrics[key] = value
        return to_record(self.current), metrics

    def summary(self) -> None:
        """Log what this strategy will do."""
        log(INFO, "%s: %d nodes, fraction-train %.2f, aggregation %s, server-lr %g",
            type(self).__name__, len(self.node_table.nodes), self.fraction_train, self.aggregation, self.server_lr)


def reply_metric_means(metrics: list[Mapping[str, Any]], max_share: float,
                       weighted_by_key: str = WEIGHTED_BY_KEY) -> dict[str, Any]:
    """Sample-weighted train loss and test-count weighted local test accuracy of train replies (capped shares)."""
    out = {"train-loss": weighted_metric([m["train-loss"] for m in metrics], [m[weighted_by_key] for m in metrics],
                                         max_share)}
    tested = [m for m in metrics if m.get("num-test-examples", 0) > 0]
    if tested:
        out["local-test-accuracy"] = weighted_metric([m["local-test-accuracy"] for m in tested],
                                                     [m["num-test-examples"] for m in tested], max_share)
    return with_flower_metric_names(out)


def aggregate_metrics(replies: list[Message], max_share: float, weighted_by_key: str = WEIGHTED_BY_KEY) -> MetricRecord:
    """Sample-weighted train loss and the received global model's local test accuracy (capped shares)."""
    metrics = [r.content.metric_records["metrics"] for r in replies]
    out: dict[str, Any] = {**reply_metric_means(metrics, max_share, weighted_by_key),
                           "num-examples": int(sum(m["num-examples"] for m in metrics))}
    # Per-client statistics a rule reports (FedCOG's generation time): mean and max over the replies.
    for key in sorted({k for m in metrics for k in m.keys() if k.startswith(CLIENT_STAT_PREFIX)}):
        values = np.array([float(m[key]) for m in metrics if key in m], dtype=np.float64)
        out[key], out[f"{key}-max"] = float(values.mean()), float(values.max())
    return MetricRecord(out)
