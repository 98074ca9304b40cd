"""A study report's claim figure (`claims.png`): written by every report, and its bars are the report's numbers."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

from fedsynth.study.ledger import Ledger
from fedsynth.study.figure import paper_difference, plotted_bars
from fedsynth.study.report import write_report
from fedsynth.study.studyfile import parse_study, report_runs

ROOT = Path(__file__).resolve().parent.parent
CLAIM_LINE = re.compile(r"^- \*\*(?P<claim>.+?)\*\*(?: \((?P<variant>[^)]+)\))?, (?P<score>.+?): difference "
                        r"(?P<mean>\S+), 95 % CI (?:\[(?P<low>\S+), (?P<high>\S+)\]|–) over (?P<n>\d+) seeds "
                        r"→ \*\*(?P<verdict>.+?)\*\*$", re.MULTILINE)


def report_claims(report: str) -> list[dict[str, str]]:
    return [match.groupdict() for match in CLAIM_LINE.finditer(report)]


def assert_bars_match_report(folder: Path) -> int:
    """Every claim line of report.md is one bar of claims.png with the same numbers (to the report's digits)."""
    lines = report_claims((folder / "report.md").read_text())
    bars = plotted_bars(folder / "claims.png")
    assert len(bars) == len(lines) > 0
    for line, bar in zip(lines, bars):
        assert bar["label"] == line["claim"] + (f" ({line['variant']})" if line["variant"] else "")
        assert bar["verdict"] == line["verdict"] and bar["n"] == int(line["n"])
        digits = len(line["mean"].split(".")[1]) if "." in line["mean"] else 0
        assert f"{bar['mean']:+.{digits}f}" == line["mean"]
        if line["low"] is not None:
            assert (f"{bar['low']:+.{digits}f}", f"{bar['high']:+.{digits}f}") == (line["low"], line["high"])
        else:
            assert math.isnan(bar["low"]) and math.isnan(bar["high"])
    return len(bars)


def hand_study():
    raw = {
        "study": {"report-seeds": [0, 1, 2], "tuning-seeds": [5], "display-scale": 100},
        "base": {"model": "mlp"},
        "variants": {"a": {"alpha": 0.1}, "b": {"alpha": 1.0}},
        "arms": {"x": {"algorithm": "fedavg", "paper": {"a": 80.0, "b": 70.0}},
                 "y": {"algorithm": "fedprox", "paper": {"a": 78.5}}},
        "claims": ["x > y", {"claim": "x < y", "score": "rounds-to:0.7"}],
    }
    return parse_study(raw, Path("hand.toml"))


def test_the_claim_figure_has_the_reports_numbers_and_the_papers_difference(tmp_path):
    study = hand_study()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    # variant a: x − y = +0.01, +0.03, +0.02 (accuracy) -> +1, +3, +2 points: mean 2, sd 1,
    # 95 % CI 2 ± 4.30265 / sqrt(3) = [-0.4841, +4.4841] (half-width 2.4841);
    # variant b: x is 0.05 above on every seed -> holds
    accuracy = {("x", "a"): [0.81, 0.83, 0.82], ("y", "a"): [0.80, 0.80, 0.80],
                ("x", "b"): [0.75, 0.76, 0.77], ("y", "b"): [0.70, 0.71, 0.72]}
    for spec in report_runs(study, {}):
        value = accuracy[(spec.arm, spec.variant)][spec.seed]
        ledger.append({**spec.recorded(), "exit-code": 0, "rounds": 10,
                       "scores": {"central-accuracy": {"last-k": value, "rounds-to:0.7": 4.0 + (spec.arm == "y")}}})
    write_report(study, ledger, tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "](claims.png)" in report  # linked from the report
    assert assert_bars_match_report(tmp_path / "out") == 4
    bars = {bar["label"]: bar for bar in plotted_bars(tmp_path / "out" / "claims.png")}
    a = bars["x > y (a)"]
    assert (round(a["mean"], 4), round(a["low"], 4), round(a["high"], 4)) == (2.0, -0.4841, 4.4841)
    assert a["verdict"] == "not resolved" and a["paper"] == 1.5  # 80.0 − 78.5
    b = bars["x > y (b)"]
    assert round(b["mean"], 4) == 5.0 and b["verdict"] == "holds" and b["paper"] is None  # y has no paper number at b
    rounds = bars["x < y (a)"]
    assert rounds["mean"] == -1.0 and rounds["verdict"] == "holds" and rounds["paper"] is None  # rounds: no paper
    assert rounds["panel"] != a["panel"]  # rounds and accuracy points never share an axis
    assert (a["unit"], rounds["unit"]) == ("points", "rounds")


def test_the_paper_difference_needs_both_arms_numbers_on_the_study_metric():
    study = hand_study()
    accuracy, rounds = study.claims
    assert paper_difference(study, accuracy, "a") == 1.5
    assert paper_difference(study, accuracy, "b") is None
    assert paper_difference(study, rounds, "a") is None


def test_report_only_on_a_committed_study_writes_the_claim_figure_and_changes_no_number(tmp_path):
    committed = ROOT / "benchmarks" / "results" / "studies" / "fedsynsam-bucket-8b-tuned"
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(committed / "ledger.jsonl", out / "ledger.jsonl")
    study_file = ROOT / "studies" / f"{committed.name}.toml"
    done = subprocess.run([sys.executable, "-m", "fedsynth.cli", "study", str(study_file), "--report-only", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "report.md").read_text() == (committed / "report.md").read_text()  # committed report is current
    assert assert_bars_match_report(out) == 3
    papers = [bar["paper"] for bar in plotted_bars(out / "claims.png")]
    assert [round(p, 2) for p in papers] == [round(83.93 - 82.88, 2), round(82.88 - 81.19, 2), round(83.93 - 81.19, 2)]


def test_a_report_without_claims_draws_no_claim_figure(tmp_path):
    raw = {"study": {"report-seeds": [0, 1], "tuning-seeds": [5]}, "base": {"model": "mlp"},
           "arms": {"x": {"algorithm": "fedavg"}}}
    study = parse_study(raw, Path("no-claims.toml"))
    write_report(study, Ledger(tmp_path / "ledger.jsonl"), tmp_path / "out")
    assert (tmp_path / "out" / "report.md").is_file() and not (tmp_path / "out" / "claims.png").exists()
    assert "claims.png" not in (tmp_path / "out" / "report.md").read_text()
