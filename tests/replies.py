"""Sorting a round's replies with a strategy's own checks, as its `aggregate_train` does, for the reply tests."""

from __future__ import annotations

from types import SimpleNamespace

from flwr.app import Message


def collect_replies(strategy, sent: list[Message], replies: list[Message]) -> SimpleNamespace:
    """The strategy's split of `replies` to `sent` into good replies and failures (its round log's)."""
    strategy.round_book.begin(1, list(sent))
    outcome = strategy.round_book.collect(replies)
    return SimpleNamespace(good=[reply for _, reply in outcome.good], failures=outcome.failures,
                           uplink_bytes=outcome.uplink_bytes)
