"""Decentralized FL's algorithms: the relay (server_app/strategies/relay.py) under each algorithm's name.

The ServerApp plays the network: each node gets its own message with its neighbours' models and its mixing
weights, and the nodes' rule differs. DPSGD and DFedAvg send nothing else (the nodes' rule is the
algorithm's: one SGD step, local SGD epochs); DFedAvgM sends the nodes' local momentum, DFedSAM SAM's radius
and OledFL Ole's beta (and, as OledFL-SAM, SAM's radius), under the run-config names the nodes read.
"""

from __future__ import annotations

from flwr.common.typing import Scalar

from common.algorithms.rule_settings import DFedAvgMSettings, OledFLClassSettings, SAMSettings
from common.keys import node_keys
from server_app.strategies.parameters import documented
from server_app.strategies.relay import DecentralizedRelay


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
    reading it from the train config (`DFedAvgMSettings`).
    """

    settings = DFedAvgMSettings


@documented
class DFedSAM(DecentralizedRelay):
    """DFedSAM (Shi et al., 2023): DFedAvg's relay; each node trains with SAM, reading rho (`SAMSettings`).
    """

    settings = SAMSettings


@documented
class OledFL(DecentralizedRelay):
    """OledFL (Li et al., 2024): DFedAvg's relay; each node restarts from an "opposite lookahead" of its model
    (`fedsynth.client.ole_restart`) with the train config's beta (`OledFLSettings`), then trains with SGD or, with
    `sam` (OledFL-SAM), with SAM at the config's rho (`SAMSettings`).
    """

    settings = OledFLClassSettings

    def client_config(self) -> dict[str, Scalar]:
        """The relay's settings, without SAM's radius for OledFL-SGD (`sam` false: its nodes do not perturb)."""
        config = super().client_config()
        for key in () if self.sam else node_keys(SAMSettings):
            if key not in self.node_settings:
                del config[key]
        return config
