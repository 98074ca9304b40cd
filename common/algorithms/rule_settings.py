"""The node rules' own settings: one settings group per algorithm (FedProx, MOON, the SAM family, DFedAvgM, OledFL).

Each group is one frozen dataclass of run-config keys (common/keys.py `key`), declared once here: its keys'
names, defaults, meanings and checks. The run config composes the groups (common/run/config.py `PARTS`), a
strategy class declares the group its nodes read (`settings = SAMSettings`: server_app/strategies/), which
gives the class its keyword parameters and sends the group's keys in every train message, and the node
reads its rule's settings back from the message with the same group (common/run/client_settings.py
`rule_settings`). A group extends another by inheritance (MoFedSAM's is SAM's radius and its own alpha);
each checks only the fields it declares (`check_group` runs them all). Torch-free: the run config and
`fedsynth.strategies` import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.algorithms.aggregation_settings import RecordBoundSettings
from common.keys import NODE, SERVER, key, require


@dataclass(frozen=True)
class FedProxSettings:
    """FedProx: the proximal weight the nodes add to their loss."""

    proximal_mu: float = key(0.01, "FedProx proximal weight mu.", "FedProx", side=NODE)

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(self.proximal_mu >= 0, "proximal-mu", self.proximal_mu, "a number >= 0")


@dataclass(frozen=True)
class MOONSettings:
    """MOON: the weight and temperature of the model-contrastive loss."""

    moon_mu: float = key(1.0, "MOON contrastive weight mu.", "MOON; FedCOG used 0.01", side=NODE)
    moon_tau: float = key(0.5, "MOON temperature tau.", "MOON", side=NODE)

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(self.moon_mu >= 0, "moon-mu", self.moon_mu, "a number >= 0")
        require(self.moon_tau > 0, "moon-tau", self.moon_tau, "a number > 0")


@dataclass(frozen=True)
class SAMSettings:
    """SAM (FedSAM and the rules that perturb before their step): the perturbation radius."""

    sam_rho: float = key(0.05, "SAM perturbation radius rho.", "FedSAM", side=NODE)

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(self.sam_rho >= 0, "sam-rho", self.sam_rho, "a number >= 0")


@dataclass(frozen=True)
class MoFedSAMSettings(SAMSettings):
    """MoFedSAM: the weight of the local SAM gradient against the previous global update (and SAM's radius)."""

    mofedsam_alpha: float = key(0.1, "MoFedSAM weight of the local SAM gradient.", "MoFedSAM", side=NODE)

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(0 <= self.mofedsam_alpha <= 1, "mofedsam-alpha", self.mofedsam_alpha, "a number in [0, 1]")


@dataclass(frozen=True)
class FedDynSAMSettings(SAMSettings, RecordBoundSettings):
    """FedLESAM-D and FedSMOO: the weight of the FedDyn-style dynamic regulariser (and SAM's radius, the record bound)."""

    dyn_alpha: float = key(
        0.1, "fedlesam-d / fedsmoo: weight alpha of the FedDyn-style dynamic regulariser.", "FedDyn; FedSMOO",
        side=NODE,
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(self.dyn_alpha > 0, "dyn-alpha", self.dyn_alpha, "a number > 0")


@dataclass(frozen=True)
class DFedAvgMSettings:
    """DFedAvgM: the nodes' local momentum after mixing."""

    dfedavgm_momentum: float = key(0.9, "DFedAvgM: local SGD momentum (buffer reset every round).",
                                   "DFedAvgM: 0.9", side=NODE)

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(0 <= self.dfedavgm_momentum < 1, "dfedavgm-momentum", self.dfedavgm_momentum, "a number in [0, 1)")


@dataclass(frozen=True)
class OledFLSettings:
    """OledFL: the Ole coefficient of the opposite lookahead the nodes restart from."""

    ole_beta: float = key(0.99, "OledFL: Ole coefficient beta, start from x_i + beta (x_i - z_i^{t-1}); in [0, 1).",
                          "OledFL: 0.99 CIFAR-10, 0.8 CIFAR-100", side=NODE)

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(0 <= self.ole_beta < 1, "ole-beta", self.ole_beta, "a number in [0, 1) (OledFL diverges for beta >= 1)")


@dataclass(frozen=True)
class OledFLClassSettings(SAMSettings, OledFLSettings):
    """OledFL's strategy class: Ole's beta, SAM's radius (sent with `sam`, OledFL-SAM) and the variant.

    Not a part of the run config: `sam` is which row runs (`oledfl-sgd` or `oledfl-sam`), not a key."""

    sam: bool = key(False, "False: OledFL-SGD; True: OledFL-SAM (the nodes read SAM's radius from the config).",
                    "the row: oledfl-sgd or oledfl-sam", side=SERVER)
