"""How the decentralized relay's nodes gossip, as one value: the graph, its mixing weights and the relay's mode.

The relay (server_app/strategies/relay.py `DecentralizedRelay`) takes this as one parameter, `gossip`, instead of
the run config's four keys `topology`, `peers`, `mixing` and `relay-mixing` (common/algorithms/decentralized_settings.py),
as a centralized strategy takes its codec as one value. It checks itself when it is built, with the run config's
checks and messages (common/run/config.py `check_parameters`): `Gossip(topology="star")` fails as
`topology = "star"` does. `gossip_of` is where fedsynth's app turns a run config's keys into it. Whether the graph
fits the run's node count is checked when the nodes are known (the relay's `_size_node_state`).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.algorithms.decentralized_settings import DecentralizedSettings
from common.run.config import RunConfig, check_parameters

_DEFAULTS = DecentralizedSettings()  # the run config's decentralized defaults


@dataclass(frozen=True)
class Gossip:
    """The decentralized relay's graph and mixing (run-config keys of the same names, docs/configuration.md).

    topology : the graph of each round: "random" (a fresh k-regular graph each round), "random-draws",
        "random-pull", "ring", "grid", "exponential" or "full". Run-config key `topology`.
    peers : neighbours k per node and round of the random topologies. `peers`.
    mixing : the mixing weights, "metropolis" (Metropolis-Hastings) or "uniform". `mixing`.
    relay_mixing : the relay sends each node the weighted sum of its neighbours' models (one model) instead of
        every neighbour's model; the same numbers, less traffic. `relay-mixing`.
    """

    topology: str = _DEFAULTS.topology
    peers: int = _DEFAULTS.peers
    mixing: str = _DEFAULTS.mixing
    relay_mixing: bool = _DEFAULTS.relay_mixing

    def __post_init__(self) -> None:
        check_parameters("Gossip", {"topology": self.topology, "peers": self.peers, "mixing": self.mixing,
                                    "relay_mixing": self.relay_mixing})


def gossip_of(cfg: RunConfig) -> Gossip:
    """The `gossip` value of a run config (its keys `topology`, `peers`, `mixing`, `relay-mixing`)."""
    return Gossip(topology=cfg.topology, peers=cfg.peers, mixing=cfg.mixing, relay_mixing=cfg.relay_mixing)
