"""benchmarks/study_logged_values.py: values logged once per run, read from the runs' folders, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsynth.study.ledger import Ledger
from fedsynth.study.studyfile import parse_study, report_runs
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def logged():
    return load_benchmark("study_logged_values")


def test_the_first_round_that_logged_a_number_wins(logged):
    rounds = [{"round": 1, "loss": "n/a"}, {"round": 2}, {"round": 3, "loss": 0.5}, {"round": 4, "loss": 0.1}]
    assert logged.first_logged(rounds, "loss") == 0.5
    assert logged.first_logged(rounds, "absent") is None
    assert logged.first_logged([{"flag": True}], "flag") is None  # a boolean is not a value


def test_ratio_column_by_hand(logged):
    assert logged.with_ratio({"end": 0.4, "start": 1.6}, ("end", "start"))["end/start"] == pytest.approx(0.25)
    assert logged.with_ratio({"end": 0.4, "start": 0.0}, ("end", "start"))["end/start"] is None
    assert logged.with_ratio({"end": 0.4}, None) == {"end": 0.4}


def test_arms_are_tabulated_from_the_runs_folders(tmp_path, logged):
    raw = {"study": {"report-seeds": [0, 1], "tuning-seeds": []}, "base": {"model": "mlp"},
           "arms": {"x": {"algorithm": "fedavg"}, "y": {"algorithm": "fedprox"}}, "claims": ["x > y"]}
    study = parse_study(raw, Path("s.toml"))
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ends = {("x", 0): 0.2, ("x", 1): 0.4}
    for spec in report_runs(study, {}):
        folder = tmp_path / spec.folder_name
        folder.mkdir()
        rounds = [{"round": 1, "train-loss": 1.0}]
        if spec.arm == "x":  # y never distils: no row for it
            rounds.append({"round": 2, "distill-loss-start": 1.0, "distill-loss-end": ends[spec.arm, spec.seed]})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
        ledger.append({**spec.recorded(), "exit-code": 0, "run-dir": str(folder)})
    keys = ["distill-loss-start", "distill-loss-end"]
    table = logged.collect(study, ledger, keys, ("distill-loss-end", "distill-loss-start"))
    assert set(table) == {"x"} and table["x"][1]["distill-loss-end/distill-loss-start"] == pytest.approx(0.4)
    text = logged.render(study, table, [*keys, "distill-loss-end/distill-loss-start"])
    # mean 0.3, sample sd of (0.2, 0.4) = 0.1414
    assert "| x | 2 | 1 ± 0 (1, 1) | 0.3 ± 0.14 (0.2, 0.4) | 0.3 ± 0.14 (0.2, 0.4) |" in text
