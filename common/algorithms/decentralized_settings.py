"""The decentralized keys (issue 6): the topology and mixing of dpsgd, dfedavg(m), dfedsam and OledFL.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by the
topologies and gossip of this floor (common/algorithms/topology.py, common/algorithms/gossip.py) and
the decentralized relay (server_app/strategies/relay.py) and the nodes' gossip step
(client_app/decentralized.py). What a decentralized run cannot combine with
(compression, a robust server mean) spans parts: `RunConfig` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.algorithms.gossip import parse_targets
from common.algorithms.topology import MIXINGS, TOPOLOGIES
from common.errors import ConfigError
from common.keys import check_choice, check_text, key, require


@dataclass(frozen=True)
class DecentralizedSettings:
    """Decentralized FL: the graph each round, its mixing weights, and the targets the summary reports."""

    topology: str = key(
        "random", "Decentralized topology: random (a fresh k-regular graph each round: every node has exactly k "
        "neighbours), random-draws (each node draws k peers, links both ways: k to ~2k neighbours), random-pull "
        "(each node draws k peers and averages itself and them, 1/(k+1) each: DisPFL's directed pull graph, "
        "row-stochastic only; needs mixing = uniform), ring, grid (2-D torus), exponential, full.",
        "SPEC 4.5",
    )
    peers: int = key(10, "Random topologies: neighbours k per node and round (random: n * k even, k < n).",
                     "OledFL: 10")
    mixing: str = key(
        "metropolis", "Decentralized mixing weights: metropolis (Metropolis-Hastings) or uniform (1/(k+1) on the "
        "node and each neighbour; needs every node to have k neighbours; equal to metropolis on such graphs).",
        "SPEC 4.5; DisPFL code",
    )
    relay_mixing: bool = key(
        False, "Decentralized: the relay sends each node the weighted sum of its neighbours' models (one model) "
        "instead of every neighbour's model; same numbers, less traffic.", "SPEC 4.5",
    )
    target_accuracies: str = key(
        "0.7,0.75,0.8", "Comma-separated accuracies of the average model; the summary reports the first round "
        "reaching each (decentralized runs).", "OledFL Table III",
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, DecentralizedSettings)
        check_choice("topology", self.topology, TOPOLOGIES)
        require(self.peers >= 1, "peers", self.peers, "an integer >= 1")
        check_choice("mixing", self.mixing, MIXINGS)
        try:
            parse_targets(self.target_accuracies)
        except ValueError as err:
            raise ConfigError(f"run config key 'target-accuracies' = {self.target_accuracies!r} is invalid ({err}); "
                              "accepted: comma-separated accuracies in (0, 1], e.g. \"0.7,0.8\"") from None
