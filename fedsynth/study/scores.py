"""One run's scores, read from its per-round metrics.

A single final round cannot tell an effect from noise (FedAvg's final FID in the
FedDDPM cpu preset was 193.5, 48.5 and 68.3 over three seeds), so every run is
scored several ways from the same curve: the final value, the best value, the
mean of the last k evaluations (SPEC 5's score), and the rounds and seconds
until a target is first reached. "Best" and "reached" follow the metric's
direction: FID, KID and losses are better when lower.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LOWER_IS_BETTER_PREFIXES = ("fid", "kid", "final-fid", "final-kid", "sharpness")


def lower_is_better(metric: str) -> bool:
    """FID, KID, sharpness and every loss improve downwards; accuracies upwards."""
    return metric.startswith(LOWER_IS_BETTER_PREFIXES) or metric.endswith("loss")


RUN_ACCURACY = "accuracy"  # the run's accuracy: central where the server evaluated, else the nodes' local test


def resolved_metric(rounds: Sequence[Mapping[str, Any]], metric: str) -> str:
    """The round key a metric is read from: `accuracy` is `central-accuracy` where the run has it, else
    `local-test-accuracy` (a server without a test set, docs/own-data.md); any other name is itself."""
    if metric != RUN_ACCURACY:
        return metric
    return "central-accuracy" if any("central-accuracy" in r for r in rounds) else "local-test-accuracy"


def curve(rounds: Iterable[Mapping[str, Any]], metric: str) -> list[tuple[int, float, float]]:
    """(round, value, seconds since the run started) of every round that evaluated `metric`.

    Seconds are the running sum of `round-time`; rounds without one add nothing.
    A non-finite value (a diverged run) is kept as NaN: it is a real outcome.
    """
    rounds = list(rounds)
    metric = resolved_metric(rounds, metric)
    points: list[tuple[int, float, float]] = []
    elapsed = 0.0
    for record in rounds:
        seconds = record.get("round-time")
        if isinstance(seconds, (int, float)) and math.isfinite(seconds):
            elapsed += float(seconds)
        if metric not in record:
            continue
        value = record[metric]
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        points.append((int(record.get("round", len(points))), number, elapsed))
    return points


def _is_better(value: float, target: float, lower: bool) -> bool:
    return value <= target if lower else value >= target


def score_curve(points: Sequence[tuple[int, float, float]], *, lower: bool, last_k: int,
                targets: Sequence[float] = ()) -> dict[str, float | None]:
    """final, best, last-k mean, and rounds-to:T / seconds-to:T for each target (None: never reached).

    A curve with no points scores None everywhere. A NaN value makes `final`
    and `last-k` NaN when it is among them (a diverged run is scored as such,
    not dropped); `best` ignores NaN values.
    """
    scores: dict[str, float | None] = {}
    values = [value for _, value, _ in points]
    finite = [value for value in values if math.isfinite(value)]
    scores["final"] = values[-1] if values else None
    scores["best"] = (min(finite) if lower else max(finite)) if finite else None
    tail = values[-last_k:] if values else []
    scores["last-k"] = (math.fsum(tail) / len(tail)) if tail else None
    for target in targets:
        reached = next(((r, s) for r, value, s in points if math.isfinite(value) and _is_better(value, target, lower)), None)
        scores[f"rounds-to:{target:g}"] = float(reached[0]) if reached else None
        scores[f"seconds-to:{target:g}"] = reached[1] if reached else None
    return scores


def score_run(rounds: Sequence[Mapping[str, Any]], metrics: Sequence[str], *, last_k: int,
              targets: Sequence[float] = ()) -> dict[str, dict[str, float | None]]:
    """Scores of every metric of one run: {metric: {score name: value}}. Targets apply to the first metric."""
    out: dict[str, dict[str, float | None]] = {}
    for index, metric in enumerate(metrics):
        out[metric] = score_curve(curve(rounds, metric), lower=lower_is_better(metric), last_k=last_k,
                                  targets=targets if index == 0 else ())
    return out
