"""`fedsynth study --reuse`: another study's finished runs of the same config, entered and scored by this study."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedsynth.study.ledger import MAX_CURVE_POINTS, Ledger, thin
from fedsynth.study.runner import RunOutcome, StudyPaths, run_study
from fedsynth.study.reuse import rescore, reuse_runs
from fedsynth.study.studyfile import parse_study, report_runs

ROOT = Path(__file__).resolve().parents[1]


def _study(arms: dict, last_k: int = 2, claims: list | None = None):
    raw = {"study": {"report-seeds": [0, 1], "tuning-seeds": [], "last-k": last_k, "targets": [0.6]},
           "base": {"model": "mlp", "num-server-rounds": 4}, "arms": arms, "claims": claims or []}
    return parse_study(raw, Path("s.toml"))


CURVE = [[1, 0.2], [2, 0.5], [3, 0.7], [4, 0.6]]


PROVENANCE = {"commit": "abcdef1234567", "dirty": False, "fedsynth-version": "0.1.0", "flwr": "1.x", "torch": "2.x",
              "python": "3.11", "device": "cpu"}


def _entry(spec, exit_code: int = 0, curve: list | None = None) -> dict:
    """A finished run's entry, as the runner records it (a spec's key, configs and inputs; or a bare key)."""
    recorded = {"key": spec} if isinstance(spec, str) else {**spec.recorded(), "provenance": PROVENANCE}
    return {**recorded, "cell": "base", "arm": "base", "variant": "", "phase": "report", "exit-code": exit_code,
            "rounds": 4, "scores": {"central-accuracy": {"last-k": 0.123, "seconds-to:0.6": 42.0}},
            "curves": {"central-accuracy": curve if curve is not None else CURVE, "local-test-accuracy": []}}


def test_rescore_uses_this_studys_last_k_and_keeps_the_recorded_seconds():
    scores = rescore(_study({"x": {"algorithm": "fedavg"}}, last_k=3), _entry("k"))["central-accuracy"]
    assert scores["last-k"] == pytest.approx((0.5 + 0.7 + 0.6) / 3)  # not the other study's 0.123
    assert scores["final"] == 0.6 and scores["best"] == 0.7 and scores["rounds-to:0.6"] == 3.0
    assert scores["seconds-to:0.6"] == 42.0  # round times are not in a ledger: the recorded value


def test_rescore_refuses_curves_it_cannot_score_exactly():
    study = _study({"x": {"algorithm": "fedavg"}})
    thinned = [[r, 0.5] for r in range(1, MAX_CURVE_POINTS + 1)]
    assert rescore(study, _entry("k", curve=thinned)) is None  # a thinned curve has lost rounds: last-k would be wrong
    assert rescore(study, {**_entry("k"), "curves": {"other-metric": CURVE}}) is None
    no_seconds = {**_entry("k"), "scores": {}}
    assert "seconds-to:0.6" not in rescore(study, no_seconds)["central-accuracy"]


def test_a_report_run_needs_no_exact_tuning_metric_curve_but_a_tuning_run_does():
    study = _study({"x": {"algorithm": "fedavg"}})
    thinned = [[r, 0.5] for r in range(1, MAX_CURVE_POINTS + 1)]
    entry = {**_entry("k"), "curves": {"central-accuracy": CURVE, "local-test-accuracy": thinned}}
    report = rescore(study, entry, "report")
    assert report is not None and set(report) == {"central-accuracy"}  # the report never reads the tuning metric
    assert rescore(study, entry, "tune") is None  # tuning is scored on it: a thinned curve would pick wrongly
    with_claim = _study({"x": {"algorithm": "fedavg"}, "y": {"algorithm": "fedprox"}},
                        claims=[{"claim": "x > y", "metric": "local-test-accuracy"}])
    assert rescore(with_claim, entry, "report") is None  # a claim on it makes the report read it


def test_a_thinned_run_is_scored_from_its_run_folder_when_that_holds_every_round(tmp_path):
    study = _study({"x": {"algorithm": "fedavg"}})
    rounds = MAX_CURVE_POINTS + 50
    rows = [{"round": r, "central-accuracy": r / 1000, "local-test-accuracy": 0.5} for r in range(1, rounds + 1)]
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    thinned = thin([[row["round"], row["central-accuracy"]] for row in rows])
    entry = {**_entry("k"), "rounds": rounds, "run-dir": str(folder),
             "curves": {"central-accuracy": thinned, "local-test-accuracy": thinned}}
    scores = rescore(study, entry, "tune")["central-accuracy"]
    assert scores["last-k"] == pytest.approx((rounds - 1 + rounds) / 2 / 1000)  # the last 2 rounds, not thinned points
    assert scores["rounds-to:0.6"] is None and scores["final"] == pytest.approx(rounds / 1000)
    assert rescore(study, {**entry, "rounds": rounds + 1}, "tune") is None  # a folder missing rounds is not this run
    assert rescore(study, {**entry, "run-dir": str(tmp_path / "gone")}, "tune") is None


def test_a_run_of_the_same_config_is_entered_under_this_studys_cell(tmp_path):
    main = _study({"fedavg": {"algorithm": "fedavg"}, "fedprox": {"algorithm": "fedprox"}})
    ablation = _study({"base": {"algorithm": "fedavg"}, "new": {"algorithm": "fedavg", "lr": 0.5}})
    source = Ledger(tmp_path / "main.jsonl")
    for spec in report_runs(main, {}):
        source.append(_entry(spec, exit_code=1 if (spec.arm, spec.seed) == ("fedavg", 1) else 0))
    ledger = Ledger(tmp_path / "ablation.jsonl")
    assert reuse_runs(ablation, ledger, [source]) == 1  # fedavg seed 0; seed 1 failed; "new" has another config
    [entry] = ledger.entries.values()
    assert (entry["cell"], entry["arm"], entry["seed"]) == ("base", "base", 0)
    assert entry["reused-from"] == str(source.path)
    assert reuse_runs(ablation, Ledger(ledger.path), [source]) == 0  # already entered: nothing twice


def test_the_command_reuses_and_reports_and_refuses_a_missing_ledger(tmp_path):
    study_file = tmp_path / "ablation.toml"
    study_file.write_text('[study]\nname = "abl"\nreport-seeds = [0, 1]\ntuning-seeds = []\nlast-k = 2\n'
                          '[base]\nmodel = "mlp"\nnum-server-rounds = 4\n'
                          '[arms.base]\nalgorithm = "fedavg"\n[arms.new]\nalgorithm = "fedprox"\n'
                          '[[claims]]\nclaim = "new > base"\n')
    from fedsynth.study.studyfile import load_study
    study = load_study(study_file)
    source = Ledger(tmp_path / "main.jsonl")
    for spec in report_runs(study, {}):
        source.append(_entry(spec))
    command = [sys.executable, "-m", "fedsynth.cli", "study", str(study_file), "--out", str(tmp_path / "out")]
    dry = subprocess.run([*command, "--dry-run", "--reuse", str(source.path)], capture_output=True, text=True, cwd=ROOT)
    assert dry.returncode == 0 and dry.stdout.count("[reused]") == 4
    assert not (tmp_path / "out" / "ledger.jsonl").exists()  # a dry run writes nothing
    done = subprocess.run([*command, "--report-only", "--reuse", str(source.path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "reused 4 finished run(s)" in done.stdout
    assert len(Ledger(tmp_path / "out" / "ledger.jsonl").entries) == 4
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| new > base |" in report and f"4 run(s) reused from `{source.path}`" in report
    missing = subprocess.run([*command, "--reuse", str(tmp_path / "nope.jsonl")], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "no ledger at" in missing.stderr


def test_a_malformed_ledger_entry_is_named_and_left_out_not_a_crash(tmp_path):
    study_file = tmp_path / "broken.toml"
    study_file.write_text('[study]\nname = "broken"\nreport-seeds = [0, 1]\ntuning-seeds = []\nlast-k = 2\n'
                          '[base]\nmodel = "mlp"\nnum-server-rounds = 4\n'
                          '[arms.base]\nalgorithm = "fedavg"\n[arms.new]\nalgorithm = "fedprox"\n'
                          '[[claims]]\nclaim = "new > base"\n')
    from fedsynth.study.studyfile import load_study
    study = load_study(study_file)
    ledger = Ledger(tmp_path / "out" / "ledger.jsonl")
    specs = report_runs(study, {})
    for spec in specs[1:]:
        ledger.append(_entry(spec))
    ledger.append({**_entry(specs[0]), "scores": "x"})  # a hand-edited line
    reread = Ledger(ledger.path)
    assert specs[0].key not in reread and len(reread.entries) == len(specs) - 1
    assert reread.malformed == [f"line {len(specs)}: 'scores' must be a table, not str"]
    command = [sys.executable, "-m", "fedsynth.cli", "study", str(study_file), "--out", str(tmp_path / "out"),
               "--report-only"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "'scores' must be a table, not str; that entry is ignored" in done.stderr
    assert (tmp_path / "out" / "report.md").is_file()


@pytest.mark.parametrize("field, value", [
    ("curves", [1, 2]), ("exit-code", "0"), ("seconds", "slow"),
    ("scores", {"central-accuracy": {"last-k": "high"}}), ("scores", {"central-accuracy": 0.5}),
])
def test_each_wrongly_typed_field_is_malformed(field, value):
    from fedsynth.study.ledger import malformed_reason

    assert malformed_reason(_entry("k")) is None
    assert malformed_reason({**_entry("k"), field: value}) is not None


def test_report_runs_another_study_finished_at_the_tuned_values_are_reused_not_run(tmp_path):
    """The report runs are known only once tuning has chosen: --reuse is read again then, not only at the start."""
    raw = {"study": {"report-seeds": [0, 1], "tuning-seeds": [100], "last-k": 1},
           "base": {"model": "mlp", "num-server-rounds": 2}, "arms": {"x": {"algorithm": "fedavg", "grid": {"lr": [0.1, 0.2]}}}}
    study = parse_study(raw, Path("s.toml"))
    source = Ledger(tmp_path / "other.jsonl")
    for spec in report_runs(study, {"x": {"lr": 0.2}}):
        source.append({**spec.recorded(), "provenance": PROVENANCE, "exit-code": 0, "rounds": 2,
                       "curves": {"central-accuracy": [[1, 0.5], [2, 0.6]], "local-test-accuracy": []}})
    ran: list[tuple[str, dict]] = []

    def execute(spec, overrides, log_path):
        ran.append((spec.phase, spec.grid_point))
        folder = Path(overrides["results-dir"]) / overrides["run-name"]
        folder.mkdir(parents=True, exist_ok=True)
        validation = 0.9 if overrides["lr"] == 0.2 else 0.4  # tuning chooses lr 0.2
        rows = [{"round": r, "central-accuracy": 0.5, "local-test-accuracy": validation} for r in (1, 2)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return RunOutcome(0, 1.0)

    lines: list[str] = []
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    ledger = run_study(study, paths, execute, reuse=[source], write=lines.append)
    assert ran == [("tune", {"lr": 0.1}), ("tune", {"lr": 0.2})]  # no report run ran: both were the other study's
    reports = [e for e in ledger.entries.values() if e["phase"] == "report"]
    assert len(reports) == 2 and all(e["reused-from"] == str(source.path) for e in reports)
    assert "reused 2 report run(s) at the tuned values" in lines
