"""The round log: what each round of a strategy did, as typed entries that fedsynth's results folder is written from.

A strategy appends to its `RoundLog` as a round goes: `configure_train` begins the round's `RoundEntry` (the round,
how many nodes were sent a message, what it noted about them, such as the lr), `aggregate_train` adds what came
back (the nodes that answered, each failure with its node, partition and reason, the bytes each way) and then
the aggregated metrics and when the round finished. A round that sends nothing (restored from a checkpoint, or
after the algorithm stopped itself) leaves no entry. Steps that are not rounds (FedDDPM's warm-up) are
`PhaseEntry`s, kept in the order they ran.

The recorder (server_app/recorder.py) reads the log and nothing else of the strategy's rounds: `RoundLog.entry`
gives the entry of a round that ran, `RoundEntry.as_record` the line metrics.jsonl holds for it, and the
entry's times (`started_at`, `collected_at`) the round and server times it adds. The entries are frozen: a
strategy changes its round's entry only through `RoundLog.update`, so what the recorder read stays as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Failure:
    """One dropped reply: the node it was for, its partition (None outside the node table) and why."""

    node: int
    partition: int | None
    reason: str

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Failure:
        """From the reply collection's `{"node", "partition", "reason"}` (server_app/strategies/reply_collection.py)."""
        return cls(node=record["node"], partition=record["partition"], reason=record["reason"])

    def as_record(self) -> dict[str, Any]:
        """`{"node", "partition", "reason"}`, as metrics.jsonl lists it."""
        return {"node": self.node, "partition": self.partition, "reason": self.reason}


@dataclass(frozen=True)
class RoundEntry:
    """One round of a strategy: what it sent, what came back, what it aggregated, and when.

    `collected_at` is None until the round's replies are sorted, `finished_at` until it is aggregated (a round
    that ended the run by an exception may stop in between). Times are `time.monotonic()` seconds.
    """

    round: int
    sampled: int                              # nodes sent a train message
    started_at: float                         # when configure_train sent them
    sent: Mapping[str, Any] = field(default_factory=dict)  # what the strategy noted (the round's rate, "psi", ...)
    collected_at: float | None = None         # when the replies were in
    answered_nodes: tuple[str, ...] = ()      # the nodes of the good replies, as results name them
    failures: tuple[Failure, ...] = ()        # every dropped reply and timeout
    uplink_bytes: int = 0                     # array bytes of the replies
    downlink_bytes: int = 0                   # array bytes of the sent messages
    uplink_float32_bytes: int | None = None   # what the replies would weigh uncompressed (a strategy that counts it)
    skipped: bool = False                     # too few good replies: the model was left unchanged
    metrics: Mapping[str, Any] = field(default_factory=dict)   # the aggregated metrics (with "clipped-updates", ...)
    outcome: Mapping[str, Any] = field(default_factory=dict)   # what else the strategy noted ("state-lost", ...)
    finished_at: float | None = None          # when the aggregation was done
    below_min_nodes: bool = False             # too few good replies, but the nodes went on (a decentralized relay)
    stops_run: bool = False                   # the algorithm stopped itself after this round (FedDDPM+)

    @property
    def answered(self) -> int:
        """How many good replies the round aggregated."""
        return len(self.answered_nodes)

    @property
    def clipped_updates(self) -> int | None:
        """How many updates bounded influence scaled down this round (None when it is off)."""
        value = self.metrics.get("clipped-updates")
        return None if value is None else int(value)

    def as_record(self) -> dict[str, Any]:
        """The round's line of metrics.jsonl, before the recorder adds its evaluation and times.

        Keys in this order: round, sampled, the sent notes; once collected: answered, answered-nodes, failed,
        failures, uplink-bytes, downlink-bytes, uplink-float32-bytes (when counted), skipped (when true); once
        finished: the metrics, the outcome notes, round-time (finished minus started); below-min-nodes (when true).
        """
        record: dict[str, Any] = {"round": self.round, "sampled": self.sampled, **self.sent}
        if self.collected_at is not None:
            record.update({"answered": self.answered, "answered-nodes": list(self.answered_nodes),
                           "failed": len(self.failures), "failures": [f.as_record() for f in self.failures],
                           "uplink-bytes": self.uplink_bytes, "downlink-bytes": self.downlink_bytes})
            if self.uplink_float32_bytes is not None:
                record["uplink-float32-bytes"] = self.uplink_float32_bytes
            if self.skipped:
                record["skipped"] = True
        if self.finished_at is not None:
            record.update(self.metrics)
            record.update(self.outcome)
            record["round-time"] = self.finished_at - self.started_at
        if self.below_min_nodes:
            record["below-min-nodes"] = True
        return record


@dataclass(frozen=True)
class PhaseEntry:
    """A step of a strategy that is not a round (FedDDPM's warm-up, `phase = "warmup"`), logged as round 0."""

    phase: str
    sampled: int
    answered: int
    failures: tuple[Failure, ...]
    uplink_bytes: int
    downlink_bytes: int
    values: Mapping[str, Any]   # what the phase measured ("train-loss", "aux-size", ...)
    duration: float             # seconds from its first message to its end
    round: int = 0
    # what the phase made that the results folder shows (FedDDPM's auxiliary set A, drawn and scored by the
    # recorder); not a metric, so not in `as_record`
    product: Any = field(default=None, compare=False, repr=False)

    def as_record(self) -> dict[str, Any]:
        """The phase's line of metrics.jsonl: round, phase, the counts, failures, bytes, the values, round-time."""
        return {"round": self.round, "phase": self.phase, "sampled": self.sampled, "answered": self.answered,
                "failed": len(self.failures), "failures": [f.as_record() for f in self.failures],
                "uplink-bytes": self.uplink_bytes, "downlink-bytes": self.downlink_bytes, **self.values,
                "round-time": self.duration}


class RoundLog:
    """A strategy's log of its rounds: the entry of the current (or last) round, and every phase so far.

    The strategy writes: `begin` a round, `update` its entry as the round goes, `skip` a round that sends nothing,
    `add_phase` a step that is not a round. Readers use `entry(server_round)`, `latest` and `phases`.
    """

    def __init__(self) -> None:
        self.latest: RoundEntry | None = None  # the round in progress, or the last one that ran; None after a skip
        self.phases: list[PhaseEntry] = []     # in the order they ran

    def begin(self, entry: RoundEntry) -> None:
        """A round starts: `entry` is its first state."""
        self.latest = entry

    def update(self, **changes: Any) -> RoundEntry:
        """Change fields of the current round's entry (a new frozen entry replaces it); returns it."""
        if self.latest is None:
            raise RuntimeError("no round in progress: begin() one first")
        self.latest = replace(self.latest, **changes)
        return self.latest

    def skip(self) -> None:
        """A round that sends nothing: no entry until the next round begins."""
        self.latest = None

    def add_phase(self, entry: PhaseEntry) -> None:
        """A step that is not a round ran."""
        self.phases.append(entry)

    def entry(self, server_round: int) -> RoundEntry | None:
        """The entry of `server_round` if that round ran (sent its messages), else None."""
        if self.latest is None or self.latest.round != server_round:
            return None
        return self.latest
