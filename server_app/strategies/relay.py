"""The ServerApp of decentralized FL: a relay and orchestrator that trains no model.

Flower has no peer-to-peer mode, so the ServerApp plays the network (SPEC 4.5,
OledFL Algorithm 1). Every round t it
1. builds the round's mixing matrix W_t (`topology`; the random one is drawn
   from (seed, t), so it is reproducible), drops the nodes that sent no model
   last round and renormalizes (`common.algorithms.gossip.dropout_mixing`);
2. sends every node i the models z_j^{t-1} of its neighbours with the
   weights W_ij and W_ii, or with `relay-mixing` their weighted sum, one model
   instead of deg(i) (the node adds W_ii z_i from its own state; both modes
   give bitwise-equal numbers);
3. collects each node's new model z_i^t (checked like any reply; a failed,
   timed-out or bad reply leaves the node out of the next round's mixing);
4. measures the average model x-bar = (1/N) sum_i z_i on the test set (the
   paper's accuracy), the nodes' own accuracies (each node reports its mixed
   model's accuracy on its local test split), the consensus distance
   (1/N) sum_i ||z_i - x-bar||^2, psi of W_t, and the traffic of both relay
   modes.

All nodes take part in every round (no sampling). Every node's last model is
server state: it is what the relay forwards, and the checkpoint hooks save and
restore it; after a resume each node also gets its own model back, because a
resumed run starts with empty `Context.state` on the nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.typing import Scalar
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.errors import ConfigError
from common.algorithms.local_training_settings import ROUND_LR_KEY
from common.algorithms.gossip import (
    average_model,
    consensus_distance,
    dropout_mixing,
    neighbour_sum,
    round_record,
)
from common.protocol import (
    GOSSIP,
    GOSSIP_MIXED,
    GOSSIP_MODEL_PREFIX,
    NODE_STATE_PREFIX,
    STATE_OWN_MODEL,
    STATE_OWN_ROUND,
)
from common.records import Weights, check_weights, from_record, subtract, to_record
from common.algorithms.mixing_spectrum import disagreement_factor, spectral_psi
from common.algorithms.topology import DIRECTED_TOPOLOGIES, RANDOM_TOPOLOGIES, check_topology, mixing_matrix
from common.run.aggregation import NO_BOUNDS, BoundedInfluence
from common.run.gossip import Gossip
from server_app.checkpoint import CheckpointError
from server_app.reply_checks import check_train_metrics
from server_app.robust import clip_update, update_norm
from server_app.strategies.base import RoundStrategy, with_own_aggregation
from server_app.strategies.flower_wrappers import refuse_unsupported_wrapper
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.fedavg import reply_metric_means
from server_app.strategies.parameters import DEFAULTS, documented, settings_config
from server_app.strategies.wiring import NO_WIRING, AppWiring
from server_app.wire import WEIGHTED_BY_KEY


def _state_group(partition_id: int) -> str:
    return f"node-{partition_id}"


def traffic(w: np.ndarray, model_bytes: int) -> dict[str, int]:
    """Downlink bytes of one round in both relay modes, from the round's mixing matrix.

    Without relay mixing node i receives one model per neighbour (W_ij > 0,
    j != i); with it, one summed model if it has any neighbour at all.
    """
    off_diagonal = (w > 0) & ~np.eye(w.shape[0], dtype=bool)
    return {
        "downlink-bytes-neighbour-models": int(off_diagonal.sum()) * model_bytes,
        "downlink-bytes-relay-mixing": int(off_diagonal.any(axis=1).sum()) * model_bytes,
    }


def node_accuracy_stats(accuracies: Sequence[float]) -> dict[str, float]:
    """Mean, standard deviation, min and max of the nodes' accuracies (unweighted)."""
    values = np.asarray(accuracies, dtype=np.float64)
    return {
        "mean": float(values.mean()), "std": float(values.std()),
        "min": float(values.min()), "max": float(values.max()),
    }


def moved_too_far(model: Weights, last: Weights, bound: float) -> str | None:
    """Why a node's new `model` must be refused for moving more than `bound` (L2, over every array) from its
    `last` one (max-update-norm with action "refuse"), or None."""
    norm = update_norm(subtract(model, last))
    return f"model moved by {norm:.4g} from its last one, above max-update-norm = {bound:g}" if norm > bound else None


def bounded_model(model: Weights, last: Weights, bound: float) -> Weights:
    """A node's new model z_i, its step from its `last` model clipped to L2 norm `bound` when that is > 0.

    What a node sends is forwarded to its neighbours; the bound keeps one node from pushing arbitrary weights
    into every neighbour's mix (the decentralized form of the update bound). Each array keeps `model`'s dtype.
    """
    if bound <= 0:
        return model
    step = clip_update(subtract(model, last), bound)
    return {name: (last[name] + step[name]).astype(model[name].dtype) for name in model}


