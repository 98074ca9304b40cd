"""Means, confidence intervals and claim verdicts over seeds.

SPEC 5: each claimed pair ("A beats B") is tested by the paired difference over
the report seeds (the same seed is the same split and client sampling for every
arm, so pairing removes the seed's share of the noise), with a two-sided 95 %
Student-t confidence interval from `scipy.stats`. The verdict is **holds** when
the interval lies on the claimed side of 0, **reversed** when it lies on the
other side, and **not resolved** when it contains 0 (or only one pair exists,
where no interval can be formed); **not run yet** when no pair exists, as in the
report of a study that is part way through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

HOLDS = "holds"
REVERSED = "reversed"
NOT_RESOLVED = "not resolved"
NOT_RUN = "not run yet"


@dataclass(frozen=True)
class Interval:
    """Mean, sample standard deviation and two-sided confidence interval of n values."""

    n: int
    mean: float
    sd: float
    low: float
    high: float


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The Student-t interval of the mean; NaN bounds for n < 2, a point for zero spread."""
    data = [float(v) for v in values]
    n = len(data)
    if n == 0:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    mean = math.fsum(data) / n
    if n < 2:
        return Interval(1, mean, math.nan, math.nan, math.nan)
    if min(data) == max(data):  # no spread: the interval is the value itself (and no rounding noise)
        return Interval(n, data[0], 0.0, data[0], data[0])
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1)) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def verdict(interval: Interval, direction: str) -> str:
    """holds / reversed / not resolved / not run yet (no pair) for "A > B" (direction ">") or "A < B" on A − B."""
    if direction not in (">", "<"):
        raise ValueError(f"a claim's direction is '>' or '<', not {direction!r}")
    if interval.n == 0:
        return NOT_RUN
    if interval.n < 2 or math.isnan(interval.low) or math.isnan(interval.high):
        return NOT_RESOLVED
    if interval.low > 0:
        return HOLDS if direction == ">" else REVERSED
    if interval.high < 0:
        return HOLDS if direction == "<" else REVERSED
    return NOT_RESOLVED


def paired_differences(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """A − B on every seed both have a finite score for."""
    return {seed: a[seed] - b[seed] for seed in sorted(set(a) & set(b))
            if math.isfinite(a[seed]) and math.isfinite(b[seed])}
