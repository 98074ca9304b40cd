"""The round log (server_app/strategies/round_log.py): a round's typed entry, the metrics.jsonl line it renders, and
the log a strategy appends to and the recorder reads. Hand-made values only: no strategy, no grid."""

from __future__ import annotations

import dataclasses

import pytest

from server_app.strategies.round_log import Failure, PhaseEntry, RoundEntry, RoundLog

TIMEOUT = Failure(node=12, partition=1, reason="timeout")
STRANGER = Failure(node=99, partition=None, reason="reply from a node that is not in the node table")


def test_a_failure_reads_and_renders_the_reply_collections_record():
    record = {"node": 12, "partition": 1, "reason": "timeout"}
    assert Failure.of(record) == TIMEOUT and TIMEOUT.as_record() == record


def test_a_begun_round_renders_what_it_sent_only():
    entry = RoundEntry(round=3, sampled=2, started_at=10.0, sent={"lr": 0.05})
    assert entry.as_record() == {"round": 3, "sampled": 2, "lr": 0.05}


def test_a_finished_round_renders_every_key_in_the_order_metrics_jsonl_has_them():
    entry = RoundEntry(round=3, sampled=3, started_at=10.0, sent={"lr": 0.05}, collected_at=11.5,
                       answered_nodes=("partition-0", "site-b"), failures=(TIMEOUT,), uplink_bytes=300,
                       downlink_bytes=360, uplink_float32_bytes=1200,
                       metrics={"train-loss": 0.4, "num-examples": 70, "clipped-updates": 1},
                       outcome={"state-lost": 0}, finished_at=12.25)
    record = entry.as_record()
    assert list(record) == ["round", "sampled", "lr", "answered", "answered-nodes", "failed", "failures",
                            "uplink-bytes", "downlink-bytes", "uplink-float32-bytes", "train-loss", "num-examples",
                            "clipped-updates", "state-lost", "round-time"]
    assert record["answered"] == 2 and record["answered-nodes"] == ["partition-0", "site-b"]
    assert record["failed"] == 1 and record["failures"] == [{"node": 12, "partition": 1, "reason": "timeout"}]
    assert (record["uplink-bytes"], record["downlink-bytes"], record["uplink-float32-bytes"]) == (300, 360, 1200)
    assert record["round-time"] == pytest.approx(2.25)  # finished minus started
    assert entry.answered == 2 and entry.clipped_updates == 1


def test_a_short_round_says_so_and_counts_no_float32_bytes_unless_given():
    collected = dict(collected_at=1.0, failures=(TIMEOUT, STRANGER), downlink_bytes=24)
    skipped = RoundEntry(round=1, sampled=2, started_at=0.0, skipped=True, finished_at=2.0, **collected).as_record()
    assert list(skipped) == ["round", "sampled", "answered", "answered-nodes", "failed", "failures", "uplink-bytes",
                             "downlink-bytes", "skipped", "round-time"]
    assert skipped["skipped"] is True and skipped["answered"] == 0 and skipped["failed"] == 2
    relay = RoundEntry(round=1, sampled=2, started_at=0.0, below_min_nodes=True, finished_at=2.0, **collected)
    assert list(relay.as_record())[-2:] == ["round-time", "below-min-nodes"]
    assert RoundEntry(round=1, sampled=2, started_at=0.0).clipped_updates is None  # bounded influence off


def test_a_round_that_broke_off_before_aggregating_has_no_round_time():
    entry = RoundEntry(round=1, sampled=1, started_at=0.0, collected_at=1.0, failures=(TIMEOUT,))
    assert "round-time" not in entry.as_record() and entry.as_record()["failed"] == 1


def test_entries_are_frozen():
    entry = RoundEntry(round=1, sampled=1, started_at=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.sampled = 2  # type: ignore[misc]


def test_the_log_keeps_the_current_round_and_its_updates():
    log = RoundLog()
    assert log.latest is None and log.entry(1) is None
    with pytest.raises(RuntimeError, match="no round in progress"):
        log.update(skipped=True)
    first = RoundEntry(round=1, sampled=2, started_at=0.0)
    log.begin(first)
    updated = log.update(collected_at=1.0, answered_nodes=("partition-0",))
    assert log.entry(1) is updated and log.latest is updated and updated.answered == 1
    assert first.collected_at is None  # what a reader held is not changed
    assert log.entry(2) is None  # another round's entry is not this one's
    log.skip()  # round 2 sent nothing
    assert log.latest is None and log.entry(1) is None and log.entry(2) is None


def test_phases_are_kept_in_order_and_render_as_round_zero():
    log = RoundLog()
    auxiliary = object()
    warmup = PhaseEntry(phase="warmup", sampled=3, answered=2, failures=(TIMEOUT,), uplink_bytes=80, downlink_bytes=96,
                        values={"train-loss": 0.5, "aux-size": 6}, duration=4.5, product=auxiliary)
    log.add_phase(warmup)
    assert log.phases == [warmup] and log.phases[0].product is auxiliary
    assert warmup.as_record() == {"round": 0, "phase": "warmup", "sampled": 3, "answered": 2, "failed": 1,
                                  "failures": [{"node": 12, "partition": 1, "reason": "timeout"}],
                                  "uplink-bytes": 80, "downlink-bytes": 96, "train-loss": 0.5, "aux-size": 6,
                                  "round-time": 4.5}
    assert dataclasses.replace(warmup, product=None) == warmup  # the product is not part of the record
