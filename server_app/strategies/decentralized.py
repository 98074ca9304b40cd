"""Decentralized FL's algorithms: the relay (server_app/strategies/relay.py) under each algorithm's name.

The ServerApp plays the network: each node gets its own message with its neighbours' models and its mixing
weights, and the nodes' rule differs. DPSGD and DFedAvg send nothing else (the nodes' rule is the
algorithm's: one SGD step, local SGD epochs); DFedAvgM sends the nodes' local momentum, DFedSAM SAM's radius
and OledFL Ole's beta (and, as OledFL-SAM, SAM's radius), under the run-config names the nodes read.
"""

from __future__ import annotations

from typing import Callable

from flwr.common.typing import Scalar

from common.run.aggregation import BoundedInfluence
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.strategies.relay import DecentralizedRelay
from server_app.wire import WEIGHTED_BY_KEY


@documented
class DFedAvg(DecentralizedRelay):
    """Decentralized FedAvg over a peer topology: `configure_train` sends each node its own message (its mixing
    weights and its neighbours' last models, or their weighted sum with `relay_mixing`); `aggregate_train`
    keeps each reply as that node's model and returns their average x-bar. All nodes train every round
    (`fedsynth.client.gossip_mix`, then `fedsynth.client.train_sgd`); docs/library.md describes the message layout.
    """


@documented
class DPSGD(DecentralizedRelay):
    """D-PSGD (Lian et al., 2017): DFedAvg's relay; each node mixes its neighbours' models and takes one SGD step."""


@documented
class DFedAvgM(DecentralizedRelay):
    """DFedAvgM (Sun et al., 2022): DFedAvg's relay; each node trains with heavy-ball momentum after mixing,
    reading it from the train config's "dfedavgm-momentum".
    """

    def __init__(self, *, dfedavgm_momentum: float = DEFAULTS.dfedavgm_momentum,
                          topology: str = DEFAULTS.topology,
                          peers: int = DEFAULTS.peers,
                          mixing: str = DEFAULTS.mixing,
                          relay_mixing: bool = DEFAULTS.relay_mixing,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          bounded_influence: BoundedInfluence | None = None,
                          node_settings: dict[str, Scalar] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(topology=topology, peers=peers, mixing=mixing, relay_mixing=relay_mixing,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes, max_failed_rounds=max_failed_rounds,
                         seed=seed, bounded_influence=bounded_influence, node_settings=node_settings,
                         lr_schedule=lr_schedule, nodes=nodes, weighted_by_key=weighted_by_key,
                         min_available_nodes=min_available_nodes)
        self.dfedavgm_momentum = dfedavgm_momentum

    def _client_config(self) -> dict[str, Scalar]:
        """The relay's node settings and the nodes' local momentum, "dfedavgm-momentum"."""
        return {**super()._client_config(), "dfedavgm-momentum": self.dfedavgm_momentum}


@documented
class DFedSAM(DecentralizedRelay):
    """DFedSAM (Shi et al., 2023): DFedAvg's relay; each node trains with SAM, reading "sam-rho".
    """

    def __init__(self, *, sam_rho: float = DEFAULTS.sam_rho,
                          topology: str = DEFAULTS.topology,
                          peers: int = DEFAULTS.peers,
                          mixing: str = DEFAULTS.mixing,
                          relay_mixing: bool = DEFAULTS.relay_mixing,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          bounded_influence: BoundedInfluence | None = None,
                          node_settings: dict[str, Scalar] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(topology=topology, peers=peers, mixing=mixing, relay_mixing=relay_mixing,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes, max_failed_rounds=max_failed_rounds,
                         seed=seed, bounded_influence=bounded_influence, node_settings=node_settings,
                         lr_schedule=lr_schedule, nodes=nodes, weighted_by_key=weighted_by_key,
                         min_available_nodes=min_available_nodes)
        self.sam_rho = sam_rho

    def _client_config(self) -> dict[str, Scalar]:
        """The relay's node settings and SAM's radius, "sam-rho"."""
        return {**super()._client_config(), "sam-rho": self.sam_rho}


@documented
class OledFL(DecentralizedRelay):
    """OledFL (Li et al., 2024): DFedAvg's relay; each node restarts from an "opposite lookahead" of its model
    (`fedsynth.client.ole_restart`) with the train config's "ole-beta", then trains with SGD or, with
    `sam` (OledFL-SAM), with SAM at the config's "sam-rho".
    """

    def __init__(self, *, sam: bool = False,
                          ole_beta: float = DEFAULTS.ole_beta,
                          sam_rho: float = DEFAULTS.sam_rho,
                          topology: str = DEFAULTS.topology,
                          peers: int = DEFAULTS.peers,
                          mixing: str = DEFAULTS.mixing,
                          relay_mixing: bool = DEFAULTS.relay_mixing,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          bounded_influence: BoundedInfluence | None = None,
                          node_settings: dict[str, Scalar] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(topology=topology, peers=peers, mixing=mixing, relay_mixing=relay_mixing,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes, max_failed_rounds=max_failed_rounds,
                         seed=seed, bounded_influence=bounded_influence, node_settings=node_settings,
                         lr_schedule=lr_schedule, nodes=nodes, weighted_by_key=weighted_by_key,
                         min_available_nodes=min_available_nodes)
        self.sam, self.ole_beta, self.sam_rho = sam, ole_beta, sam_rho

    def _client_config(self) -> dict[str, Scalar]:
        """The relay's node settings, "ole-beta" and (OledFL-SAM) "sam-rho"."""
        return {**super()._client_config(), "ole-beta": self.ole_beta, **({"sam-rho": self.sam_rho} if self.sam else {})}
