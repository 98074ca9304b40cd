"""benchmarks/study_windows.py: a study's claims rescored over a longer window, from its ledger, by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedsynth.study.ledger import MAX_CURVE_POINTS, Ledger
from fedsynth.study.studyfile import parse_study, report_runs
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def windows():
    return load_benchmark("study_windows")


def test_window_mean_and_spread_by_hand(windows):
    mean, sd = windows.window_stats([0.1, 0.9, 0.5, 0.7, 0.3], window=4)
    assert mean == pytest.approx(0.6) and sd == pytest.approx(math.sqrt(0.05))  # 0.9 0.5 0.7 0.3
    assert windows.window_stats([0.4, 0.6], window=20) == pytest.approx((0.5, 0.1))  # fewer than the window: all
    assert all(math.isnan(v) for v in windows.window_stats([], window=3))
    with pytest.raises(ValueError):
        windows.window_stats([0.5], window=0)


def _study():
    raw = {"study": {"report-seeds": [0, 1, 2], "tuning-seeds": [], "last-k": 1, "display-scale": 100},
           "base": {"model": "mlp"},
           "arms": {"x": {"algorithm": "fedavg"}, "y": {"algorithm": "fedprox"}},
           "claims": ["x > y"]}
    return parse_study(raw, Path("s.toml"))


def _ledger(tmp_path, study, curves):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for spec in report_runs(study, {}):
        if spec.arm not in curves:
            continue
        points = [[5 * (i + 1), v] for i, v in enumerate(curves[spec.arm][spec.seed])]
        ledger.append({**spec.recorded(), "exit-code": 0, "rounds": 5 * len(points), "curves": {"central-accuracy": points},
                       "scores": {"central-accuracy": {"last-k": points[-1][1]}}})
    return Ledger(tmp_path / "ledger.jsonl")


def test_a_claim_the_last_evaluation_reverses_holds_over_the_window(tmp_path, windows):
    study = _study()
    # x swings: above y in its last three evaluations but one, and just below y in the last one
    curves = {"x": [[0.80, 0.84, 0.70], [0.82, 0.84, 0.71], [0.80, 0.86, 0.72]],
              "y": [[0.75, 0.75, 0.75]] * 3}
    ledger = _ledger(tmp_path, study, curves)
    before = {key: entry["scores"]["central-accuracy"]["last-k"] for key, entry in ledger.entries.items()}
    text = windows.render(study, ledger, window=3)
    # the caller's ledger keeps its own scores: the rescoring works on a copy
    assert {key: entry["scores"]["central-accuracy"]["last-k"] for key, entry in ledger.entries.items()} == before
    # window means x: 0.78, 0.79, 0.79333; y: 0.75 -> differences +3.00, +4.00, +4.33 (display scale 100)
    # mean 3.7778, sd 0.6939, t(0.975, 2) = 4.30265 -> half-width 1.7237
    assert "| x > y | – | 0: +3.00, 1: +4.00, 2: +4.33 | +3.78 | [+2.05, +5.50] | holds |" in text
    # spread inside x's window, seed 0: pstdev(0.80, 0.84, 0.70) = 0.05888; mean over seeds in points
    assert "| x | 3 | 0: 78.00, 1: 79.00, 2: 79.33 | 78.78 |" in text
    assert "| y | 3 | 0: 75.00, 1: 75.00, 2: 75.00 | 75.00 | 0.00 |" in text
    # at a window of one evaluation the same ledger reverses the claim (x's last values 0.70-0.72 < 0.75)
    assert "| reversed |" in windows.render(study, _ledger(tmp_path / "again", study, curves), window=1)


def test_a_thinned_curve_is_refused(tmp_path, windows):
    study = _study()
    long = [0.5] * MAX_CURVE_POINTS
    with pytest.raises(SystemExit, match="thinned"):
        windows.render(study, _ledger(tmp_path, study, {"x": [long] * 3, "y": [long] * 3}), window=20)


def test_points_until_keeps_the_evaluations_at_or_before_the_round(windows):
    points = [[0, 0.1], [5, 0.5], [10, 0.7], [15, 0.6]]
    assert windows.points_until(points, 10) == [0.1, 0.5, 0.7]
    assert windows.points_until(points, 12) == [0.1, 0.5, 0.7]
    assert windows.points_until(points, None) == [0.1, 0.5, 0.7, 0.6]


def test_a_window_ending_at_a_round_scores_that_evaluation(tmp_path, windows):
    """FedCOG's Table 3: one evaluation at a round inside the run, not at its end."""
    study = _study()
    curves = {"x": [[0.80, 0.84, 0.70], [0.82, 0.84, 0.71], [0.80, 0.86, 0.72]],
              "y": [[0.75, 0.75, 0.75]] * 3}
    # evaluations at rounds 5, 10, 15: round 12 ends the window at round 10's, x 0.84, 0.84, 0.86 against 0.75
    # -> +9.00, +9.00, +11.00; mean 9.6667, sd 1.1547, half-width 4.30265 * 1.1547 / sqrt(3) = 2.8684 -> [6.798, 12.535]
    text = windows.render(study, _ledger(tmp_path, study, curves), window=1, end_round=12)
    assert "over the last 1 evaluations up to round 12" in text and "--end-round 12" in text
    assert "| x > y | – | 0: +9.00, 1: +9.00, 2: +11.00 | +9.67 | [+6.80, +12.54] | holds |" in text


def test_a_claim_without_runs_says_so(tmp_path, windows):
    study = _study()
    text = windows.render(study, _ledger(tmp_path, study, {"x": [[0.8], [0.8], [0.8]]}), window=1)
    assert "| x > y | – | – | – | – | not run yet |" in text and "nan" not in text