def relay_reply_metrics(metrics: list[Mapping[str, Any]], max_share: float) -> dict[str, Any]:
    """Train loss and the nodes' own (mixed-model, local test split) accuracies of a round (capped shares)."""
    if not metrics:
        return {}
    out: dict[str, Any] = reply_metric_means(metrics, max_share)
    tested = [m for m in metrics if m.get("num-test-examples", 0) > 0]
    if tested:
        accuracy = np.array([m["local-test-accuracy"] for m in tested], dtype=np.float64)
        out.update({f"node-accuracy-{k}": v for k, v in node_accuracy_stats(accuracy).items()})
    directions = [m["ole-direction-norm"] for m in metrics if "ole-direction-norm" in m]
    if directions:
        out["ole-direction-norm"] = float(np.mean(directions))
    return out


@documented
class DecentralizedRelay(RoundStrategy):
    """Relay and orchestrator of dpsgd, dfedavg, dfedavgm, dfedsam, oledfl-sgd and oledfl-sam.

    The node update rule is the ClientApp's (`client_app/decentralized.py`);
    the relay is the same for all six. Under Flower's `start()`, `configure_train`
    sends each node its own message (its mixing weights and its neighbours'
    models), `aggregate_train` keeps every good reply as that node's new model
    and returns the average model x-bar, which `evaluate_fn` and the `Result`
    receive. A round with fewer than `min-nodes` good replies still mixes (the
    nodes that answered move on); `max-failed-rounds` such rounds in a row end
    the run.
    """

    def __init__(self, *, gossip: Gossip | None = None,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = DEFAULTS.min_nodes,
                 max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                 seed: int = DEFAULTS.seed,
                 bounded_influence: BoundedInfluence | None = None,
                 wiring: AppWiring | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        wiring = wiring or NO_WIRING
        limits = NO_BOUNDS if bounded_influence is None else bounded_influence  # no round mean: no `update_norm_ratio`
        if wiring.parameter_names is not None:
            raise ConfigError(f"{type(self).__name__}: wiring.parameter_names is the centralized strategies'; the "
                              "relay forwards its nodes' whole models (give AppWiring(parameter_names=None))")
        super().__init__(min_nodes=min_nodes, max_failed_rounds=max_failed_rounds, fraction_evaluate=fraction_evaluate,
                         max_weight_share=limits.weight_share, seed=seed, nodes=wiring.nodes,
                         weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.gossip, self.bounded_influence = gossip or Gossip(), bounded_influence
        self.max_update_norm, self.update_norm_action = limits.update_norm, limits.action
        self.node_settings, self.lr_schedule = wiring.sent_settings(), wiring.lr_schedule
        self.models: list[Weights] = []              # z_i, the last model node i sent (x^0 before)
        self.present = np.ones(0, dtype=bool)        # who sent a model in the last round
        self.last_answered: list[int] = []           # round of each node's last accepted model
        self.completed_round = 0
        self.restore_pending: set[int] = set()       # nodes whose Context.state is re-sent (resume)
        self._base: np.ndarray | None = None
        if self.node_table.nodes:
            self._size_node_state()

    def _late_join_refusal(self) -> str | None:
        """A handshake's sites are the relay's graph for the whole run: a site that joins later is refused."""
        if not self.node_table.from_handshake:
            return None
        return (f"the decentralized relay keeps the topology of the {len(self.node_table.nodes)} nodes of the "
                f"start (topology = {self.gossip.topology!r}) for the whole run; the site takes part in the next run")

    def _on_nodes_joined(self) -> None:
        """Size the per-node state for the grown table; a node that joined starts from the average model x-bar.

        It gets x-bar as its own model with its first message (as a resumed node gets its model back), and
        its neighbours mix x-bar for it until it has sent a model of its own.
        """
        joined = range(len(self.present), len(self.node_table.nodes))
        present, last_answered = self.present, self.last_answered
        self._size_node_state()
        if not self.models:  # before the first round: configure_train starts every node from x^0
            return
        self.present[:len(present)] = present
        self.last_answered[:len(last_answered)] = last_answered
        mean = average_model(self.models)
        self.models = [*self.models, *(dict(mean) for _ in joined)]
        self.restore_pending |= set(joined)

    def _size_node_state(self) -> None:
        """Check the topology against the node count and size the per-node state."""
        count, gossip = len(self.node_table.nodes), self.gossip
        try:
            check_topology(gossip.topology, count, gossip.peers, gossip.mixing)
        except ValueError as err:
            raise ConfigError(f"run config keys topology = {gossip.topology!r}, peers = {gossip.peers}, mixing = "
                              f"{gossip.mixing!r} do not fit this run's {count} nodes: {err}") from None
        self.present = np.ones(count, dtype=bool)
        self.last_answered = [0] * count

    # ----- server state that a checkpoint must keep ---------------------------------
    def state_arrays(self) -> dict[str, Weights]:
        """Every node's last model, one group per partition."""
        return {_state_group(node.partition_id): model for node, model in zip(self.node_table.nodes, self.models)}

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        """Restore the nodes' last models; every partition of this run must be there."""
        missing = [n.partition_id for n in self.node_table.nodes if _state_group(n.partition_id) not in groups]
        if missing:
            raise CheckpointError(f"the checkpoint has no model for partition(s) {missing[:5]}; "
                                  "resume with the same nodes (num-partitions) as the run that wrote it")
        self.models = [dict(groups[_state_group(n.partition_id)]) for n in self.node_table.nodes]

    def state_meta(self) -> dict[str, Any]:
        """Round, who answered last, and each node's last answered round."""
        return {
            "round": self.completed_round,
            "partitions": [n.partition_id for n in self.node_table.nodes],
            "present": [bool(p) for p in self.present],
            "last-answered": list(self.last_answered),
        }

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        """Restore what `state_meta` returned (for the same partitions)."""
        partitions = [n.partition_id for n in self.node_table.nodes]
        if list(meta.get("partitions", [])) != partitions:
            raise CheckpointError(f"the checkpoint was written for partitions {meta.get('partitions')}, "
                                  f"this run has {partitions}")
        self.completed_round = int(meta["round"])
        self.present = np.asarray(meta["present"], dtype=bool)
        self.last_answered = [int(r) for r in meta["last-answered"]]

    def check_restored(self, template: Weights) -> str | None:
        """Why the restored node models cannot continue a run of this model, or None."""
        return next((p for p in (check_weights(m, template, "checkpointed node model") for m in self.models) if p), None)

    def on_resume(self) -> None:
        """After a checkpoint was loaded: give every node its own model back with its next message."""
        self.restore_pending = set(range(len(self.node_table.nodes)))

    # ----- one round ------------------------------------------------------------------
    def _round_mixing(self, server_round: int) -> tuple[np.ndarray, np.ndarray]:
        """(W_t of the configured topology and weights for all nodes, W_t with last round's missing nodes dropped)."""
        gossip = self.gossip
        base = mixing_matrix(gossip.topology, len(self.node_table.nodes), peers=gossip.peers, seed=self.seed,
                             round_num=server_round, mixing=gossip.mixing)
        return base, dropout_mixing(base, self.present)

    def _messages(self, server_round: int, w: np.ndarray, config: ConfigRecord) -> list[Message]:
        """One train message per node: its mixing weights and its neighbours' models (or their sum)."""
        records: dict[int, ArrayRecord] = {}
        out = []
        for i, node in enumerate(self.node_table.nodes):
            row = w[i]
            neighbours = [int(j) for j in np.flatnonzero(row > 0) if j != i]
            content = RecordDict({
                "config": config,
                GOSSIP: ConfigRecord({
                    "self-weight": float(row[i]),
                    "neighbours": [self.node_table.nodes[j].partition_id for j in neighbours],
                    "weights": [float(row[j]) for j in neighbours],
                    "relay-mixed": self.gossip.relay_mixing,
                }),
            })
            if self.gossip.relay_mixing:
                partial = neighbour_sum([self.models[j] for j in neighbours], [row[j] for j in neighbours])
                if partial is not None:
                    content[GOSSIP_MIXED] = to_record(partial)
            else:
                for j in neighbours:
                    if j not in records:
                        records[j] = to_record(self.models[j])
                    content[f"{GOSSIP_MODEL_PREFIX}{self.node_table.nodes[j].partition_id}"] = records[j]
            if i in self.restore_pending:
                content[f"{NODE_STATE_PREFIX}{STATE_OWN_MODEL}"] = to_record(self.models[i])
                content[f"{NODE_STATE_PREFIX}{STATE_OWN_ROUND}"] = round_record(self.last_answered[i])
            out.append(Message(content, dst_node_id=node.node_id, message_type=MessageType.TRAIN))
        return out

    def _check_train_reply(self, reply: Message, node: NodeInfo) -> str | None:
        """Why a node's reply cannot be used as its new model, or None."""
        content = reply.content
        if "arrays" not in content.array_records:
            return "reply lacks the 'arrays' record"
        handshake = self.node_table.from_handshake
        reason = check_train_metrics(content.metric_records.get("metrics"),
                                     node.partition_id if handshake else None, node.num_train_examples,
                                     max_test_examples=node.num_test_examples, partition_required=handshake)
        if reason is not None:
            return reason
        i = self.node_table.nodes.index(node)
        try:
            problem = check_weights(from_record(content.array_records["arrays"]), self.models[i], "model")
        except Exception as err:  # noqa: BLE001 - a reply must never crash the relay
            return f"malformed model ({type(err).__name__}: {err})"
        if problem or self.max_update_norm <= 0 or self.update_norm_action != "refuse":
            return problem
        return moved_too_far(from_record(content.array_records["arrays"]), self.models[i], self.max_update_norm)

    def _dp_obstacle(self, side: str) -> str | None:
        """The nodes keep and exchange their own models, which a DP wrapper neither clips nor noises."""
        return ("its nodes keep their own models and receive their neighbours' models from the relay, which "
                f"Flower's {side} clipping and noise never touch (only the average the relay returns is noised)")

    # ----- Strategy API -----------------------------------------------------------------
    def client_config(self) -> dict[str, Scalar]:
        """The settings the nodes' rule reads, sent in every train message's config: `node_settings` and the
        class's settings group's keys that travel to the nodes (`settings_config`: DFedSAM's SAM radius, ...)."""
        return {**self.node_settings, **settings_config(self)}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Each node its own message: its row of W_t and its neighbours' last models (x^0 = `arrays` before)."""
        refuse_unsupported_wrapper(self)
        if not self.round_book.is_active(server_round):
            return self.round_book.skip()
        self._refresh_nodes(grid)  # all nodes of the table train each round; a node that left times out
        if not self.models:
            self.models = [from_record(arrays)] * len(self.node_table.nodes)
        base, w = self._round_mixing(server_round)
        self._base = base
        round_config = {**self.client_config(), **config, "server-round": server_round}
        if self.lr_schedule is not None:
            round_config[ROUND_LR_KEY] = self.lr_schedule(server_round)
        sent = self._messages(server_round, w, ConfigRecord(round_config))
        fields: dict[str, Any] = {**traffic(w, to_record(self.models[0]).count_bytes())}
        if ROUND_LR_KEY in round_config:
            fields[ROUND_LR_KEY] = round_config[ROUND_LR_KEY]
        directed = self.gossip.topology in DIRECTED_TOPOLOGIES
        fields["psi"] = disagreement_factor(base) if directed else spectral_psi(base)
        return self.round_book.begin(server_round, sent, **fields)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Keep each good reply as its node's model; returns x-bar and the round's metrics.

        A failed, timed-out or bad reply leaves its node out of the next round's mixing.
        """
        if self.round_log.latest is None:  # a round that sent nothing
            return None, None
        outcome = self.round_book.collect(replies)
        good = {i: reply for i, reply in outcome.good}
        state_lost = 0
        for i, reply in good.items():
            own_round = int(reply.content.metric_records["metrics"].get("own-model-round", 0))
            if own_round < self.last_answered[i]:
                # the node started from an older model than the one it last sent: its state was lost
                state_lost += 1
                log(WARNING, "round %d: partition %d mixed its model of round %d, but it last sent one in round %d "
                    "(node state lost)", server_round, self.node_table.nodes[i].partition_id, own_round,
                    self.last_answered[i])
            self.models[i] = bounded_model(from_record(reply.content.array_records["arrays"]), self.models[i],
                                           self.max_update_norm)
            self.last_answered[i] = server_round
        self.present = np.zeros(len(self.node_table.nodes), dtype=bool)
        self.present[list(good)] = True
        self.restore_pending -= set(good)
        self.completed_round = server_round
        mean = average_model(self.models)
        answered = [good[i] for i in sorted(good)]
        metrics = with_own_aggregation(
            {**relay_reply_metrics([reply.content.metric_records["metrics"] for reply in answered],
                                   self.max_weight_share),
             "consensus-distance": consensus_distance(self.models, mean)},
            self.train_metrics_aggr_fn, answered, self.weighted_by_key)
        metrics = self.round_book.finish(metrics, answered, **{"state-lost": state_lost})
        if len(good) < self.min_nodes:
            self.round_log.update(below_min_nodes=True)
        self.round_book.enough_replies(server_round, len(good), "the nodes that answered mix on")
        return to_record(mean), metrics

    # ----- the run --------------------------------------------------------------------
    def summary(self) -> None:
        """Log what this relay will do."""
        log(INFO, "decentralized relay: %d nodes, topology %s%s, %s weights, relay-mixing %s",
            len(self.node_table.nodes),
            self.gossip.topology, f" (k={self.gossip.peers})" if self.gossip.topology in RANDOM_TOPOLOGIES else "",
            self.gossip.mixing, self.gossip.relay_mixing)
