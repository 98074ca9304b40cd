"""Decentralized FL's relay under its public names: DFedAvg and OledFL.

The ServerApp plays the network (server_app/strategies/relay.py): each node gets its own message with its
neighbours' models and its mixing weights; OledFL adds Ole's beta (and SAM's rho) to the nodes' settings.
"""

from __future__ import annotations

from typing import Callable

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
class OledFL(DecentralizedRelay):
    """OledFL (Li et al., 2024): DFedAvg's relay; each node restarts from an "opposite lookahead" of its model
    (`fedsynth.client.ole_restart`) with the train config's "ole-beta", then trains with SGD or, with
    `sam`, with SAM at the config's "sam-rho".
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
                          max_weight_share: float = DEFAULTS.max_weight_share,
                          max_update_norm: float = DEFAULTS.max_update_norm,
                          update_norm_action: str = DEFAULTS.update_norm_action,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(node_settings={"ole-beta": ole_beta, **({"sam-rho": sam_rho} if sam else {})},
                         topology=topology, peers=peers, mixing=mixing, relay_mixing=relay_mixing,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, max_weight_share=max_weight_share,
                         max_update_norm=max_update_norm, update_norm_action=update_norm_action,
                         lr_schedule=lr_schedule, nodes=nodes, weighted_by_key=weighted_by_key,
                         min_available_nodes=min_available_nodes)
