"""What every fedsynth strategy adds to Flower's `Strategy` so that Flower's own `start()` runs it whole.

Flower's `Strategy.start()` calls `configure_train`, `grid.send_and_receive`,
`aggregate_train`, `configure_evaluate`, `aggregate_evaluate` and `evaluate_fn`
once per round and returns a `Result`. `RoundStrategy` keeps everything a
fedsynth run needs inside those calls, so a Flower developer's ServerApp and
fedsynth's own (server_app/app.py) run the same code:

- the nodes (`node_table`, server_app/strategies/node_table.py): the
  handshake's table when the strategy was built from a run config, otherwise
  the grid's node ids, numbered in id order, at the first `configure_train`;
- failed, late and malformed replies are dropped in `aggregate_train`, each
  recorded with its node and reason in the round log (the reply collection,
  server_app/strategies/reply_collection.py), as Flower's FedAvg drops
  error replies; fewer than `min_nodes` good replies leave the model unchanged,
  and `max_failed_rounds` such rounds in a row raise `TooManyFailedRounds`;
- a round at or below `completed_rounds` (restored from a checkpoint), or after
  the algorithm stopped itself (FedDDPM+), sends nothing and aggregates nothing,
  so a resumed run calls the same `start()` with the same `num_rounds` and its
  round numbers, seeded sampling and learning-rate schedule stay the same;
- `round_book` (server_app/strategies/round_book.py) runs a round's bookkeeping from its messages to its
  metrics (sorting the replies, counting short rounds) into
  `round_log` (server_app/strategies/round_log.py), the record of the
  rounds (nodes sampled and answered, failures, bytes each way, the aggregated
  metrics, times) and of FedDDPM's warm-up, read by the `evaluate_fn` that
  writes fedsynth's results folder (server_app/recorder.py);
- `configure_evaluate` sends nothing when every good train reply of the round
  already carried the evaluation of the model it received (fedsynth's clients
  evaluate it inside the train message), instead of a second round trip.

Flower's start() has no early stop and no step before the first round; the
multi-phase methods use its hooks instead: FedDDPM's warm-up runs inside its
first `configure_train` (which receives the grid for exactly such exchanges),
FedDDPM+ sends nothing once its one-shot correction is done.
"""

from __future__ import annotations

from abc import ABCMeta
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO
from typing import Any, Callable, ClassVar

import numpy as np

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from server_app.messaging import send_and_receive
from server_app.strategies.declared_state import restore_declared_state, with_declared_state
from server_app.strategies.node_table import NodeInfo, NodeTable, sample_nodes, wait_for_nodes
from server_app.strategies.parameters import with_settings
from server_app.strategies.round_book import ReplyContractError, RoundBook, TooManyFailedRounds  # noqa: F401
from server_app.strategies.round_log import RoundLog
from server_app.strategies.metric_means import (  # noqa: F401 - re-exported: weighted_metric, checked_evaluate_metrics
    checked_evaluate_metrics, checked_evaluate_replies, local_test_summary, weighted_metric,
)
from server_app.wire import WEIGHTED_BY_KEY


# Flower's `train_metrics_aggr_fn` / `evaluate_metrics_aggr_fn`: (the replies' RecordDicts, weighted_by_key) -> metrics
MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


def with_own_aggregation(metrics: Mapping[str, Any], fn: MetricsAggregation | None, replies: Sequence[Message],
                         weighted_by_key: str) -> MetricRecord:
    """`metrics` with the MetricRecord of a user's aggregation function `fn` of the replies added (its entries win),
    as Flower's FedAvg returns `train_metrics_aggr_fn`'s record."""
    if fn is None:
        return MetricRecord(dict(metrics))
    own = fn([reply.content for reply in replies], weighted_by_key)
    if not isinstance(own, MetricRecord):
        raise TypeError(f"the metric aggregation function {getattr(fn, '__name__', fn)!r} (train_metrics_aggr_fn or "
                        f"evaluate_metrics_aggr_fn) returned a {type(own).__name__}, not a flwr.app.MetricRecord")
    return MetricRecord({**dict(metrics), **dict(own)})


def evaluate_messages(server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      nodes: Sequence[NodeInfo]) -> list[Message]:
    """One EVALUATE message per node of `nodes`: `arrays` (the model to evaluate) and `config` with "server-round"."""
    return [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "server-round": server_round})}),
                    dst_node_id=node.node_id, message_type=MessageType.EVALUATE)
            for node in nodes]


