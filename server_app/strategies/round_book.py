"""A round's bookkeeping, from the messages it sends to the metrics it returns: `RoundBook`.

Every fedsynth strategy (FedAvg's family and the decentralized relay) runs the same steps around its own messages
and its own aggregation, and calls them from Flower's methods:

- `configure_train`: `is_active(server_round)` (False for a round a checkpoint restored, or after the algorithm
  stopped itself), then `begin(...)` with the round's messages, or `skip()`;
- `aggregate_train`: `collect(replies)` sorts the replies into good ones and failures (the reply collection,
  server_app/strategies/reply_collection.py) and ends a first round of nothing but broken replies with
  `ReplyContractError`; `enough_replies(...)` counts short rounds and raises `TooManyFailedRounds` after
  `max_failed_rounds` of them in a row; `finish(...)` completes the round log's entry and notes an evaluation the
  train replies carried;
- `configure_evaluate` / `aggregate_evaluate`: `evaluation_carried`, that evaluation (then no evaluate message
  is sent), and `trained_this_round()`.

It is a collaborator rather than methods of the strategy so that a strategy's class shows its algorithm, not
the bookkeeping (issue 63). It holds the round's sent messages and carried evaluation; the counters a
checkpoint or a message needs (`last_round`, `rounds_collected`, `failed_in_a_row`, `completed_rounds`) stay
on the strategy, and the settings (`min_nodes`, `max_failed_rounds`, ...) and hooks (`_check_train_reply`,
`_reply_contract`, `_stop_requested`) are read from it when a round runs, so a value changed after
construction is the one used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Any, Protocol

from flwr.app import Message, MetricRecord
from flwr.common.logger import log

from common.records import message_array_bytes
from server_app.strategies.metric_means import REPLY_METRIC_PREFIX, local_test_summary, other_metric_means
from server_app.strategies.reply_collection import RoundOutcome, collect_replies
from server_app.strategies.round_log import Failure, RoundEntry
from server_app.wire import contract_violation_error, largest_weight_note

class RoundOwner(Protocol):
    """What the round bookkeeping reads and writes on the strategy that holds it (`RoundStrategy`): a Protocol, so
    that this module does not import the strategy's (which imports it)."""

    completed_rounds: int
    failed_in_a_row: int
    last_round: int
    max_failed_rounds: int
    max_weight_share: float
    min_nodes: int
    node_table: Any  # server_app.strategies.node_table.NodeTable
    restored_from: str
    round_log: Any  # server_app.strategies.round_log.RoundLog
    rounds_collected: int
    weighted_by_key: str

    def _check_train_reply(self, reply: Message, node: Any) -> str | None: ...
    def _reply_contract(self) -> str: ...
    def _stop_requested(self) -> bool: ...



class TooManyFailedRounds(RuntimeError):
    """Fewer than min-nodes answered for max-failed-rounds rounds in a row."""


class ReplyContractError(TooManyFailedRounds):
    """Every reply of the first round broke the reply contract: the ClientApp must change, retrying cannot help."""


