"""When would FedDDPM+'s QuickTest fire at cpu size? Algorithm 3 replayed on measured and modelled FID series.

    .venv/bin/python benchmarks/quicktest_firing.py        # -> the tables of benchmarks/results/studies/fedddpm-cpu/VERDICT-quicktest.md

QuickTest (server_app/strategies/fedddpm_plus.py `quicktest`, used here unchanged) tests at rounds 1, 11, 21, ...
and fires when |EMA of the earlier scores - this score| <= threshold. Part 1 replays the fedddpm-cpu study's
measured QuickTest FIDs (500 samples, rounds 1, 11, 21, 31; details.md beside its report). Part 2 asks when it
would fire on a longer run: the first score is the measured round-1 FID (mean 382.5), every later one is drawn
around a plateau with the spread measured between evaluations (FedAvg's 1000-sample FID in rounds 15-40, per
seed; QuickTest's 500-sample FIDs at rounds 11-31). A Monte Carlo over 20,000 series of each noise level gives
the round of the first firing. A model, not a run: the real FID keeps falling slowly, which only delays firing
while the EMA trails it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_app.strategies.fedddpm_plus import quicktest  # noqa: E402

GAMMA, THRESHOLD, EVERY = 0.4, 5.0, 10  # studies/fedddpm-cpu.toml (gamma and test size are the paper's)
MEASURED = {  # seed: QuickTest FID at rounds 1, 11, 21, 31 (benchmarks/results/studies/fedddpm-cpu/details.md)
    0: [361.6, 129.7, 48.3, 26.9], 1: [387.4, 66.6, 85.7, 235.0], 2: [399.3, 76.9, 174.6, 104.0],
    3: [388.9, 130.8, 87.6, 42.6], 4: [375.5, 136.1, 96.2, 123.9],
}


def first_firing(scores: Sequence[float], gamma: float = GAMMA, threshold: float = THRESHOLD,
                 every: int = EVERY) -> tuple[int | None, list[float]]:
    """(1-based round of the first firing or None, |average - score| at each test after the first)."""
    average: float | None = None
    gaps = []
    for test, score in enumerate(scores):
        if average is not None:
            gaps.append(abs(average - score))
        fired, average = quicktest(average, score, gamma, threshold)
        if fired:
            return 1 + test * every, gaps
    return None, gaps


def simulate(first: float, plateau: float, spread: float, tests: int, runs: int, seed: int = 0) -> np.ndarray:
    """Firing rounds (np.inf: never within `tests` tests) of `runs` series: `first`, then plateau + N(0, spread)."""
    rng = np.random.default_rng(seed)
    rounds = np.full(runs, np.inf)
    for i in range(runs):
        later = np.maximum(plateau + spread * rng.standard_normal(tests - 1), 1.0)
        fired, _ = first_firing([first, *later])
        if fired is not None:
            rounds[i] = fired
    return rounds


def main() -> None:
    print("| seed | QuickTest FIDs (rounds 1, 11, 21, 31) | differences at 11, 21, 31 | fired |")
    print("| --- | --- | --- | --- |")
    for seed, scores in MEASURED.items():
        fired, gaps = first_firing(scores)
        print(f"| {seed} | {', '.join(f'{s:.1f}' for s in scores)} | {', '.join(f'{g:.1f}' for g in gaps)} | "
              f"{fired or 'no'} |")
    first = float(np.mean([s[0] for s in MEASURED.values()]))
    later = [v for s in MEASURED.values() for v in s[1:]]
    print(f"\nfirst score {first:.1f}; later QuickTest FIDs: mean {np.mean(later):.1f}, sd {np.std(later, ddof=1):.1f}")
    print("\n| plateau FID | spread between tests (sd) | P(fire by round 40) | by 150 | by 400 | median firing round "
          "| 10-90 % of firing rounds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for plateau, spread in [(100, 54), (100, 40), (100, 20), (100, 10), (100, 5), (30, 5), (30, 2)]:
        rounds = simulate(first, plateau, spread, tests=80, runs=20000)
        finite = rounds[np.isfinite(rounds)]
        by = [np.mean(rounds <= r) for r in (40, 150, 400)]
        lo, med, hi = np.percentile(rounds, [10, 50, 90])
        fmt = lambda r: f"{r:.0f}" if np.isfinite(r) else "> 791"  # noqa: E731
        print(f"| {plateau} | {spread} | {by[0]:.3f} | {by[1]:.3f} | {by[2]:.3f} | {fmt(med)} | {fmt(lo)}-{fmt(hi)} |"
              if len(finite) else f"| {plateau} | {spread} | 0 | 0 | 0 | never | - |")


if __name__ == "__main__":
    main()
