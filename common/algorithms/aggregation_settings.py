"""The aggregation keys: how the server combines the clients' updates, and the bounds on what it accepts.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by the
centralized strategies' aggregation (server_app/): the mean (weighted, uniform, robust), the bounds
on an update's norm and a client's weight, and the server's step and momentum. That a decentralized
run has no server mean spans parts: `RunConfig` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.keys import check_choice, check_text, key, require

AGGREGATIONS = ("weighted", "uniform", "median", "trimmed-mean", "krum")
# `aggregation = "auto"` (the default): the algorithm's paper mean (its row's `mean`), resolved by the run config
AUTO_MEAN = "auto"
# The bounds `bounded-influence = true` sets where their keys are left unset (`bounded_influence_values`).
BOUNDED_UPDATE_NORM_RATIO = 1.5
BOUNDED_WEIGHT_SHARE = 0.4
# The defaults of `max-update-norm-ratio` and `max-weight-share`: "unset", outside their accepted ranges, so that
# an explicit value, the off values 0 and 1 included, always wins over the option's (`bounded_influence_values`).
UNSET_UPDATE_NORM_RATIO = -1.0
UNSET_WEIGHT_SHARE = 0.0


def bounded_influence_values(max_update_norm_ratio: float, max_weight_share: float,
                             bounded_influence: bool) -> tuple[float, float]:
    """The (ratio, share) a run applies: a key left unset takes the option's bound (1.5, 0.4) under bounded
    influence and its off value (0, 1) otherwise; a value given explicitly stays, whatever the option says."""
    ratio, share = max_update_norm_ratio, max_weight_share
    if ratio == UNSET_UPDATE_NORM_RATIO:
        ratio = BOUNDED_UPDATE_NORM_RATIO if bounded_influence else 0.0
    if share == UNSET_WEIGHT_SHARE:
        share = BOUNDED_WEIGHT_SHARE if bounded_influence else 1.0
    return ratio, share


@dataclass(frozen=True)
class AggregationSettings:
    """Aggregation: the server's mean of the updates, the bounds on them, and the server step."""

    aggregation: str = key(
        AUTO_MEAN, "Server combination of the updates: auto (the algorithm's paper mean: uniform 1/S for fedsynsam, "
        "fedddpm and fedddpm+, weighted by sample count for the others; docs/algorithms.md's table), weighted (by "
        "sample count) or uniform mean; robust: median (coordinate-wise), trimmed-mean (trim-fraction cut each side), "
        "krum (byzantine-nodes; centralized only). An explicit weighted or uniform runs that mean whatever the "
        "algorithm.", "FedSynSAM eq. 24 and FedDDPM: uniform; McMahan et al. 2017: weighted; Flower's FedMedian, "
        "FedTrimmedAvg, Krum",
    )
    trim_fraction: float = key(0.2, "aggregation = trimmed-mean: fraction beta of the updates cut at each end, "
                               "per coordinate; in [0, 0.5).", "FedTrimmedAvg")
    byzantine_nodes: int = key(1, "aggregation = krum: number f of malicious nodes Krum tolerates.", "Krum")
    max_update_norm: float = key(
        0.0, "Bound on the L2 norm of each client update w_i - w (all arrays; decentralized: each node's step from "
        "its last model, before it is relayed); 0: none. See update-norm-action."
    )
    max_update_norm_ratio: float = key(
        UNSET_UPDATE_NORM_RATIO, "Bound on each client update's L2 norm relative to the round: at most this multiple of the lower median "
        "of the round's update norms; a longer update is scaled down to it (clipped, never dropped). A compressed "
        "update is bounded by the norm its client measured before quantising (the qsgd payload's norms), not by the "
        "norm of the quantised vector, so quantiser noise is not clipped. Part of bounded influence (1.5 under "
        "bounded-influence = true: one node of three sending its update x 10^6 and claiming 10^12 examples leaves "
        "the final accuracy within 2 points of the honest run, tests/test_bounded_influence_runs.py). It changes the papers' "
        "aggregation; its cost on honest runs is in docs/reliability.md. 0: off (the papers' plain mean). -1 (the "
        "default): unset, i.e. 1.5 under bounded-influence = true and off otherwise; an explicit value, 0 included, "
        "wins over bounded-influence's."
    )
    update_norm_action: str = key(
        "clip", "A client update above max-update-norm: clip (scaled to the bound) or refuse (dropped as a failure)."
    )
    max_weight_share: float = key(
        UNSET_WEIGHT_SHARE, "Cap on any one client's share of a weighted mean (the model's sample-count weights, the test-count "
        "weighted local accuracy and train loss, FedDDPM's auxiliary set sizes); the excess goes to the others in "
        "proportion. The cap applies at every n > 1 clients as max(max-weight-share, 1/n): with 2 clients (or any n "
        "<= 1 / max-weight-share) the mean is uniform. Part of bounded influence (0.4 under bounded-influence = "
        "true: one node of three claiming 10^12 examples weighs 0.4, the others 0.3 each). It changes the papers' "
        "weighting: sampling 3 of 10 Dirichlet clients it binds in most rounds. A share in (0, 1]; 1: off (the "
        "papers' sample-count weights). 0 (the default): unset, i.e. 0.4 under bounded-influence = true and 1 "
        "otherwise; an explicit value, 1 included, wins over bounded-influence's."
    )
    bounded_influence: bool = key(
        False, "Bounded influence, for sites that do not trust each other: each update's norm bounded to "
        "max-update-norm-ratio (1.5 when left unset) x the round's lower-median update norm, each client's weight "
        "share capped at max-weight-share (0.4 when left unset; an explicit value of either key wins), and SCAFFOLD's control-variate delta scaled with its "
        "client's update. Off by default: an algorithm's name runs its paper's aggregation. When on, each round's "
        "metrics give clipped-updates (how many updates the bounds shortened) and weight-cap-bound (1 when the cap "
        "changed a weight). The deployment walk-through (docs/own-data.md) turns it on.", "fedsynth (SPEC 7)"
    )
    server_lr: float = key(1.0, "Server step eta_g on the mean update.", "FedAvg (McMahan et al., 2017): 1")

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, AggregationSettings)
        check_choice("aggregation", self.aggregation, AGGREGATIONS)
        require(0 <= self.trim_fraction < 0.5, "trim-fraction", self.trim_fraction, "a number in [0, 0.5)")
        require(self.byzantine_nodes >= 0, "byzantine-nodes", self.byzantine_nodes, "an integer >= 0")
        require(self.max_update_norm >= 0, "max-update-norm", self.max_update_norm, "a number >= 0 (0: no bound)")
        require(self.max_update_norm_ratio == 0 or self.max_update_norm_ratio >= 1, "max-update-norm-ratio",
                self.max_update_norm_ratio, "0 (off) or a number >= 1 (a multiple of the round's median update norm)")
        check_choice("update-norm-action", self.update_norm_action, ("clip", "refuse"))
        require(0 < self.max_weight_share <= 1, "max-weight-share", self.max_weight_share,
                "a share in (0, 1] (1: no cap)")
        require(self.server_lr > 0, "server-lr", self.server_lr, "a number > 0")


@dataclass(frozen=True)
class RecordBoundSettings:
    """The bound on the algorithm-specific array records of a reply (SCAFFOLD's, FedLESAM-D's, FedSMOO's)."""

    max_record_norm: float = key(
        0.0, "Bound on the L2 norm of each algorithm-specific array record of a reply (SCAFFOLD's and fedgamma's "
        "control-variate delta, FedLESAM-D's dynamic correction, FedSMOO's perturbation dual); 0: none. Acted on as "
        "update-norm-action says.", "fedsynth (SPEC 7): off"
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(self.max_record_norm >= 0, "max-record-norm", self.max_record_norm, "a number >= 0 (0: no bound)")


@dataclass(frozen=True)
class FedAvgMSettings:
    """FedAvgM: the server's momentum on the mean update."""

    server_momentum: float = key(0.9, "FedAvgM server momentum.", "FedCOG: 0.1")

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        require(0 <= self.server_momentum < 1, "server-momentum", self.server_momentum, "a number in [0, 1)")
