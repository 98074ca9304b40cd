"""FedAdam's settings group: one frozen dataclass, its keys declared with `key` and checked by `check()`.

fedsynth makes each field the run-config key "fedadam.<key>" (the name of its class FedAdam, in lower case), a
keyword parameter of the strategy class, and, for the node's field, an entry of every train message that the node
checks with this same `check()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsynth.algorithm import NODE, key, require

REDDI = "Reddi et al. 2021, Algorithm 2"


@dataclass(frozen=True)
class FedAdamSettings:
    """FedAdam: the server's Adam step on the mean update, and the nodes' learning-rate factor."""

    eta: float = key(0.1, "server learning rate eta of the Adam step", REDDI)
    beta_1: float = key(0.9, "decay of the first moment m, in [0, 1)", REDDI)
    beta_2: float = key(0.99, "decay of the second moment v, in [0, 1)", REDDI)
    tau: float = key(1e-3, "adaptivity tau > 0 added to sqrt(v)", REDDI)
    local_lr_scale: float = key(1.0, "factor on the round's lr the nodes train at (the paper's eta_l = lr * factor)",
                                "this plugin", side=NODE)

    def check(self) -> None:
        """Each key in its range; ConfigError names it (fedsynth writes the whole key, "fedadam.eta")."""
        require(self.eta > 0, "eta", self.eta, "a number > 0")
        require(0 <= self.beta_1 < 1, "beta-1", self.beta_1, "a number in [0, 1)")
        require(0 <= self.beta_2 < 1, "beta-2", self.beta_2, "a number in [0, 1)")
        require(self.tau > 0, "tau", self.tau, "a number > 0")
        require(self.local_lr_scale > 0, "local-lr-scale", self.local_lr_scale, "a number > 0")