def evaluation_metrics(table: NodeTable, replies: Iterable[Message], max_weight_share: float,
                       fn: MetricsAggregation | None, weighted_by_key: str) -> MetricRecord | None:
    """Test-count weighted local accuracy and loss of the checked evaluate replies (no share above
    `max_weight_share`), "num-nodes" and `fn`'s record; None if no reply is usable."""
    checked = checked_evaluate_replies(table.nodes, replies, known_partitions=table.from_handshake)
    if not checked:
        return None
    metrics = [m for _, m in checked]
    summary = {**local_test_summary(metrics, max_weight_share), "num-nodes": len(metrics)}
    return with_own_aggregation(summary, fn, [r for r, _ in checked], weighted_by_key)


class WithSettings(ABCMeta):
    """The type of fedsynth's strategy classes: every class it makes that declares `settings = Group` gets its
    constructor from the group (server_app/strategies/parameters.py `with_settings`), a plugin's class as a
    built-in one. (Flower's `Strategy` is an ABC; this is its ABCMeta with that one step added.)"""

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(name, bases, namespace, **kwargs)
        with_settings(cls)


class RoundStrategy(Strategy, metaclass=WithSettings):
    """The node table, reply filtering, round bookkeeping and resume rules shared by fedsynth's strategies.

    Parameters
    ----------
    min_nodes : int (default: 1)
        Fewest good train replies a round needs; with fewer the model is left unchanged.
    max_failed_rounds : int (default: 3)
        Rounds in a row below `min_nodes` after which `aggregate_train` raises `TooManyFailedRounds`.
    fraction_evaluate : float (default: 1.0)
        Fraction of the nodes sent an evaluate message each round. A round whose good train replies all
        carried the local evaluation of the received model sends none (fedsynth's clients do that).
    max_weight_share : float (default: 1.0)
        No node's share of a sample-weighted mean (model or metric) above this; 1.0 leaves the counts as they are.
    seed : int (default: 0)
        Seed of the node sampling: the same seed and round draw the same nodes.
    nodes : list[NodeInfo] | None (default: None)
        The node table of a handshake; None takes the grid's nodes, and every round adds the nodes that joined
        since (a node that joins or re-joins mid-run takes part from its next round).
    weighted_by_key : str (default: "num-examples")
        The reply metric that weighs each reply in the averages, as in Flower's strategies; a reply that also
        carries "num-examples" must give both the same value, or it is dropped.
    min_available_nodes : int (default: 1)
        Each round waits until the grid has at least this many nodes, as Flower's strategies do.
    """

    # The algorithm's own settings, one settings group (common/keys.py; e.g. common/algorithms/rule_settings.py's
    # `SAMSettings`): a subclass that declares one gets its fields as keyword parameters, checked and kept as
    # attributes, and sends those that travel to the nodes in every train message under their run-config keys
    # (server_app/strategies/parameters.py `with_settings`, `settings_config`). None: no settings of its own.
    settings: ClassVar[type | None] = None

    # Names of attributes that hold server state (each a dict[str, np.ndarray], or None before first use):
    # `state_dict()` / `load_state_dict()` checkpoint and restore them bitwise (server_app/strategies/declared_state.py)
    server_state: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, min_nodes: int = 1, max_failed_rounds: int = 3, fraction_evaluate: float = 1.0,
                 max_weight_share: float = 1.0, seed: int = 0, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1) -> None:
        self.weighted_by_key = weighted_by_key
        self.min_available_nodes = min_available_nodes
        # Flower's FedAvg parameters every class takes (server_app/strategies/parameters.py `FLOWER_PARAMETERS`)
        self.arrayrecord_key, self.configrecord_key = "arrays", "config"
        self.train_metrics_aggr_fn: MetricsAggregation | None = None
        self.evaluate_metrics_aggr_fn: MetricsAggregation | None = None
        self.num_rounds: int | None = None  # start()'s num_rounds, once start() runs
        self.timeout: float | None = None   # start()'s timeout, for the exchanges of multi-phase methods
        self.train_config = ConfigRecord()  # start()'s train_config
        self.rounds_collected = 0           # rounds whose replies were sorted (the first one checks the contract)
        self.last_round = 0                 # the last round that sent its messages
        self.min_nodes = min_nodes
        self.max_failed_rounds = max_failed_rounds
        self.fraction_evaluate = fraction_evaluate
        self.max_weight_share = max_weight_share
        self.seed = seed
        # the nodes and who may join; the app sets its `rejoin` question (server_app/handshake.py `joined_nodes`)
        self.node_table = NodeTable(nodes, late_join_refusal=self._late_join_refusal)
        self.completed_rounds = 0  # rounds a checkpoint restored: start() skips them
        self.restored_from = ""    # what they were restored from, for messages (the app: its checkpoint's folder)
        self.failed_in_a_row = 0
        self.round_log = RoundLog()  # each round's entry and the steps that are not rounds, for the results
        self.round_book = RoundBook(self)  # the rounds' bookkeeping (server_app/strategies/round_book.py)

    # ----- Flower's start() ----------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Any:
        """Flower's `Strategy.start()`; its `num_rounds`, `timeout` and `train_config` rule the run.

        They are kept on the strategy first, so that a method that ends before the last round (FedDDPM+'s
        one-shot correction) stops at `num_rounds`, and a multi-phase method's own exchanges use `timeout`.
        """
        self.num_rounds, self.timeout = num_rounds, timeout
        self.train_config = ConfigRecord() if train_config is None else train_config
        self._refresh_nodes(grid)  # summary() names the nodes; the decentralized relay sizes its state
        return super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout, train_config=train_config,
                             evaluate_config=evaluate_config, evaluate_fn=evaluate_fn)

    # ----- the server state, for an app that checkpoints it ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The strategy's server state: {"arrays": {group: {name: ndarray}}, "meta": JSON-able dict, "completed-rounds"}.

        Everything `start()` needs to continue after the last round this strategy finished: the algorithm's
        arrays (momentum, control variates, the nodes' models of a relay, ...; each attribute the class names
        in `server_state`, as the group `server-state.<name>`) and scalars. The global model is
        not in it: it is `Result.arrays`, which the resumed `start()` takes as `initial_arrays`. fedsynth's app
        checkpoints the same parts (server_app/recorder.py).
        """
        arrays, meta = with_declared_state(self, self.state_arrays(), self.state_meta())  # `server_state`'s attributes
        return {"arrays": arrays, "meta": meta, "completed-rounds": max(self.completed_rounds, self.last_round)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()`: a later `start()` with the same `num_rounds` skips the finished rounds.

        An optional `"restored-from"` (text, e.g. "the checkpoint in <folder>") names the source in the error a
        first round of broken replies raises.
        """
        arrays, meta = restore_declared_state(self, state["arrays"], state["meta"])  # `server_state`'s attributes
        self.load_state_arrays(arrays)
        self.load_state_meta(meta)
        self.completed_rounds = int(state["completed-rounds"])
        self.restored_from = str(state.get("restored-from", ""))
        self.on_resume()
        if self._stop_requested():  # it had finished (FedDDPM+): a resumed start() must not train on
            log(INFO, "the checkpointed run had already stopped at round %d; nothing left to run",
                self.completed_rounds)

    # ----- public hooks: the algorithm's server state (a plugin overrides them) ----------------------
    def state_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The algorithm's server state beyond the global model, as named groups of arrays.

        Receives nothing; returns {group name: {array name: np.ndarray}} (any shape and dtype: FedAvgM's
        "velocity" is float32 shaped like the model's parameters, a relay's "node-<partition>" groups are whole
        models). A checkpoint stores the groups without pickling and gives them back to `load_state_arrays`,
        bitwise. Default: {} (no state).
        """
        return {}

    def load_state_arrays(self, groups: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Restore what `state_arrays` returned: `groups` maps each group name to {array name: np.ndarray},
        the same names, shapes and dtypes (a group the strategy does not know may be present: ignore it).
        Returns None."""

    def state_meta(self) -> dict[str, Any]:
        """The algorithm's scalar server state (counters, EMA values, flags). Receives nothing; returns a
        JSON-serialisable dict of str, int, float, bool, None, lists and dicts of them. Default: {}."""
        return {}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        """Restore what `state_meta` returned: `meta` is that dict after a JSON round trip (a checkpoint's
        meta.json; keys the strategy does not know may be present). Returns None."""

    def on_resume(self) -> None:
        """Called once after `load_state_dict` restored the state (arrays, then meta); receives and returns
        nothing. A strategy whose nodes keep state schedules it to be re-sent here: a resumed run's nodes start
        with an empty `Context.state`."""

    # ----- hooks ----------------------------------------------------------------------
    def _reply_contract(self) -> str:
        """What a good train reply carries, in words, for the error that ends a first round of broken replies."""
        return ('reply RecordDict({"arrays": ArrayRecord(the local model, the same names, shapes and dtypes as '
                'the global one), "metrics": MetricRecord({"num-examples": int > 0, "train-loss" (or Flower\'s '
                '"train_loss"): float})}); fedsynth.client.train_reply(msg, model, result, num_examples=n) builds it')

    def _dp_obstacle(self, side: str) -> str | None:
        """Why Flower's `side` ("server-side" or "client-side") DP clipping cannot protect what this strategy's
        nodes send, or None (server_app/strategies/flower_wrappers.py)."""
        return None

    def _stop_requested(self) -> bool:
        """True once the algorithm has finished before the last round (FedDDPM+ after its correction)."""
        return False

    def _check_train_reply(self, reply: Message, node: NodeInfo) -> str | None:
        """Why a (non-error) train reply must be dropped, or None."""
        raise NotImplementedError

    # ----- public hooks an app around `start()` calls (fedsynth's recorder, server_app/recorder.py) ----------
    def run_summary(self, rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """What this algorithm adds to a run's summary: a JSON-able dict of its own fields (FedDDPM's warm-up
        time, FedDDPM+'s stopping round), computed from `rounds`, the rounds' records as `metrics.jsonl` holds
        them (one dict per round, run-config-key names). A plugin overrides it to report its own; default {}."""
        return {}

    def check_restored(self, template: dict[str, Any]) -> str | None:
        """Why the server state `load_state_dict` restored cannot continue a run of this model, or None.

        `template` is the run's model as {name: numpy array} (the names, shapes and dtypes of the global model);
        a strategy that keeps arrays shaped like the model (a relay's node models) compares them with it. The
        returned text is the refusal a resumed run ends with, before any round."""
        return None

    # ----- the node table ------------------------------------------------------------------
    def _refresh_nodes(self, grid: Grid) -> list[NodeInfo]:
        """The nodes a round can use now: wait for `min_available_nodes`, add the nodes that joined since.

        Without a handshake the node table grows by every node id the grid has not shown before (a node that
        re-joins under a new id is a new entry), and the round uses the table's nodes that the grid has now.
        With one, the round uses the handshake's whole table, as fedsynth's runs always have: a node that is
        gone is sampled and recorded as a timeout, which is how its results account for lost nodes; node ids
        it lacks are asked the table's `rejoin` question (`NodeTable.take_in_joined`).
        """
        table = self.node_table
        if table.from_handshake:  # no wait either: a run whose nodes all left ends by max_failed_rounds
            if table.take_in_joined(grid, self.last_round + 1):
                self._on_nodes_joined()
            return list(table.nodes)
        node_ids = wait_for_nodes(grid, self.min_available_nodes)
        added = table.grow(node_ids)
        if added:
            log(INFO, "%s: %d node(s) joined, %d in the node table", type(self).__name__, added, len(table.nodes))
            self._on_nodes_joined()
        return table.connected(node_ids)

    def _late_join_refusal(self) -> str | None:
        """Why a site that joins mid-run cannot take part in this algorithm, or None (it takes part)."""
        return None

    def _on_nodes_joined(self) -> None:
        """Called when the node table grew (a strategy with per-node state sizes it here)."""

    # ----- evaluation ----------------------------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """`fraction_evaluate` of the nodes evaluate `arrays`, unless the train replies carried the evaluation."""
        book = self.round_book
        if book.evaluation_carried is not None or self.fraction_evaluate <= 0 or not book.trained_this_round():
            return []
        self._refresh_nodes(grid)
        chosen = sample_nodes(self.node_table.nodes, self.fraction_evaluate, self.seed, server_round)
        return evaluate_messages(server_round, arrays, config, chosen)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Test-count weighted local accuracy and loss of the checked evaluate replies (or the carried ones)."""
        replies = list(replies)
        if not replies:
            return self.round_book.evaluation_carried
        return evaluation_metrics(self.node_table, replies, self.max_weight_share, self.evaluate_metrics_aggr_fn,
                                  self.weighted_by_key)

    def evaluate_on_every_node(self, grid: Grid, arrays: ArrayRecord, server_round: int, timeout: float | None,
                               poll_interval: float = 0.05) -> MetricRecord | None:
        """Every node of the node table evaluates `arrays` (the model's ArrayRecord) on its local test split, as
        round `server_round`'s evaluate message, waiting at most `timeout` seconds (polling every `poll_interval`);
        returns the test-count weighted local accuracy and loss, their range and "num-nodes" of the checked replies
        (`evaluate_metrics_aggr_fn`'s record added), or None when no reply is usable. fedsynth's app calls it once
        after `start()` for the final model; a strategy without a global model (the relay) still evaluates `arrays`."""
        self._refresh_nodes(grid)
        sent = evaluate_messages(server_round, arrays, ConfigRecord({}), self.node_table.nodes)
        return evaluation_metrics(self.node_table, send_and_receive(grid, sent, timeout, poll_interval),
                                  self.max_weight_share, self.evaluate_metrics_aggr_fn, self.weighted_by_key)
