"""`fedsynth study`: scores, statistics and verdicts against hand values; the study file's checks; tuning,
resume and the report through the real apps (in process, fast), and one tiny study through Flower's engine."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsynth.study.ledger import Ledger, thin
from fedsynth.study.scores import curve, lower_is_better, score_curve
from fedsynth.study.statistics import HOLDS, NOT_RESOLVED, NOT_RUN, REVERSED, paired_differences, t_interval, verdict
from fedsynth.study.runner import RunOutcome, StudyPaths, run_study
from fedsynth.study.plan import choose
from fedsynth.study.report import grid_edges, render_markdown
from fedsynth.study.studyfile import StudyError, load_study, parse_study, report_runs, select, tuning_runs
from tests.conftest import write_fashion_mnist

ROOT = Path(__file__).resolve().parent.parent


# ---- scores ---------------------------------------------------------------------------------------------------

def test_scores_of_an_accuracy_curve_by_hand():
    rounds = [{"round": 0, "central-accuracy": 0.1},
              {"round": 1, "central-accuracy": 0.5, "round-time": 2.0},
              {"round": 2, "round-time": 3.0},  # no evaluation this round: adds time only
              {"round": 3, "central-accuracy": 0.7, "round-time": 1.0},
              {"round": 4, "central-accuracy": 0.6, "round-time": 1.0}]
    points = curve(rounds, "central-accuracy")
    assert points == [(0, 0.1, 0.0), (1, 0.5, 2.0), (3, 0.7, 6.0), (4, 0.6, 7.0)]
    scores = score_curve(points, lower=False, last_k=2, targets=[0.5, 0.65, 0.9])
    assert scores["final"] == 0.6
    assert scores["best"] == 0.7
    assert scores["last-k"] == pytest.approx(0.65)
    assert scores["rounds-to:0.5"] == 1 and scores["seconds-to:0.5"] == 2.0
    assert scores["rounds-to:0.65"] == 3 and scores["seconds-to:0.65"] == 6.0
    assert scores["rounds-to:0.9"] is None and scores["seconds-to:0.9"] is None


def test_fid_is_lower_is_better_and_nan_counts_as_diverged():
    assert lower_is_better("fid") and lower_is_better("kid") and lower_is_better("central-loss")
    assert not lower_is_better("central-accuracy") and not lower_is_better("local-test-accuracy")
    points = [(10, 90.0, 1.0), (20, 60.0, 2.0), (30, 70.0, 3.0)]
    scores = score_curve(points, lower=True, last_k=2, targets=[65.0])
    assert scores["best"] == 60.0 and scores["last-k"] == 65.0 and scores["rounds-to:65"] == 20
    diverged = score_curve([(1, 0.5, 0.0), (2, math.nan, 0.0)], lower=False, last_k=2)
    assert math.isnan(diverged["final"]) and math.isnan(diverged["last-k"]) and diverged["best"] == 0.5


# ---- statistics -----------------------------------------------------------------------------------------------

def test_t_interval_by_hand():
    # mean 2, sd 1, n 3: half width = t(0.975, 2) * 1 / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    interval = t_interval([1.0, 2.0, 3.0])
    assert interval.mean == 2.0 and interval.sd == 1.0
    assert interval.low == pytest.approx(2.0 - 2.484138, abs=1e-5)
    assert interval.high == pytest.approx(2.0 + 2.484138, abs=1e-5)


def test_paired_verdicts_positive_negative_and_zero_crossing():
    a = {0: 0.80, 1: 0.82, 2: 0.81}
    # differences 0.02, 0.03, 0.02: mean 0.02333, sd 0.005774, half width 4.302653*0.005774/sqrt(3) = 0.014343
    positive = t_interval(list(paired_differences(a, {0: 0.78, 1: 0.79, 2: 0.79}).values()))
    assert positive.low == pytest.approx(0.023333 - 0.014343, abs=1e-5)
    assert verdict(positive, ">") == HOLDS and verdict(positive, "<") == REVERSED
    negative = t_interval(list(paired_differences(a, {0: 0.83, 1: 0.84, 2: 0.84}).values()))
    assert negative.high < 0 and verdict(negative, ">") == REVERSED and verdict(negative, "<") == HOLDS
    # differences +0.02, -0.02, +0.01: the interval contains 0
    crossing = t_interval(list(paired_differences(a, {0: 0.78, 1: 0.84, 2: 0.80}).values()))
    assert crossing.low < 0 < crossing.high and verdict(crossing, ">") == NOT_RESOLVED


def test_one_pair_or_unpaired_seeds_resolve_nothing():
    assert paired_differences({0: 1.0, 1: 2.0}, {1: 1.5, 2: 0.0}) == {1: 0.5}
    assert verdict(t_interval([0.5]), ">") == NOT_RESOLVED
    assert verdict(t_interval([]), ">") == NOT_RUN  # a study part way through: no pair yet
    assert paired_differences({0: math.nan}, {0: 1.0}) == {}
    same = t_interval([0.1, 0.1, 0.1])
    assert (same.low, same.high) == (0.1, 0.1) and verdict(same, ">") == HOLDS


# ---- the study file -------------------------------------------------------------------------------------------

def _raw(**study):
    return {
        "study": {"report-seeds": [0, 1], "tuning-seeds": [5], **study},
        "base": {"model": "mlp"},
        "variants": {"a": {"alpha": 0.1}, "b": {"alpha": 1.0}},
        "arms": {"x": {"algorithm": "fedavg", "grid": {"lr": [0.01, 0.1]}, "paper": {"a": 80.0}},
                 "y": {"algorithm": "fedprox", "lr": 0.05}},
        "claims": ["x > y", {"claim": "x < y", "score": "rounds-to:0.7"}],
    }


def test_study_file_expands_variants_grids_and_claims():
    study = parse_study(_raw(), Path("s.toml"))
    assert [c[0] for c in study.cells()] == ["x@a", "y@a", "x@b", "y@b"]
    assert study.targets == [0.7]  # a rounds-to claim adds its target
    tuning = tuning_runs(study)
    assert len(tuning) == 4 and {r.seed for r in tuning} == {5}
    assert all(r.overrides["central-eval"] is False for r in tuning)  # tuning never evaluates on the test split
    report = report_runs(study, {"x@a": {"lr": 0.1}, "x@b": {"lr": 0.01}})
    assert len(report) == 8
    assert {r.overrides["lr"] for r in report if r.cell == "x@a"} == {0.1}
    assert {r.overrides["alpha"] for r in report if r.variant == "b"} == {1.0}
    assert study.arms["x"].paper_number("a") == 80.0 and study.arms["x"].paper_number("b") is None
    assert len({r.key for r in tuning + report}) == 12  # every run has its own key and folder


def test_a_tuned_value_at_the_grids_edge_is_flagged():
    grid = {"lr": [0.05, 0.1, 0.5], "sam-rho": [0.01, 0.05], "mix": ["a", "b"]}
    assert grid_edges(grid, {"lr": 0.1, "sam-rho": 0.05, "mix": "b"}) == ["sam-rho = 0.05"]
    assert grid_edges(grid, {"lr": 0.5, "sam-rho": 0.01}) == ["lr = 0.5", "sam-rho = 0.01"]
    assert grid_edges({"lr": [0.1]}, {"lr": 0.1}) == []  # one value is no grid to be at the edge of


def test_the_report_shows_the_extra_metrics_of_the_arms_that_log_them(tmp_path):
    raw = _raw(**{"extra-metrics": ["stat-x"]})
    raw.pop("variants")
    raw["arms"]["x"].pop("grid")
    study = parse_study(raw, Path("s.toml"))
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for spec, value in zip([r for r in report_runs(study, {}) if r.arm == "x"], [0.25, 0.75]):
        ledger.append({**spec.recorded(), "exit-code": 0, "rounds": 3,
                       "scores": {"central-accuracy": {"last-k": 0.5}, "stat-x": {"last-k": value}}})
    text = render_markdown(study, ledger)
    assert "| x | – | 0.5000 ± 0.3536 |" in text  # mean and sd of 0.25 and 0.75, by hand
    assert "| y | – |" not in text.split("## Extra metrics")[1].split("##")[0]  # y logs no stat-x


def test_a_claim_on_an_extra_metric_compares_that_metrics_scores(tmp_path):
    raw = _raw(**{"extra-metrics": ["final-fid"], "report-seeds": [0, 1, 2]})
    raw.pop("variants")
    raw["arms"]["x"].pop("grid")
    raw["claims"] = [{"claim": "x < y", "score": "final", "metric": "final-fid"}]
    study = parse_study(raw, Path("s.toml"))
    assert study.claims[0].metric == "final-fid"
    ledger = Ledger(tmp_path / "ledger.jsonl")
    # the study metric says x is worse on every seed; final-fid says x is lower by 10, 12, 8
    values = {"x": [30.0, 28.0, 32.0], "y": [40.0, 40.0, 40.0]}
    for spec in report_runs(study, {}):
        fid = values[spec.arm][spec.seed]
        ledger.append({**spec.recorded(), "exit-code": 0, "rounds": 3,
                       "scores": {"central-accuracy": {"final": 0.1 if spec.arm == "x" else 0.9},
                                  "final-fid": {"final": fid}}})
    text = render_markdown(study, ledger)
    # differences -10, -12, -8: mean -10, sd 2, t(0.975, 2) = 4.30265 -> half-width 4.30265 * 2 / sqrt(3) = 4.9683
    assert "| x < y | – | `final-fid` final | 3 | 0: -10.0000, 1: -12.0000, 2: -8.0000 | -10.0000 | " \
           "[-14.9683, -5.0317] | holds |" in text


def test_a_claim_on_a_metric_the_study_does_not_score_is_refused():
    raw = _raw()
    raw["claims"] = [{"claim": "x < y", "metric": "final-fid"}]
    with pytest.raises(StudyError, match="'final-fid' is not scored"):
        parse_study(raw, Path("s.toml"))


def test_a_part_of_a_study_has_the_same_run_keys_as_the_whole(tmp_path):
    whole = parse_study(_raw(), Path("s.toml"))
    part = select(whole, ["y"], ["b"])
    assert [c[0] for c in part.cells()] == ["y@b"] and part.claims == [] and "arms y; variants b" in part.part
    whole_keys = {r.key for r in report_runs(whole, {})}
    assert {r.key for r in report_runs(part, {})} < whole_keys  # the whole study later skips the part's runs
    both = select(whole, ["x", "y"], None)
    assert both is whole and len(both.claims) == 2
    with pytest.raises(StudyError, match="no arm 'z'"):
        select(whole, ["z"], None)
    with pytest.raises(StudyError, match="no variant 'c'"):
        select(whole, None, ["c"])
    assert "A part of the study file" in render_markdown(part, Ledger(tmp_path / "ledger.jsonl"))


@pytest.mark.parametrize("change, message", [
    ({"tuning-seeds": [1]}, "also report seeds"),
    ({"tuning-metric": "central-accuracy"}, "official test split"),
    ({"score": "median"}, "score"),
])
def test_study_file_mistakes_are_refused(change, message):
    with pytest.raises(StudyError, match=message):
        parse_study(_raw(**change), Path("s.toml"))


def test_claims_must_name_arms_and_runner_keys_are_the_runners():
    raw = _raw()
    raw["claims"] = ["x > z"]
    with pytest.raises(StudyError, match="'z', which is not an arm"):
        parse_study(raw, Path("s.toml"))
    raw = _raw()
    raw["base"]["seed"] = 3
    with pytest.raises(StudyError, match="runner sets itself"):
        parse_study(raw, Path("s.toml"))


def test_a_bad_run_config_fails_at_load_naming_the_cell(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[study]\nreport-seeds = [0]\n[arms.x]\nalgorithm = "fedavg"\nalpha = -1.0\n')

    def check(overrides):
        if overrides["alpha"] <= 0:
            raise ValueError("alpha must be > 0")

    with pytest.raises(StudyError, match="run config of x.*alpha must be > 0"):
        load_study(path, check)


def test_ledger_keeps_the_last_entry_of_a_key_and_skips_a_cut_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path, check_keys=False)
    ledger.append({"key": "a", "v": 1})
    ledger.append({"key": "a", "v": 2})
    with open(path, "a") as handle:
        handle.write('{"key": "b", "v"')  # killed mid-write
    again = Ledger(path, check_keys=False)
    assert again.get("a")["v"] == 2 and "b" not in again
    assert thin([[i, i] for i in range(1000)], 10)[-1] == [999, 999] and len(thin([[i, i] for i in range(1000)], 10)) == 10


# ---- whole studies through the real apps, in process ------------------------------------------------------------

TINY = """
[study]
name = "tiny"
num-supernodes = 2
report-seeds = [0, 1]
tuning-seeds = [7]
last-k = 2
targets = [0.3]
display-scale = 100

