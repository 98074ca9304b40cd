"""The FedSynSAM and DynaFed keys (issue 3): the trajectory, its distillation, and the synthetic set's use.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), and the one
representation of these settings: the trajectory distillation (server_app/distillation.py `distill`,
`real_oracle`) takes a `SynSAMSettings` (its `auto`/0 values resolved by the images:
`distillation_resolved`), the strategies that use the synthetic set (server_app/strategies/fedsynsam.py)
build one from their parameters, and the FedSynSAM client rule (common/algorithms/synsam.py) reads
`synsam-beta` and `synsam-mix` from the train message.
What needs the training split on the server (real-oracle, perturbation-diagnostic) spans parts:
`RunConfig` refuses it with partition = node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.algorithms.rule_settings import SAMSettings
from common.keys import NODE, check_choice, check_text, key, require

# The distillation's trajectory-matching loss (server_app/distillation.py `matching_loss`).
MATCHING_LOSSES = ("normalized", "paper")
# Where D_syn comes from (server_app/strategies/fedsynsam.py): the method, or a diagnostic oracle of real images.
REAL_ORACLE = "real-oracle"
SYNTHETIC_SOURCES = ("distilled", REAL_ORACLE)


@dataclass(frozen=True)
class SynSAMSettings:
    """FedSynSAM and DynaFed: the trajectory, its distillation into a synthetic set, and the perturbation diagnostic."""

    trajectory_rounds: int = key(
        30, "R: fedsynsam/dynafed keep the global models w^0..w^R and distil the synthetic set after round R.",
        "FedSynSAM: 30",
    )
    synthetic_ipc: int = key(20, "Synthetic images per class distilled from the trajectory.", "FedSynSAM: 20")
    distill_iterations: int = key(200, "M: trajectory-matching iterations.", "FedSynSAM: 200")
    distill_inner_steps: int = key(
        0, "s: steps on the synthetic set per matched segment (0: 3 for grey images, 5 for colour).",
        "FedSynSAM: 3 / 5",
    )
    distill_optimizer: str = key(
        "auto", "Optimizer of the synthetic images: adam, sgd (momentum 0.5), auto (adam grey, sgd colour).",
        "FedSynSAM",
    )
    distill_lr: float = key(0.0, "Learning rate of the synthetic images (0: 0.05 with adam, 1000 with sgd).",
                            "FedSynSAM")
    distill_alpha_init: float = key(0.01, "Initial value of the learnable inner step size alpha.", "FedSynSAM")
    distill_alpha_lr: float = key(1e-5, "SGD learning rate of alpha.", "FedSynSAM")
    synthetic_source: str = key(
        "distilled", "fedsynsam/dynafed: where D_syn comes from after round R: distilled (the method: trajectory "
        "matching) or real-oracle (a diagnostic, NOT the method: synthetic-ipc real training images per class drawn "
        "with the run's seed; the server reads the training split, which a federated server does not hold).",
        "diagnostic",
    )
    matching_loss: str = key(
        "normalized", "fedsynsam/dynafed distillation loss: normalized (||w_hat - w^{r+s}||^2 / ||w^r - w^{r+s}||^2, "
        "SPEC 4.3's choice, as in trajectory matching) or paper (FedSynSAM eq. 9's unnormalised ||w_hat - w^{r+s}||^2, "
        "faithful to the paper). distill-loss-start/-end are logged in the chosen loss.", "FedSynSAM eq. 9; SPEC 4.3"
    )
    perturbation_diagnostic: bool = key(
        False, "Simulation only: log each round the cosine of the FedSAM/FedLESAM/FedSynSAM ascent directions "
        "with the true gradient on the sampled clients' data.", "FedSynSAM Fig. 2",
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, SynSAMSettings)
        require(self.trajectory_rounds >= 1, "trajectory-rounds", self.trajectory_rounds, "an integer >= 1")
        require(self.synthetic_ipc >= 1, "synthetic-ipc", self.synthetic_ipc, "an integer >= 1")
        require(self.distill_iterations >= 0, "distill-iterations", self.distill_iterations, "an integer >= 0")
        require(self.distill_inner_steps >= 0, "distill-inner-steps", self.distill_inner_steps,
                "an integer >= 0 (0: by dataset)")
        check_choice("distill-optimizer", self.distill_optimizer, ("auto", "adam", "sgd"))
        require(self.distill_lr >= 0, "distill-lr", self.distill_lr, "a number >= 0 (0: by optimizer)")
        require(self.distill_alpha_init > 0, "distill-alpha-init", self.distill_alpha_init, "a number > 0")
        require(self.distill_alpha_lr >= 0, "distill-alpha-lr", self.distill_alpha_lr, "a number >= 0")
        check_choice("matching-loss", self.matching_loss, MATCHING_LOSSES)
        check_choice("synthetic-source", self.synthetic_source, SYNTHETIC_SOURCES)

    @classmethod
    def of(cls, settings: "SynSAMSettings") -> "SynSAMSettings":
        """The FedSynSAM part of a run config (a `RunConfig` is a `SynSAMSettings` with every other part's keys)."""
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(SynSAMSettings)})

    def distillation_resolved(self, grey: bool) -> "SynSAMSettings":
        """These settings with the distillation's `auto`/0 values resolved by the images: grey images s = 3 and
        Adam at 0.05, colour ones s = 5 and SGD at 1000 (FedSynSAM's code); a value given stays."""
        optimizer = self.distill_optimizer if self.distill_optimizer != "auto" else ("adam" if grey else "sgd")
        return dataclasses.replace(
            self, distill_optimizer=optimizer, distill_inner_steps=self.distill_inner_steps or (3 if grey else 5),
            distill_lr=self.distill_lr or (0.05 if optimizer == "adam" else 1000.0),
        )

    @property
    def normalized_matching(self) -> bool:
        """Whether the matching loss is normalised by the segment's length (`matching-loss = normalized`)."""
        return self.matching_loss == "normalized"


@dataclass(frozen=True)
class SynSAMRuleSettings(SAMSettings):
    """FedSynSAM's node rule: the mix of the local and synthetic gradients in the ascent (and SAM's radius)."""

    synsam_beta: float = key(
        0.9, "FedSynSAM: weight of the local gradient in the ascent direction (1 - beta: synthetic).", "FedSynSAM",
        side=NODE,
    )
    synsam_mix: str = key(
        "paper", "FedSynSAM ascent mix: paper (beta grad_local + (1 - beta) grad_syn) or normalized (an ablation, "
        "not the paper's: each gradient scaled to unit norm before mixing).", "FedSynSAM eq. 14; ablation", side=NODE,
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(0 <= self.synsam_beta <= 1, "synsam-beta", self.synsam_beta, "a number in [0, 1]")
        check_choice("synsam-mix", self.synsam_mix, ("paper", "normalized"))


@dataclass(frozen=True)
class DynaFedSettings:
    """DynaFed: the server's training on the synthetic set after every aggregation."""

    dynafed_lr: float = key(1e-4, "DynaFed: Adam learning rate of the server's training on the synthetic set.",
                            "SPEC 4.1")
    dynafed_epochs: int = key(5, "DynaFed: epochs on the synthetic set after every aggregation.", "SPEC 4.1")

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(self.dynafed_lr > 0, "dynafed-lr", self.dynafed_lr, "a number > 0")
        require(self.dynafed_epochs >= 0, "dynafed-epochs", self.dynafed_epochs, "an integer >= 0")
