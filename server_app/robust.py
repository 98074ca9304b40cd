"""Bounded influence of one client: update-norm bounds and robust aggregation rules.

A weighted mean lets one client move the global model as far as it likes: a
10^6x update, or a false sample count, takes it over. The defences:

- `max-update-norm-ratio` (off by default; 1.5 under `bounded-influence = true`):
  each update's L2 norm is bounded
  by that multiple of the round's median update norm (the lower median, so that
  of two updates neither exceeds the ratio times the other); a longer one is
  scaled down to the bound, never dropped. A node's update x 10^6 then counts as
  at most 1.5 honest-length updates in its own direction (at ratios 2 and 3, one
  node of three still cost 14 and 37 points in tests/test_bounded_influence_runs.py's run). The
  bound moves with the updates as they shrink over a run, so it needs no tuning
  per task.
- `max-update-norm`: each update's L2 norm over all arrays is bounded by a fixed
  value (off by default); a larger one is scaled down to the bound
  (`update-norm-action = "clip"`, as in DP-FedAvg's fixed clipping) or refused
  and recorded as a failure (`"refuse"`).
- `aggregation = median | trimmed-mean | krum`: the server step uses a robust
  combination of the updates instead of their mean, with Flower's own rules
  (`flwr.serverapp.strategy`: FedMedian's coordinate-wise median, FedTrimmedAvg's
  `trim_mean`, Krum's `select_multikrum`) applied to the updates w_i - w. All
  three are shift-invariant, so on updates they select or combine exactly what
  Flower's strategies do on the models. They ignore sample counts, as Flower's do.
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from common.keys import key_name
from common.records import Weights, to_record

ROBUST_AGGREGATIONS = ("median", "trimmed-mean", "krum")


def update_norm(delta: Weights) -> float:
    """L2 norm of an update over all its arrays (float64 accumulation)."""
    return float(np.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in delta.values())))


def clip_update(delta: Weights, max_norm: float) -> Weights:
    """The update scaled to norm `max_norm` if it is longer; unchanged otherwise."""
    norm = update_norm(delta)
    if norm <= max_norm or norm == 0.0:
        return delta
    return scale_update(delta, max_norm / norm)


def scale_update(delta: Weights, factor: float) -> Weights:
    """The update times `factor` (accumulated in float64, each array back in its dtype); itself when factor is 1."""
    if factor == 1.0:
        return delta
    return {name: (value.astype(np.float64) * factor).astype(value.dtype) for name, value in delta.items()}


def lower_median(values: list[float]) -> float:
    """The lower median: the ceil(n/2)-th smallest value (of two, the smaller)."""
    return sorted(values)[(len(values) - 1) // 2]


def median_norm_bound(deltas: list[Weights], ratio: float) -> float:
    """`ratio` x the lower median of the updates' norms; inf when the bound is off (ratio 0) or n < 2."""
    return median_bound([update_norm(d) for d in deltas], ratio)


def median_bound(norms: list[float], ratio: float) -> float:
    """`ratio` x the lower median of `norms`; inf when the bound is off (ratio 0) or n < 2."""
    if ratio <= 0 or len(norms) < 2:
        return float("inf")
    return ratio * lower_median(norms)


def clip_factors(norms: list[float], max_norm: float, ratio: float) -> list[float]:
    """The factor (<= 1) each update of L2 norm `norms[i]` is scaled by: the fixed bound `max_norm` (when > 0),
    then `ratio` x the lower median of the norms after it (`median_bound`, when ratio > 0).

    The fixed bound comes first, so the median is taken of norms that already respect it. Clipping only ever
    shortens an update: none is dropped. A median of 0 (most updates empty) leaves the rest as they are rather
    than erasing them. 1.0 means unchanged.
    """
    factors = [max_norm / norm if max_norm > 0 and norm > max_norm else 1.0 for norm in norms]
    after = [norm * factor for norm, factor in zip(norms, factors)]
    bound = median_bound(after, ratio)
    if not 0 < bound < float("inf"):
        return factors
    return [factor * (bound / norm) if norm > bound else factor for factor, norm in zip(factors, after)]


def bounded_updates(deltas: list[Weights], max_norm: float, ratio: float,
                    norms: list[float] | None = None) -> list[Weights]:
    """The updates as the server combines them: each scaled by its `clip_factors` factor.

    `norms` are the updates' norms as their clients measured them (a quantised update's norm before
    quantising, server_app/strategies/fedavg.py); None: the norms of `deltas`.
    """
    if max_norm <= 0 and ratio <= 0:
        return deltas
    norms = [update_norm(d) for d in deltas] if norms is None else norms
    return [scale_update(d, f) for d, f in zip(deltas, clip_factors(norms, max_norm, ratio))]


def record_norm_problem(record: Weights, max_norm: float, action: str, name: str) -> str | None:
    """Why an algorithm-specific record must be refused for its norm (the record bound, `RecordBoundSettings`, action refuse), or None."""
    if max_norm > 0 and action == "refuse" and (norm := update_norm(record)) > max_norm:
        return f"record '{name}' has L2 norm {norm:.4g}, above {key_name('max_record_norm')} = {max_norm:g}"
    return None


def bounded_record(record: Weights, max_norm: float) -> Weights:
    """An algorithm-specific record clipped to the record bound (`RecordBoundSettings`; unchanged when the bound is 0 or not reached)."""
    return clip_update(record, max_norm) if max_norm > 0 else record


def coordinate_median(deltas: list[Weights]) -> Weights:
    """Coordinate-wise median of the updates (Flower's FedMedian rule)."""
    return {name: np.median(np.stack([d[name] for d in deltas]), axis=0).astype(np.float32) for name in deltas[0]}


def trimmed_mean(deltas: list[Weights], beta: float) -> Weights:
    """Coordinate-wise mean after cutting the int(beta*n) largest and smallest values (Flower's FedTrimmedAvg rule)."""
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

    return {name: np.asarray(trim_mean(np.stack([d[name] for d in deltas]), beta)).astype(np.float32)
            for name in deltas[0]}


def krum_index(deltas: list[Weights], num_byzantine: int) -> int:
    """Index of the update Krum selects: least sum of squared distances to its n - f - 2 nearest (Flower's rule)."""
    from flwr.serverapp.strategy.multikrum import select_multikrum

    contents = [RecordDict({"arrays": to_record({k: v.astype(np.float64) for k, v in d.items()})}) for d in deltas]
    chosen = select_multikrum(contents, num_byzantine, 1)[0]
    return next(i for i, c in enumerate(contents) if c is chosen)


def combine_updates(deltas: list[Weights], rule: str, trim_fraction: float, num_byzantine: int) -> Weights:
    """The robust combination `rule` of the updates (one of ROBUST_AGGREGATIONS)."""
    if rule == "median":
        return coordinate_median(deltas)
    if rule == "trimmed-mean":
        return trimmed_mean(deltas, trim_fraction)
    if rule == "krum":
        return {k: v.astype(np.float32) for k, v in deltas[krum_index(deltas, num_byzantine)].items()}
    raise ValueError(f"unknown robust aggregation {rule!r}; known: {', '.join(ROBUST_AGGREGATIONS)}")
