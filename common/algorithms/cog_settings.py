"""The FedCOG keys (issue 4): complementary generation and knowledge distillation, a client-side plug-in.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), and the one
representation of FedCOG's settings: the FedCOG client rule (client_app/fedcog.py, `fedsynth.client`'s
`fedcog_distillation` and `train_fedcog`) takes a `CogSettings`. Which base algorithm and model FedCOG may
plug into spans parts: `RunConfig` checks it.

FedCOG's settings are the server's (SPEC 3: every setting a client needs travels in the train message's
config): fedsynth's ServerApp sends them all under their run-config names (`COG_KEYS`, `cog_config`) on a run
with FedCOG, with `cog-start-round` resolved to the first FedCOG round (`first_cog_round`), and fedsynth's node
reads them back as the group (common/run/client_settings.py `rule_settings`, which refuses a missing, mistyped or
out-of-range value naming its key; `from_config` reads them for a ClientApp of one's own).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.algorithms.cog_names import COG_ABLATIONS, KD_WEIGHTINGS
from common.keys import NODE, SERVER, check_choice, check_text, config_value, key, key_name, parameter, require, same_key


def sent_value(key: str, value: Any, default: Any) -> Any:
    """`value` of the key `key` as a message carries it, of `default`'s type: a switch a bool (not the text
    "false"), a count an integer (not a bool), a number finite; ConfigError names the key otherwise."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, kind)
    require(ok, key, value, f"a {'finite number' if kind is float else kind.__name__}")
    return kind(value)


@dataclass(frozen=True)
class CogSettings:
    """FedCOG: when it starts, the generation of the inputs a client lacks, and the distillation on them."""

    cog: bool = key(
        False, "Turn FedCOG on over the configured base algorithm (fedavg, fedavgm, fedprox, scaffold, moon); "
        "the same as algorithm = \"X+cog\" (\"fedcog\" = \"fedavg+cog\").", "SPEC 4.2", side=NODE,
    )
    cog_start_round: int = key(
        0, "First FedCOG round; earlier rounds run the base unchanged. 0: the paper's schedule scaled to "
        "num-server-rounds (round 51 of 70, 15 of 20).", "FedCOG: 50 base + 20 FedCOG rounds", side=NODE,
    )
    gen_budget: int = key(256, "FedCOG: generation budget G, split over the classes a client lacks.", "FedCOG: 256",
                          side=NODE)
    gen_steps: int = key(100, "FedCOG: Adam steps on the generated inputs.", "FedCOG: 100 (Table 10)", side=NODE)
    gen_lr: float = key(0.01, "FedCOG: Adam learning rate of the inputs (betas 0.5, 0.9).", "FedCOG code: 0.01",
                      side=NODE)
    lambda_dis: float = key(0.1, "FedCOG: weight of the disagreement term 1 - JS(global, previous local).",
                            "FedCOG: 0.1", side=NODE)
    kd_weighting: str = key(
        "balanced", "FedCOG: balanced (c_real, c_kd from real vs missing sample counts) or fixed "
        "(c_real = 1, c_kd = lambda-kd).", "FedCOG A.2.2 and code", side=NODE,
    )
    lambda_kd: float = key(0.01, "FedCOG: KD weight with kd-weighting = fixed.", "FedCOG: 0.01", side=NODE)
    cog_ablation: str = key(
        "none", "FedCOG Table 5: none (full), noise (Gaussian inputs, not optimised), global-only "
        "(no disagreement term), hard-label (CE on the global model's argmax instead of KD).", "FedCOG Table 5",
        side=NODE,
    )
    cog_grid_partition: int = key(
        0, "FedCOG: the node with this partition id writes fedcog-generated.png (its generated inputs per "
        "class) to its results folder each FedCOG round; -1: none. Needs run-name.", "FedCOG Fig. 5", side=NODE,
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, CogSettings)
        require(self.cog_start_round >= 0, "cog-start-round", self.cog_start_round,
                "an integer >= 0 (0: paper's schedule)")
        require(self.gen_budget >= 1, "gen-budget", self.gen_budget, "an integer >= 1")
        require(self.gen_steps >= 0, "gen-steps", self.gen_steps, "an integer >= 0 (0: Gaussian-noise inputs)")
        require(self.gen_lr > 0, "gen-lr", self.gen_lr, "a number > 0")
        require(self.lambda_dis >= 0, "lambda-dis", self.lambda_dis, "a number >= 0")
        check_choice("kd-weighting", self.kd_weighting, KD_WEIGHTINGS)
        require(self.lambda_kd >= 0, "lambda-kd", self.lambda_kd, "a number >= 0")
        check_choice("cog-ablation", self.cog_ablation, COG_ABLATIONS)
        require(self.cog_grid_partition >= -1, "cog-grid-partition", self.cog_grid_partition,
                "a partition id, or -1 for no grid")

    def first_cog_round(self, num_rounds: int) -> int:
        """The first round with FedCOG: `cog-start-round`, or with 0 the paper's schedule.

        The paper runs 50 rounds of the base and then 20 of FedCOG; `0` keeps that ratio for any run length
        (round 51 of 70, round 15 of 20), and at least the last round uses FedCOG.
        """
        if self.cog_start_round > 0:
            return self.cog_start_round
        return min(int(np.floor(num_rounds * 50 / 70 + 0.5)) + 1, num_rounds)

    @property
    def generation_steps(self) -> int:
        """Adam steps on the generated inputs: `gen-steps`, 0 with `cog-ablation = noise` (Table 5's ablation 1)."""
        return 0 if self.cog_ablation == "noise" else self.gen_steps

    @property
    def disagreement_weight(self) -> float:
        """Weight of the disagreement term: `lambda-dis`, 0 with `cog-ablation = global-only` (ablation 2)."""
        return 0.0 if self.cog_ablation == "global-only" else self.lambda_dis

    @property
    def hard_label(self) -> bool:
        """CE on the global model's argmax instead of KD: `cog-ablation = hard-label` (ablation 3)."""
        return self.cog_ablation == "hard-label"

    def cog_config(self) -> dict[str, Any]:
        """These settings as a train message's config entries, under their run-config keys (`COG_KEYS`)."""
        return {key_name(f.name): getattr(self, f.name) for f in dataclasses.fields(CogSettings)}

    @classmethod
    def of(cls, settings: "CogSettings") -> "CogSettings":
        """The FedCOG part of a run config (a `RunConfig` is a `CogSettings` with every other part's keys too)."""
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(CogSettings)})

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "CogSettings":
        """The settings a train message's config carries (`cog_config`), checked as the run config checks its keys:
        KeyError names a missing key, ConfigError a mistyped (a switch given as text), NaN or out-of-range one."""
        values = {f.name: sent_value(key_name(f.name), config_value(config, key_name(f.name)), f.default)
                  for f in dataclasses.fields(CogSettings)}
        settings = cls(**values)
        settings.check()
        return settings