class RoundBook:
    """The bookkeeping of one strategy's rounds (see the module's docstring); `strategy` is the one it serves."""

    def __init__(self, strategy: RoundOwner) -> None:
        self.strategy = strategy
        self.sent: list[Message] = []                      # the current round's messages, which its replies answer
        self.evaluation_carried: MetricRecord | None = None  # the round's evaluation, carried in its train replies

    def is_active(self, server_round: int) -> bool:
        """False for rounds a checkpoint restored and for every round after the algorithm stopped itself."""
        strategy = self.strategy
        return server_round > strategy.completed_rounds and not strategy._stop_requested()

    def trained_this_round(self) -> bool:
        """Whether the current round trained (a skipped round evaluates nothing either)."""
        return self.strategy.round_log.latest is not None

    def begin(self, server_round: int, messages: list[Message], **fields: Any) -> list[Message]:
        """Remember what round `server_round` sends (to pair replies and count bytes), open its log entry with
        `fields` (what it sent: the learning rate, a relay's traffic, ...); returns `messages`."""
        self.sent = messages
        self.strategy.last_round = server_round
        self.evaluation_carried = None
        self.strategy.round_log.begin(RoundEntry(round=server_round, sampled=len(messages),
                                                 started_at=time.monotonic(), sent=fields))
        return messages

    def skip(self) -> list[Message]:
        """A round that sends nothing (restored from a checkpoint, or after the algorithm stopped); returns []."""
        self.sent = []
        self.strategy.round_log.skip()
        self.evaluation_carried = None
        return []

    def collect(self, replies: Iterable[Message],
                float32_bytes: Callable[[Message], int] | None = None) -> RoundOutcome:
        """Split the round's replies into checked-good ones and failures (error, invalid, timeout), logged.

        `float32_bytes` gives what a reply would weigh uncompressed (None: the round log has no such count).
        """
        strategy = self.strategy
        table = strategy.node_table
        collected_at = time.monotonic()
        outcome = collect_replies(self.sent, replies, table.nodes, strategy._check_train_reply, float32_bytes)
        # counted now, not when the round began: a subclass may add records to the sent messages (FedSynSAM's D_syn)
        strategy.round_log.update(collected_at=collected_at,
                                  answered_nodes=tuple(table.label(i) for i, _ in outcome.good),
                                  failures=tuple(Failure.of(f) for f in outcome.failures),
                                  uplink_bytes=outcome.uplink_bytes,
                                  downlink_bytes=sum(message_array_bytes(m) for m in self.sent),
                                  uplink_float32_bytes=None if float32_bytes is None else outcome.uplink_float32_bytes)
        strategy.rounds_collected += 1
        if strategy.rounds_collected == 1 and not outcome.good:
            restored = None
            if strategy.completed_rounds > 0:
                source = strategy.restored_from or "the state given to load_state_dict"
                restored = f"{source} (round {strategy.completed_rounds})"
            message = contract_violation_error(type(strategy).__name__, outcome.failures, strategy._reply_contract(),
                                               restored, largest_weight_note(self.sent))
            if message is not None:
                raise ReplyContractError(message)
        return outcome

    def enough_replies(self, server_round: int, answered: int, consequence: str = "model unchanged") -> bool:
        """Whether the round had `min_nodes` good replies; raises TooManyFailedRounds after too many short ones."""
        strategy = self.strategy
        if answered >= strategy.min_nodes:
            strategy.failed_in_a_row = 0
            return True
        strategy.failed_in_a_row += 1
        entry = strategy.round_log.latest
        failures = [f.as_record() for f in entry.failures] if entry is not None else []
        log(WARNING, "round %d: %d of %d nodes answered, fewer than min-nodes=%d; %s",
            server_round, answered, len(self.sent), strategy.min_nodes, consequence)
        if strategy.failed_in_a_row >= strategy.max_failed_rounds:
            raise TooManyFailedRounds(
                f"fewer than min-nodes={strategy.min_nodes} nodes answered in {strategy.failed_in_a_row} rounds in a "
                f"row (max-failed-rounds={strategy.max_failed_rounds}); last failures: {failures[:3]}"
            )
        return False

    def finish(self, metrics: MetricRecord | None, good: list[Message], **fields: Any) -> MetricRecord | None:
        """Add the aggregated metrics, `fields` and the end time to the round's log entry; note a carried evaluation.

        Returns the round's metrics for `Result`: `metrics` and, as Flower's FedAvg averages every reply metric, the
        mean of each numeric one of the good replies' that fedsynth does not read itself (`other_metric_means`;
        `metrics` win a clash). The round log keeps those means under `REPLY_METRIC_PREFIX` ("reply-my-score"),
        so that a name a node chose never overwrites a field of the round's record.
        """
        strategy = self.strategy
        share = strategy.max_weight_share
        carried = [r.content.metric_records["metrics"] for r in good]
        others = other_metric_means(carried, share, strategy.weighted_by_key) if metrics is not None else {}
        own = dict(metrics) if metrics is not None else {}
        strategy.round_log.update(metrics={**own, **{REPLY_METRIC_PREFIX + k: v for k, v in others.items()}},
                                  outcome=fields, finished_at=time.monotonic(), stops_run=strategy._stop_requested())
        if carried and all("local-test-accuracy" in m for m in carried):
            tested = [m for m in carried if m.get("num-test-examples", 0) > 0]
            self.evaluation_carried = MetricRecord({
                **(local_test_summary([{"num-examples": m["num-test-examples"], **dict(m)} for m in tested],
                                      share) if tested else {}),
                "num-nodes": len(tested), "carried-in-train-replies": 1,
            })
        return None if metrics is None else MetricRecord({**others, **own})
