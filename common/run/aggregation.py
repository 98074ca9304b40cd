"""How a strategy combines its nodes' updates, as one value: the mean, robust or not, and its bounds.

A strategy takes it as its one parameter `aggregation` instead of the run config's keys
(common/algorithms/aggregation_settings.py):

- the plain rule (the papers'): "weighted" (the sample-weighted mean), "uniform", "median", or a robust mean
  with its own setting, `TrimmedMean(fraction)` (key `trim-fraction`) or `Krum(byzantine_nodes)`
  (key `byzantine-nodes`); the names "trimmed-mean" and "krum" take their defaults;
- the same mean under bounded influence: `Bounded(mean, influence)`, whose `influence` is a
  `BoundedInfluence`; `Bounded("weighted")` (`influence=BOUNDED_INFLUENCE`) is what the run config's
  `bounded-influence = true` sets: each update bounded to 1.5x the round's lower-median update norm, any node's
  weight share capped at 0.4 (keys `max-update-norm-ratio`, `max-weight-share`, with `max-update-norm` and
  `update-norm-action`).

Each value checks itself when it is built, with the run config's checks and messages (common/run/config.py
`check_parameters`). `aggregation_of` and `bounded_influence_of` are where fedsynth's app turns a run config's
keys into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from common.algorithms.aggregation_settings import (
    BOUNDED_UPDATE_NORM_RATIO, BOUNDED_WEIGHT_SHARE, UNSET_UPDATE_NORM_RATIO, UNSET_WEIGHT_SHARE,
)
from common.errors import ConfigError
from common.run.config import RunConfig, check_parameters


@dataclass(frozen=True)
class TrimmedMean:
    """The coordinate-wise trimmed mean: `fraction` of the updates cut at each end (in [0, 0.5))."""

    fraction: float = 0.2

    def __post_init__(self) -> None:
        check_parameters("TrimmedMean", {"trim_fraction": self.fraction})


@dataclass(frozen=True)
class Krum:
    """Krum (Blanchard et al., 2017): the update closest to its n - f - 2 neighbours, tolerating
    `byzantine_nodes` = f malicious nodes."""

    byzantine_nodes: int = 1

    def __post_init__(self) -> None:
        check_parameters("Krum", {"byzantine_nodes": self.byzantine_nodes})


# a mean without bounds: a rule's name, or a robust mean with its setting
Mean = Union[str, TrimmedMean, Krum]


@dataclass(frozen=True)
class AggregationRule:
    """An `aggregation` value spelled out: the rule's run-config name and the robust means' settings."""

    name: str = "weighted"
    trim_fraction: float = TrimmedMean.fraction
    byzantine_nodes: int = Krum.byzantine_nodes


def aggregation_rule(aggregation: Aggregation) -> AggregationRule:
    """The rule an `aggregation` value names, a `Bounded` one its mean's (a name is checked by the strategy, as the
    run config checks it)."""
    if isinstance(aggregation, Bounded):
        return aggregation_rule(aggregation.mean)
    if isinstance(aggregation, TrimmedMean):
        return AggregationRule("trimmed-mean", trim_fraction=aggregation.fraction)
    if isinstance(aggregation, Krum):
        return AggregationRule("krum", byzantine_nodes=aggregation.byzantine_nodes)
    return AggregationRule(aggregation)


@dataclass(frozen=True)
class BoundedInfluence:
    """Bounded influence, for sites that do not trust each other (docs/reliability.md).

    update_norm_ratio : each update's L2 norm bounded to this multiple of the round's lower-median update
        norm, scaled down (never dropped); 0: off. Run-config key `max-update-norm-ratio`.
    weight_share : cap on any one node's share of a weighted mean (model and metrics); 1: off.
        `max-weight-share`.
    update_norm : an absolute bound on each update's L2 norm; 0: none. `max-update-norm`.
    action : an update (or an algorithm's record) above `update_norm` is "clip"ped to it or "refuse"d.
        `update-norm-action`.

    The defaults are the option's (`BOUNDED_INFLUENCE`): the bounds `bounded-influence = true` sets. A
    centralized strategy takes it with its mean, `aggregation=Bounded(mean, influence)`.
    """

    update_norm_ratio: float = BOUNDED_UPDATE_NORM_RATIO
    weight_share: float = BOUNDED_WEIGHT_SHARE
    update_norm: float = 0.0
    action: str = "clip"

    def __post_init__(self) -> None:
        # the run config's "unset" values mean "the option's bound"; a value here is the bound itself
        for name, value, unset in (("max-update-norm-ratio", self.update_norm_ratio, UNSET_UPDATE_NORM_RATIO),
                                   ("max-weight-share", self.weight_share, UNSET_WEIGHT_SHARE)):
            if value == unset and not isinstance(value, bool):
                raise ConfigError(f"BoundedInfluence: run config key '{name}' = {value!r} is invalid here; "
                                  "accepted: the bound itself (its default is the option's)")
        check_parameters("BoundedInfluence", {
            "max_update_norm_ratio": self.update_norm_ratio, "max_weight_share": self.weight_share,
            "max_update_norm": self.update_norm, "update_norm_action": self.action,
        })


# What `bounded-influence = true` sets: 1.5x the lower-median update norm, a weight share of at most 0.4.
BOUNDED_INFLUENCE = BoundedInfluence()

# The values a strategy runs with when it is given no bounds (a plain mean): every bound off (the plain rule).
NO_BOUNDS = BoundedInfluence(update_norm_ratio=0.0, weight_share=1.0)


@dataclass(frozen=True)
class Bounded:
    """A mean under bounded influence: the value of `aggregation` that bounds what any one node can do to it.

    mean : the mean bounded, any plain `aggregation` value: "weighted", "uniform", "median", `TrimmedMean(...)` or
        `Krum(...)` (run-config keys `aggregation`, `trim-fraction`, `byzantine-nodes`). Required: the bounds
        leave the class's paper mean to you to restate, so adding them never changes the mean.
    influence : the bounds, a `BoundedInfluence` (default `BOUNDED_INFLUENCE`: what the run config's
        `bounded-influence = true` sets, 1.5x the round's lower-median update norm and a weight share of at
        most 0.4).

    `FedAvg(aggregation=Bounded("weighted"))` is `fedsynth run` with `bounded-influence = true`;
    `FedSynSAM(aggregation=Bounded("uniform", BoundedInfluence(weight_share=0.5, update_norm_ratio=0.0)))` caps
    only the weight share, under FedSynSAM's paper mean. Each round's train metrics then carry "clipped-updates"
    and "weight-cap-bound".
    """

    mean: Mean
    influence: BoundedInfluence = BOUNDED_INFLUENCE

    def __post_init__(self) -> None:
        # the mean's name is checked by the strategy it is given to, as a plain `aggregation` name is
        if not isinstance(self.mean, (str, TrimmedMean, Krum)):
            raise ConfigError(f"Bounded: mean = {self.mean!r} is invalid; accepted: \"weighted\", \"uniform\", "
                              "\"median\", TrimmedMean(...) or Krum(...)")
        if not isinstance(self.influence, BoundedInfluence):
            raise ConfigError(f"Bounded: influence = {self.influence!r} is invalid; accepted: a BoundedInfluence")


# The value of a strategy's `aggregation`: a plain mean (`Mean`), or one under bounded influence (`Bounded`).
Aggregation = Union[str, TrimmedMean, Krum, Bounded]


def mean_of(aggregation: Aggregation) -> Mean:
    """The mean an `aggregation` value runs, without its bounds."""
    return aggregation.mean if isinstance(aggregation, Bounded) else aggregation


def bounds(aggregation: Aggregation) -> BoundedInfluence:
    """The bounds an `aggregation` value runs with: a `Bounded` one's `influence`, `NO_BOUNDS` for a plain mean."""
    return aggregation.influence if isinstance(aggregation, Bounded) else NO_BOUNDS


def bounded_influence_of(cfg: RunConfig) -> BoundedInfluence | None:
    """The bounds of a run config (`bounded-influence` and the four bound keys, as resolved by `RunConfig`); None
    when every bound is off and the action is the default's."""
    given = BoundedInfluence(update_norm_ratio=cfg.max_update_norm_ratio, weight_share=cfg.max_weight_share,
                             update_norm=cfg.max_update_norm, action=cfg.update_norm_action)
    return None if given == NO_BOUNDS else given


def aggregation_of(cfg: RunConfig) -> Aggregation:
    """The `aggregation` value of a run config's keys `aggregation`, `trim-fraction` and `byzantine-nodes`, and
    under bounds (`bounded_influence_of`) that mean `Bounded` by them."""
    mean: Mean = cfg.aggregation
    if cfg.aggregation == "trimmed-mean":
        mean = TrimmedMean(cfg.trim_fraction)
    elif cfg.aggregation == "krum":
        mean = Krum(cfg.byzantine_nodes)
    influence = bounded_influence_of(cfg)
    return mean if influence is None else Bounded(mean, influence)