# FedCOG's run-config keys: what a train message of a run with FedCOG carries for it
COG_KEYS: tuple[str, ...] = tuple(key_name(f.name) for f in dataclasses.fields(CogSettings))
# the key of FedCOG's first round, which FedCOG's own class sends (resolved: `first_cog_round`)
COG_START_KEY: str = key_name("cog_start_round")
# the key that turns FedCOG on over a base algorithm (the run config's checks across parts name it)
COG_KEY: str = key_name("cog")


@dataclass(frozen=True)
class FedCOGRuleSettings:
    """The settings group of the `fedcog` row (common/algorithm_table.py names it by path): the first FedCOG round,
    the key of FedCOG's part that FedCOG's own class sends from its own parameter (`FedCOGClassSettings`); the
    row's client rule reads the rest of the part as every row with FedCOG does (`COG_KEYS`)."""

    cog_start_round: int = same_key(CogSettings, "cog_start_round")

    def check(self) -> None:
        """The first round is checked as the run config checks its key."""
        CogSettings(cog_start_round=self.cog_start_round).check()


@dataclass(frozen=True)
class FedCOGClassSettings:
    """FedCOG's strategy class (not a part of the run config): its first FedCOG round and the generation and
    distillation settings it sends its nodes itself (server_app/strategies/node_rules.py `FedCOG`)."""

    cog_start_round: int = same_key(CogSettings, "cog_start_round", side=SERVER)
    cog_settings: CogSettings | None = parameter(None, "FedCOG's generation and distillation settings; None: "
                                                       "their defaults.")

    def check(self) -> None:
        """The first round is checked as the run config checks its key; `cog_settings` checked itself."""
        CogSettings(cog_start_round=self.cog_start_round).check()
