"""benchmarks/quicktest_firing.py: Algorithm 3 replayed on a FID series (hand values)."""

from __future__ import annotations

import numpy as np

from tests.conftest import load_benchmark

script = load_benchmark("quicktest_firing")


def test_first_firing_hand_values():
    # test 0 sets the average to 100; test 1: |100 - 50| = 50 > 5, average 0.4 * 50 + 0.6 * 100 = 80;
    # test 2: |80 - 83| = 3 <= 5 -> fires at round 1 + 2 * 10 = 21
    assert script.first_firing([100.0, 50.0, 83.0, 0.0]) == (21, [50.0, 3.0])
    assert script.first_firing([100.0, 50.0, 90.0]) == (None, [50.0, 10.0])
    assert script.first_firing([382.5]) == (None, [])


def test_the_measured_cpu_series_never_fire_and_a_quiet_plateau_fires_once_the_first_score_is_forgotten():
    assert all(script.first_firing(scores)[0] is None for scores in script.MEASURED.values())
    # no noise: test n compares with the average of tests 0..n-1, 100 + 282.5 * 0.6^(n-1); the gap is <= 5 first
    # at n = 9 (282.5 * 0.6^8 = 4.74; 0.6^7: 7.9), round 1 + 9 * 10 = 91
    rounds = script.simulate(first=382.5, plateau=100.0, spread=0.0, tests=20, runs=3)
    np.testing.assert_array_equal(rounds, [91.0, 91.0, 91.0])
