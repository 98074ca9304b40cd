"""Server-side registry: server-rule name -> strategy class, and algorithm name -> strategy class.

The algorithms and the server rule each uses are common/algorithm_table.py's table; this module is the
server's half of it. Adding an algorithm on the server side means adding its row there and, if its
server rule is new, one strategy module under `strategies/` and one entry in `SERVER_RULES`.
"""

from __future__ import annotations

from common.algorithm_table import ALGORITHMS
from server_app.strategies.relay import DecentralizedRelay
from server_app.strategies.fedavg import FedAvgStrategy
from server_app.strategies.fedavgm import FedAvgMStrategy
from server_app.strategies.fedddpm import FedDDPMPlusStrategy, FedDDPMStrategy
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.scaffold import ScaffoldStrategy
from server_app.strategies.dynafed import DynaFedStrategy
from server_app.strategies.fedsynsam import FedSynSAMStrategy
from server_app.strategies.sam_baselines import (
    FedLESAMDStrategy, FedLESAMSStrategy, FedLESAMStrategy, FedSMOOStrategy,
)

# the server rules by the names common/algorithm_table.py's `Algorithm.server` uses
SERVER_RULES: dict[str, type[FedAvgStrategy] | type[DecentralizedRelay]] = {
    "fedavg": FedAvgStrategy,
    "fedavgm": FedAvgMStrategy,
    "scaffold": ScaffoldStrategy,
    "previous-update": PreviousUpdateStrategy,
    "relay": DecentralizedRelay,  # decentralized FL (issue 6): the ServerApp only relays
    "fedlesam": FedLESAMStrategy,
    "fedsynsam": FedSynSAMStrategy,
    "dynafed": DynaFedStrategy,
    "fedlesam-s": FedLESAMSStrategy,
    "fedlesam-d": FedLESAMDStrategy,
    "fedsmoo": FedSMOOStrategy,
    "fedddpm": FedDDPMStrategy,
    "fedddpm+": FedDDPMPlusStrategy,
}

# algorithm -> its server's strategy class, in the table's order
SERVER_STRATEGIES: dict[str, type[FedAvgStrategy] | type[DecentralizedRelay]] = {
    name: SERVER_RULES[algorithm.server] for name, algorithm in ALGORITHMS.items()
}
