"""Every algorithm's strategy class by its name: the names common/algorithm_table.py's `strategy` uses.

fedsynth's app builds a run's strategy from this catalog (server_app/registry.py), and `fedsynth.strategies`
exports the same classes under the same names, so the class a Flower developer imports is the class a
`fedsynth run` builds.
"""

from __future__ import annotations

from server_app.strategies.base import RoundStrategy
from server_app.strategies.decentralized import DFedAvg, DFedAvgM, DFedSAM, DPSGD, OledFL
from server_app.strategies.dynafed import DynaFed
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.fedavgm import FedAvgM
from server_app.strategies.fedddpm import FedDDPM
from server_app.strategies.fedddpm_plus import FedDDPMPlus
from server_app.strategies.fedsynsam import FedSynSAM
from server_app.strategies.node_rules import MOON, FedCOG, FedGamma, FedProx, FedSAM, MoFedSAM
from server_app.strategies.sam_baselines import FedLESAM, FedLESAMD, FedLESAMS, FedSMOO
from server_app.strategies.scaffold import Scaffold

STRATEGY_CLASSES: dict[str, type[RoundStrategy]] = {cls.__name__: cls for cls in (
    FedAvg, FedAvgM, FedProx, Scaffold, MOON, FedSAM, MoFedSAM, DPSGD, DFedAvg, DFedAvgM, DFedSAM, OledFL,
    FedCOG, FedLESAM, FedSynSAM, DynaFed, FedGamma, FedLESAMS, FedLESAMD, FedSMOO, FedDDPM, FedDDPMPlus,
)}
