"""The round keys: how many nodes a round samples and needs, and how long the server waits for them.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by the
server's round loop and start-of-run handshake (server_app/): the sampled fraction, the quorum, how
many nodes and rounds may fail, and the timeouts and polling of replies.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.keys import check_text, key, require


@dataclass(frozen=True)
class RoundSettings:
    """Rounds: the sampled fraction, the quorum, the failures tolerated, and the waits for replies."""

    fraction_train: float = key(
        1.0, "Fraction p of clients sampled per round (n = max(floor(N*p), 1)).", "SPEC 4"
    )
    min_nodes: int = key(1, "A round counts only if at least this many nodes answered.")
    max_missing_nodes: int = key(
        0, "How many of the num-partitions nodes may fail the start-of-run handshake (or not connect within "
        "node-wait-timeout) and the run still start without them; 0: every node must answer, else the run fails "
        "(exit 1) naming each lost node and why."
    )
    max_failed_rounds: int = key(
        3, "Stop the run after this many consecutive rounds below min-nodes."
    )
    round_timeout: float = key(600.0, "Seconds to wait for replies in a round.")
    reply_poll_interval: float = key(
        0.05, "Seconds between the server's checks for replies (Flower's own: 3 s deployed, 0.1 s in simulation)."
    )
    node_wait_timeout: float = key(
        120.0, "Seconds to wait at start for all partitions' nodes to connect."
    )
    node_return_wait: float = key(
        120.0, "Seconds a round waits for a node that the SuperLink reports unavailable (a SuperNode that "
        "restarts or stopped, or whose heartbeats stopped; its failure record says which) to be back, to send it its message again, within round-timeout; a node "
        "that stays away is not waited for again until it answers; 0: not waited for (its reply is the SuperLink's "
        "'Node Unavailable')."
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, RoundSettings)
        require(0 < self.fraction_train <= 1, "fraction-train", self.fraction_train, "a number in (0, 1]")
        require(self.min_nodes >= 1, "min-nodes", self.min_nodes, "an integer >= 1")
        require(self.max_missing_nodes >= 0, "max-missing-nodes", self.max_missing_nodes, "an integer >= 0")
        require(self.max_failed_rounds >= 1, "max-failed-rounds", self.max_failed_rounds, "an integer >= 1")
        require(self.round_timeout > 0, "round-timeout", self.round_timeout, "seconds > 0")
        require(0 < self.reply_poll_interval <= 10, "reply-poll-interval", self.reply_poll_interval,
                "seconds in (0, 10]")
        require(self.node_wait_timeout > 0, "node-wait-timeout", self.node_wait_timeout, "seconds > 0")
        require(self.node_return_wait >= 0, "node-return-wait", self.node_return_wait, "seconds >= 0")