[base]
model = "mlp"
num-server-rounds = 3
local-steps = 4
batch-size = 16
checkpoint-every = 0
save-model = false
data-dir = "{data}"
cache-dir = "{cache}"

[arms.fedavg]
algorithm = "fedavg"
paper = 81.3
[arms.fedavg.grid]
lr = [0.0001, 0.1]

[arms.fedprox]
algorithm = "fedprox"
lr = 0.1

[[claims]]
claim = "fedavg > fedprox"
[[claims]]
claim = "fedavg < fedprox"
score = "rounds-to:0.3"
"""


def tiny_study(tmp_path: Path, data_dir: Path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(data=data_dir, cache=tmp_path / "cache"))
    return load_study(path)


def inprocess_executor(calls: list, fail_on: int | None = None):
    """Runs each study run through the real ServerApp and ClientApp in this process (no Ray)."""
    from fedsynth.inprocess import InProcessGrid, run_federation

    def execute(spec, overrides, log_path):
        calls.append(spec.key)
        if fail_on is not None and len(calls) == fail_on:
            raise KeyboardInterrupt  # the study is killed while this run is under way
        start = time.monotonic()
        try:
            run_federation(overrides, InProcessGrid(2, overrides))
            code = 0
        except Exception:  # noqa: BLE001 - a failed run is an exit code, as for the process executor
            code = 1
        return RunOutcome(code, time.monotonic() - start)

    return execute


def test_a_killed_study_finishes_without_rerunning_finished_runs(tmp_path, tiny_data_dir):
    study = tiny_study(tmp_path, tiny_data_dir)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    first: list = []
    with pytest.raises(KeyboardInterrupt):
        run_study(study, paths, inprocess_executor(first, fail_on=2), write=lambda line: None)
    assert len(Ledger(paths.ledger).entries) == 1  # the first run finished and was recorded
    second: list = []
    lines: list[str] = []
    ledger = run_study(study, paths, inprocess_executor(second), write=lines.append)
    assert first[0] not in second  # the finished run was not run again
    assert len(second) == 5 and len(ledger.entries) == 6  # 2 tuning + 2 arms x 2 report seeds
    assert any("about" in line and "left" in line for line in lines)  # progress with the time left
    assert any(" tune " in line and "last-k local-test-accuracy 0." in line for line in lines)  # the validation score
    report = (paths.out / "report.md").read_text()
    assert report.count("→ **") == 2  # one verdict line per claim
    assert "6 of 6 runs finished" in report and "81.3" in report
    assert '{"lr": 0.1}' in report  # the tuning table and the choice: lr 1e-4 cannot train in 3 rounds
    assert choose(study, ledger)[0] == {"fedavg": {"lr": 0.1}}
    rows = list(csv.DictReader(open(paths.out / "runs.csv")))
    assert len(rows) == 6 and "lr" in rows[0] and "central-accuracy:last-k" in rows[0]
    assert (paths.out / "curves.png").stat().st_size > 0
    # a third call runs nothing and the report can be remade from the ledger alone
    third: list = []
    run_study(study, paths, inprocess_executor(third), write=lambda line: None)
    assert third == []


def test_report_runs_go_seed_by_seed_so_a_stopped_study_holds_whole_pairs(tmp_path):
    raw = {"study": {"name": "order", "report-seeds": [3, 1, 2], "tuning-seeds": []}, "base": {"model": "mlp"},
           "arms": {"a": {"algorithm": "fedavg"}, "b": {"algorithm": "fedprox"}, "c": {"algorithm": "fedsam"}},
           "claims": ["a > b"]}
    study = parse_study(raw, tmp_path / "order.toml")
    started: list[tuple[str, int]] = []

    def record(spec, overrides, log_path):
        started.append((spec.arm, spec.seed))
        return RunOutcome(1, 0.0)  # a failed run: recorded, nothing to score

    run_study(study, StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs"), record, max_runs=4,
              write=lambda line: None)
    # every arm on the first report seed before any arm on the next (the arm-by-arm order of the study file
    # would have stopped with a, a, a, b: no pair for b's or c's claims)
    assert started == [("a", 3), ("b", 3), ("c", 3), ("a", 1)]


def test_tuning_never_reads_the_test_split(tmp_path, tiny_data_dir):
    """A study whose official test split is poisoned (labels shifted, images noise) chooses the same values."""
    poisoned = tmp_path / "poisoned"
    shutil.copytree(tiny_data_dir, poisoned)
    write_fashion_mnist(tmp_path / "noise", num_train=1200, num_test=300, seed=99)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(tmp_path / "noise" / "FashionMNIST" / "raw" / name, poisoned / "FashionMNIST" / "raw" / name)
    tables = []
    for label, data in (("clean", tiny_data_dir), ("poisoned-study", poisoned)):
        folder = tmp_path / label
        folder.mkdir()
        study = tiny_study(folder, data)
        paths = StudyPaths(out=folder / "out", runs=folder / "runs")
        ledger = run_study(study, paths, inprocess_executor([]), max_runs=2, write=lambda line: None)
        tables.append(choose(study, ledger))
    (chosen_clean, table_clean), (chosen_poisoned, table_poisoned) = tables
    assert chosen_clean == chosen_poisoned == {"fedavg": {"lr": 0.1}}
    assert [row["scores"] for row in table_clean] == [row["scores"] for row in table_poisoned]


# ---- the command, through Flower's simulation engine ------------------------------------------------------------

def test_study_help_lists_the_options():
    out = subprocess.run([sys.executable, "-m", "fedsynth.cli", "study", "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    for option in ("--jobs", "--gpus-per-client", "--out", "--runs-dir", "--max-runs", "--retry-failed",
                   "--report-only", "--dry-run", "--arms", "--variants", "--reuse", "--engine"):
        assert option in out


def test_a_bad_study_file_exits_2_in_seconds(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[study]\nreport-seeds = [0]\n[arms.x]\nalgorithm = "no-such-algorithm"\n')
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fedsynth.cli", "study", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "no-such-algorithm" in done.stderr
    assert time.monotonic() - start < 30


def test_a_ledger_path_that_is_a_directory_is_an_error_naming_it(tmp_path):
    from fedsynth.study.ledger import LedgerError

    (tmp_path / "out" / "ledger.jsonl").mkdir(parents=True)
    with pytest.raises(LedgerError, match=f"the ledger path {tmp_path / 'out' / 'ledger.jsonl'} is a directory"):
        Ledger(tmp_path / "out" / "ledger.jsonl")
    path = tmp_path / "s.toml"
    path.write_text('[study]\nreport-seeds = [0]\n[arms.x]\nalgorithm = "fedavg"\n')
    done = subprocess.run([sys.executable, "-m", "fedsynth.cli", "study", str(path), "--out", str(tmp_path / "out"),
                           "--dry-run"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (f"fedsynth study: the ledger path {tmp_path / 'out' / 'ledger.jsonl'} is a "
                                   "directory; a study's ledger is a JSON-lines file (ledger.jsonl): move what is "
                                   "there, or pass another --out")


def test_a_ledger_line_that_is_not_an_entry_is_recorded_not_skipped_without_a_word(tmp_path):
    """The hostile probe's finds: garbage, binary junk and JSON that is no entry read as an empty ledger (the study
    would run every run again without saying why), or a UnicodeDecodeError naming nothing."""
    path = tmp_path / "ledger.jsonl"
    entry = json.dumps({"key": "run-a", "seed": 0})
    path.write_bytes(b"this is not json\n" + entry.encode() + b"\n\x80\xff\n[1, 2]\n{\"key\": 5}\n{\"key\": \"cut")
    ledger = Ledger(path, check_keys=False)
    assert list(ledger.entries) == ["run-a"]
    assert ledger.malformed == ["line 1: not JSON", "line 3: not UTF-8 text",
                                "line 4: not a ledger entry (a JSON object with a text 'key')",
                                "line 5: not a ledger entry (a JSON object with a text 'key')"]  # line 6: a kill's tail


@pytest.mark.slow
def test_a_tiny_study_runs_end_to_end_in_the_simulation_engine(tmp_path, tiny_data_dir):
    path = tmp_path / "tiny.toml"
    # no tuning (the in-process test below tunes): each run here starts Ray, so 2 runs, not 3
    path.write_text(TINY.format(data=tiny_data_dir, cache=tmp_path / "cache")
                    .replace("[0, 1]", "[0]").replace("tuning-seeds = [7]", "tuning-seeds = []")
                    .replace("[arms.fedavg.grid]\nlr = [0.0001, 0.1]", "lr = 0.1"))
    done = subprocess.run(
        [sys.executable, "-m", "fedsynth.cli", "study", str(path), "--out", str(tmp_path / "out"),
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ledger = Ledger(tmp_path / "out" / "ledger.jsonl")
    assert len(ledger.entries) == 2  # 2 arms x 1 report seed
    assert all(e["exit-code"] == 0 and e["rounds"] == 3 for e in ledger.entries.values())
    assert "[2/2]" in done.stdout
    assert (tmp_path / "out" / "report.md").read_text().count("→ **") == 2


def test_a_tiny_study_runs_on_the_inprocess_engine(tmp_path, tiny_data_dir):
    """`--engine inprocess`: each run in its own process, its nodes in that process, no Ray."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(data=tiny_data_dir, cache=tmp_path / "cache")
                    .replace("[0, 1]", "[0]").replace("lr = [0.0001, 0.1]", "lr = [0.1]"))
    done = subprocess.run(
        [sys.executable, "-m", "fedsynth.cli", "study", str(path), "--engine", "inprocess", "--jobs", "2",
         "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ledger = Ledger(tmp_path / "out" / "ledger.jsonl")
    assert len(ledger.entries) == 3 and all(e["exit-code"] == 0 and e["rounds"] == 3 for e in ledger.entries.values())
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / "logs").glob("*.log"))
    assert "ClientAppActor" not in logs  # no Ray actor ran a ClientApp


def test_a_study_refuses_the_inprocess_engine_on_a_ray_cluster(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fedsynth.cli", "study", str(ROOT / "studies" / "oledfl-long.toml"),
                           "--engine", "inprocess", "--ray-address", "127.0.0.1:1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "--engine inprocess" in done.stderr


# ---- sharpness over seeds ---------------------------------------------------------------------------------------

def sharpness_study(tmp_path: Path, data_dir: Path):
    text = (TINY.format(data=data_dir, cache=tmp_path / "cache")
            .replace("save-model = false", "save-model = true")
            .replace('targets = [0.3]', 'targets = [0.3]\nextra-metrics = ["sharpness"]\nsharpness-examples = 200')
            + '\n[[claims]]\nclaim = "fedavg < fedprox"\nmetric = "sharpness"\n')
    path = tmp_path / "sharp.toml"
    path.write_text(text)
    return load_study(path)


def inprocess_measurer(calls: list):
    """Measures in this process, on the same path as `python -m common.metrics.sharpness`."""
    from common.metrics.sharpness import results_folder_sharpness

    def measure(folder, log_path):
        calls.append(Path(folder).name)
        results_folder_sharpness(Path(folder), max_examples=200, iterations=30)
        return 0

    return measure


def test_sharpness_is_lower_is_better_and_needs_each_runs_final_model():
    assert lower_is_better("sharpness")
    raw = _raw(**{"extra-metrics": ["sharpness"]})
    raw["base"] = {**raw.get("base", {}), "save-model": False}
    with pytest.raises(StudyError, match="save-model = false"):
        parse_study(raw, Path("s.toml"))
    with pytest.raises(StudyError, match="sharpness-examples"):
        parse_study(_raw(**{"sharpness-examples": -1}), Path("s.toml"))


def test_a_study_measures_each_report_runs_sharpness_and_tests_a_claim_on_it(tmp_path, tiny_data_dir):
    study = sharpness_study(tmp_path, tiny_data_dir)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    measured: list = []
    ledger = run_study(study, paths, inprocess_executor([]), write=lambda line: None,
                       measurer=inprocess_measurer(measured))
    report_entries = [e for e in ledger.entries.values() if e["phase"] == "report"]
    assert len(report_entries) == 4 and len(measured) == 4  # report runs only; tuning runs are not measured
    for entry in report_entries:
        on_disk = json.loads((Path(entry["run-dir"]) / "sharpness.json").read_text())["top-hessian-eigenvalue"]
        assert entry["scores"]["sharpness"] == {"final": on_disk, "best": on_disk, "last-k": on_disk}
        assert math.isfinite(on_disk) and on_disk > 0
    assert all(not e["scores"]["sharpness"]["last-k"] for e in ledger.entries.values() if e["phase"] == "tune")
    report = (paths.out / "report.md").read_text()
    assert "| fedavg < fedprox | – | `sharpness` last-k | 2 |" in report
    assert "`sharpness`" in report.split("## Extra metrics")[1]


def test_runs_recorded_without_sharpness_are_measured_later_without_running_again(tmp_path, tiny_data_dir):
    from fedsynth.study.sharpness import sharpness_measurer

    study = sharpness_study(tmp_path, tiny_data_dir)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    run_study(study, paths, inprocess_executor([]), write=lambda line: None)  # no measurer: nothing measured
    before = Ledger(paths.ledger)
    assert all(e["scores"]["sharpness"]["last-k"] is None for e in before.entries.values())
    again: list = []
    lines: list[str] = []
    ledger = run_study(study, paths, inprocess_executor(again), write=lines.append,
                       measurer=sharpness_measurer(ROOT, 200, 1))  # the command's measurer, a process of its own
    assert again == []  # no run ran again
    report_entries = [e for e in ledger.entries.values() if e["phase"] == "report"]
    assert all(math.isfinite(e["scores"]["sharpness"]["last-k"]) for e in report_entries)
    assert sum(line.startswith("sharpness ") for line in lines) == 4
    # the same run, measured in this process on the same examples, gives the same eigenvalue
    from common.metrics.sharpness import results_folder_sharpness

    entry = report_entries[0]
    here = results_folder_sharpness(Path(entry["run-dir"]), max_examples=200)["top-hessian-eigenvalue"]
    assert here == pytest.approx(entry["scores"]["sharpness"]["last-k"], rel=1e-5)
    # a third call finds nothing left to measure
    third: list = []
    run_study(study, paths, inprocess_executor([]), write=lambda line: None, measurer=inprocess_measurer(third))
    assert third == []
