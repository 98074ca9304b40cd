"""A research record that checks itself: run keys cover every input that changes a result (the client count, the
data, the partition's keys), and a ledger refuses, naming the entry, whatever was edited after its run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fedsynth.study.checks import check_run_folders, metrics_digest, other_study_in
from fedsynth.study.effective import KEY_VERSION, key_problem
from fedsynth.study.inputs import data_identity, partition_record
from fedsynth.study.ledger import Ledger
from fedsynth.study.plan import keyed_for
from fedsynth.study.report import render_markdown
from fedsynth.study.reuse import ReuseRefused, reuse_runs
from fedsynth.study.runner import RunOutcome, StudyPaths, ledger_entry, run_study
from fedsynth.study.studyfile import StudyError, parse_study, report_runs
from tests.conftest import write_fashion_mnist

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "benchmarks" / "results" / "studies"
ROUNDS = [{"round": r, "central-accuracy": v, "local-test-accuracy": v - 0.1} for r, v in
          [(1, 0.2), (2, 0.5), (3, 0.7), (4, 0.6)]]


def _study(data_dir: Path, name: str = "s", supernodes: int = 2, **base):
    raw = {"study": {"name": name, "report-seeds": [0, 1], "tuning-seeds": [], "last-k": 2,
                     "num-supernodes": supernodes},
           "base": {"model": "mlp", "num-server-rounds": 4, "data-dir": str(data_dir), **base},
           "arms": {"a": {"algorithm": "fedavg"}, "b": {"algorithm": "fedprox"}},
           "claims": [{"claim": "a > b"}]}
    return parse_study(raw, Path(f"{name}.toml"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_fashion_mnist(tmp_path_factory.mktemp("data"))


def _keys(study) -> list[str]:
    return [spec.key for spec in report_runs(study, {})]


# ---- the key covers every input ------------------------------------------------------------------------------

def test_each_input_in_turn_changes_the_key(data, tmp_path):
    plain = _keys(_study(data))
    assert len(set(plain)) == 4  # two arms on two seeds: four runs
    assert _keys(_study(data)) == plain  # the same inputs: the same keys
    other_data = write_fashion_mnist(tmp_path / "other", seed=1)  # the same name, other images
    changed = {
        "client count": _study(data, supernodes=3),
        "data": _study(other_data),
        "partition": _study(data, alpha=0.1),
        "partitioner": _study(data, partition="pathological"),
        "a default's value": replace(_study(data), app_defaults={"max-weight-share": 0.4}),
    }
    for what, study in changed.items():
        assert all(a != b for a, b in zip(_keys(study), plain)), what


def test_the_same_files_elsewhere_are_the_same_data_and_a_missing_folder_is_named(data, tmp_path):
    copy = tmp_path / "copy" / "FashionMNIST" / "raw"
    copy.mkdir(parents=True)
    for path in (data / "FashionMNIST" / "raw").iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert _keys(_study(tmp_path / "copy")) == _keys(_study(data))
    missing = data_identity({"dataset": "fashion-mnist", "data-dir": str(tmp_path / "nowhere")})
    assert missing.startswith("not loadable here (DatasetMissingError") and "nowhere" in missing
    assert "not seen by the study" in data_identity({"partition": "node"})


def test_an_entry_records_its_inputs_partition_and_metrics_digest(data, tmp_path):
    study = _study(data)
    spec = report_runs(study, {})[0]
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROUNDS))
    (folder / "nodes.json").write_text(json.dumps([
        {"name": "", "partition-id": 1, "node-id": 9, "num-train-examples": 700, "num-test-examples": 70},
        {"name": "", "partition-id": 0, "node-id": 8, "num-train-examples": 500, "num-test-examples": 50}]))
    entry = ledger_entry(study, spec, folder, RunOutcome(0, 1.0))
    assert entry["key-version"] == KEY_VERSION and entry["inputs"]["num-supernodes"] == 2
    assert entry["inputs"]["data"].startswith("sha256:") and entry["study"] == "s"
    assert entry["partition"]["counts"] == [[0, 500, 50], [1, 700, 70]] and entry["partition"]["nodes"] == 2
    assert entry["metrics-digest"] == metrics_digest(folder) and key_problem(entry) is None
    assert partition_record(tmp_path) is None  # a folder without nodes.json: no record, no guess


# ---- a ledger checks itself ------------------------------------------------------------------------------------

def _entry(study, spec, value: float, folder: Path | None = None) -> dict:
    curve = [[r["round"], r["central-accuracy"] + value] for r in ROUNDS]
    entry = {**spec.recorded(), "study": study.name, "cell": spec.cell, "arm": spec.arm, "variant": "",
             "phase": "report", "seed": spec.seed, "grid-point": {}, "exit-code": 0, "rounds": 4,
             "provenance": {"commit": "abcdef1234567", "dirty": False},
             "scores": {"central-accuracy": {"last-k": 0.65 + value}},
             "curves": {"central-accuracy": curve, "local-test-accuracy": []}}
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        rows = [{**r, "central-accuracy": r["central-accuracy"] + value} for r in ROUNDS]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        entry.update({"run-dir": str(folder), "metrics-digest": metrics_digest(folder)})
        entry["scores"] = ledger_entry(study, spec, folder, RunOutcome(0, 1.0))["scores"]
    return entry


def _write(path: Path, entries: list[dict]) -> Ledger:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return Ledger(path)


def _entries(study, value_of_a: float = 0.1, folders: Path | None = None) -> list[dict]:
    return [_entry(study, spec, value_of_a if spec.arm == "a" else 0.0,
                   None if folders is None else folders / f"{spec.cell}-{spec.seed}")
            for spec in report_runs(study, {})]


def test_an_entry_whose_config_was_edited_is_refused_on_read_naming_it(data, tmp_path):
    study = _study(data)
    entries = _entries(study)
    entries[0]["effective-config"] = {**entries[0]["effective-config"], "lr": 0.5}  # edited after the run
    entries[1]["inputs"] = {**entries[1]["inputs"], "num-supernodes": 3}
    ledger = _write(tmp_path / "ledger.jsonl", entries)
    assert entries[0]["key"] not in ledger and entries[1]["key"] not in ledger and len(ledger.entries) == 2
    assert [line.split(":")[0] for line in ledger.malformed] == ["line 1", "line 2"]
    assert f"entry {entries[0]['key']} (a report seed 0): its key is not the digest of its recorded effective " \
           "config and run inputs" in ledger.malformed[0]
    text = render_markdown(study, ledger)
    assert "2 of 4 runs finished" in text and entries[0]["key"] in text  # left out of the report, and named there
    assert "**2 ledger line(s) failed the ledger's checks and are left out**" in text


@pytest.mark.parametrize("field, value, reason", [
    ("key-version", "2", "key-version '2' is not one this fedsynth knows"),
    ("key-version", 7, "key-version 7 is not one this fedsynth knows"),
    ("inputs", ["num-supernodes", 2], "key-version 2 needs an effective config and run inputs"),
    ("effective-config", None, "key-version 2 needs an effective config and run inputs"),
    ("key", "0" * 12, "its key is not the digest of its recorded effective config and run inputs"),
])
def test_a_hostile_key_field_is_refused_naming_the_entry(data, tmp_path, field, value, reason):
    study = _study(data)
    entry = {**_entries(study)[0], field: value}
    ledger = _write(tmp_path / "ledger.jsonl", [entry])
    assert ledger.entries == {} and reason in ledger.malformed[0] and f"entry {entry['key']} (a report" in ledger.malformed[0]


def test_a_run_dir_that_is_no_run_folder_is_not_read(data, tmp_path):
    study = _study(data)
    entries = _entries(study)
    (tmp_path / "device").mkdir()
    (tmp_path / "device" / "metrics.jsonl").symlink_to("/dev/zero")  # not a regular file: never read
    entries[0]["run-dir"] = str(tmp_path / "device")
    entries[1]["run-dir"] = str(tmp_path / "missing")
    check = check_run_folders(study, _write(tmp_path / "ledger.jsonl", entries))
    assert check.disagree == [] and check.checked == 0 and check.elsewhere == 4


def test_an_entry_stripped_of_config_and_provenance_is_refused(data, tmp_path):
    study = _study(data)
    entries = _entries(study)
    for name in ("effective-config", "provenance", "inputs", "key-version"):
        entries[0].pop(name)
    ledger = _write(tmp_path / "ledger.jsonl", entries)
    assert entries[0]["key"] not in ledger
    assert "records no effective config" in ledger.malformed[0] and entries[0]["key"] in ledger.malformed[0]
    no_provenance = _entries(study)  # a key that matches, but no provenance: not reused
    del no_provenance[0]["provenance"]
    source = _write(tmp_path / "other" / "ledger.jsonl", no_provenance)
    with pytest.raises(ReuseRefused, match=f"entry {no_provenance[0]['key']} .* records no provenance"):
        reuse_runs(study, Ledger(tmp_path / "ours" / "ledger.jsonl"), [source])


def test_two_reuse_sources_that_disagree_on_a_key_are_refused_naming_both(data, tmp_path):
    study = _study(data)
    one = _write(tmp_path / "one" / "ledger.jsonl", _entries(study, 0.1))
    two = _write(tmp_path / "two" / "ledger.jsonl", _entries(study, -0.1))  # the same keys, other results
    for order in ([one, two], [two, one]):
        ours = Ledger(tmp_path / f"ours-{order[0].path.parent.name}" / "ledger.jsonl")
        with pytest.raises(ReuseRefused) as refused:
            reuse_runs(study, ours, order)
        assert f"ledger {one.path}" in str(refused.value) and f"ledger {two.path}" in str(refused.value)
        assert "different results (scores, curves)" in str(refused.value) and ours.entries == {}
    same = _write(tmp_path / "same" / "ledger.jsonl", _entries(study, 0.1))  # agreeing sources: taken once
    assert reuse_runs(study, Ledger(tmp_path / "both" / "ledger.jsonl"), [one, same]) == 4


def test_a_study_refuses_an_out_folder_holding_another_studys_ledger(data, tmp_path):
    other = _study(data, name="other")
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    _write(paths.ledger, _entries(other))
    calls = []

    def executor(spec, overrides, log):
        calls.append(spec)
        return RunOutcome(0, 0.0)

    with pytest.raises(StudyError, match=f"--out {paths.out} holds the ledger of study other, not of s"):
        run_study(_study(data), paths, executor, write=lambda line: None)
    assert calls == [] and not (paths.out / "report.md").exists()
    (paths.out / "report.md").write_text("# Study `older`\n")  # a ledger whose entries do not name their study
    _write(paths.ledger, [{k: v for k, v in e.items() if k != "study"} for e in _entries(_study(data))])
    assert "holds the ledger of study older" in other_study_in(_study(data), Ledger(paths.ledger), paths.out)
    assert other_study_in(other, Ledger(tmp_path / "empty" / "ledger.jsonl"), tmp_path / "empty") is None


def test_the_command_refuses_another_studys_out_folder_even_for_a_report(data, tmp_path, capsys):
    from fedsynth.cli import main

    _write(tmp_path / "out" / "ledger.jsonl", _entries(_study(data, name="other")))
    study_file = tmp_path / "s.toml"
    study_file.write_text(f'[study]\nname = "s"\nreport-seeds = [0, 1]\n[base]\nmodel = "mlp"\n'
                          f'data-dir = "{data}"\n[arms.a]\nalgorithm = "fedavg"\n')
    assert main(["study", str(study_file), "--report-only", "--out", str(tmp_path / "out"),
                 "--app-dir", str(ROOT)]) == 2
    assert "holds the ledger of study other, not of s" in capsys.readouterr().err
    assert not (tmp_path / "out" / "report.md").exists()


def test_a_report_checks_the_run_folders_and_leaves_out_an_entry_that_disagrees_naming_it(data, tmp_path):
    study = _study(data)
    entries = _entries(study, folders=tmp_path / "runs")
    assert check_run_folders(study, _write(tmp_path / "clean" / "ledger.jsonl", entries)).disagree == []
    forged = json.loads(json.dumps(entries))
    forged[2]["scores"]["central-accuracy"]["last-k"] = 0.99  # a forged score; its folder says otherwise
    changed = tmp_path / "runs" / f"{entries[3]['cell']}-{entries[3]['seed']}" / "metrics.jsonl"
    changed.write_text(changed.read_text().replace("0.6", "0.9"))  # the folder changed after its entry
    ledger = _write(tmp_path / "forged" / "ledger.jsonl", forged)
    check = check_run_folders(study, ledger)
    assert len(check.disagree) == 2 and check.checked == 2
    assert f"entry {forged[2]['key']} (b report seed 0): its scores differ" in check.disagree[0]
    assert "central-accuracy/last-k 0.99 vs 0.6499" in check.disagree[0]
    assert f"entry {forged[3]['key']} (b report seed 1): its run folder's" in check.disagree[1]
    text = render_markdown(study, ledger)
    assert "**2 ledger entries disagree with their run folders and are left out**" in text
    assert "2 of 4 runs finished" in text and forged[2]["key"] in text


def test_an_entry_without_a_metrics_digest_is_checked_on_its_scores_and_one_without_a_folder_is_not(data, tmp_path):
    study = _study(data)
    entries = _entries(study, folders=tmp_path / "runs")
    del entries[0]["metrics-digest"]  # made before ledgers kept it: not a refusal
    entries[1]["run-dir"] = str(tmp_path / "gone")
    check = check_run_folders(study, _write(tmp_path / "ledger.jsonl", entries))
    assert check.disagree == [] and (check.checked, check.no_digest, check.elsewhere) == (3, 1, 1)
    assert "1 on their scores alone: made before ledgers kept a metrics digest" in check.lines()[0]
    assert "1 ledger entry not checkable" in check.note()


# ---- old ledgers ----------------------------------------------------------------------------------------------

COMMITTED = sorted(STUDIES.glob("*/ledger.jsonl"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_every_committed_ledger_passes_its_self_check(path):
    ledger = Ledger(path)
    assert ledger.malformed == [] and ledger.entries


def test_a_ledger_keyed_before_run_inputs_is_read_for_its_report_but_neither_continued_nor_reused(data, tmp_path):
    study = _study(data)
    first = replace(study, key_version=1)
    entries = _entries(first)
    assert all(e.get("key-version") is None and "inputs" not in e for e in entries)  # as ledgers of key version 1
    ledger = _write(tmp_path / "out" / "ledger.jsonl", entries)
    assert keyed_for(study, ledger).key_version == 1 and "4 of 4 runs finished" in render_markdown(study, ledger)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    with pytest.raises(StudyError, match="before run keys covered the client count and the data.*--report-only"):
        run_study(study, paths, lambda *a: RunOutcome(0, 0.0), write=lambda line: None)
    with pytest.raises(ReuseRefused, match="does not cover the client count nor the data's identity"):
        reuse_runs(study, Ledger(tmp_path / "ours" / "ledger.jsonl"), [ledger])


def test_two_runs_with_equal_keys_give_bitwise_the_same_model_and_another_client_count_another(data, tmp_path):
    """One small in-process run pair: the same key from another results folder and a copy of the data elsewhere."""
    from benchmarks.fingerprints import model_fingerprint
    from fedsynth.simulation import run_simulation

    copy = tmp_path / "copy" / "FashionMNIST" / "raw"
    copy.mkdir(parents=True)
    for path in (data / "FashionMNIST" / "raw").iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    keys, models = [], []
    for name, data_dir, nodes in (("one", data, 2), ("two", tmp_path / "copy", 2), ("three", data, 3)):
        study = _study(data_dir, supernodes=nodes, **{"num-server-rounds": 2, "local-steps": 2, "batch-size": 16,
                                                      "cache-dir": str(tmp_path / f"cache-{name}")})
        spec = report_runs(study, {})[0]
        overrides = {**spec.overrides, "results-dir": str(tmp_path / "results"), "run-name": name}
        folder = run_simulation(ROOT, overrides, num_supernodes=nodes, cpus_per_client=1.0, engine="inprocess")
        keys.append(spec.key)
        models.append(model_fingerprint(folder / "model.safetensors"))
    assert keys[0] == keys[1] and models[0] == models[1]  # equal keys: bitwise the same model
    assert keys[2] != keys[0] and models[2] != models[0]  # the client count changes the model, and so the key


def test_a_committed_ledger_of_key_version_1_remakes_its_report_unchanged_and_says_what_it_cannot_check(tmp_path,
                                                                                                         capsys):
    from fedsynth.cli import main

    committed = STUDIES / "fedsynsam-confound"
    out = tmp_path / "out"
    out.mkdir()
    (out / "ledger.jsonl").write_bytes((committed / "ledger.jsonl").read_bytes())
    (out / "report.md").write_bytes((committed / "report.md").read_bytes())  # its own report: the same study
    assert main(["study", str(ROOT / "studies" / "fedsynsam-confound.toml"), "--report-only", "--out", str(out),
                 "--app-dir", str(ROOT)]) == 0
    err = capsys.readouterr().err
    assert "is keyed by key version 1: its entries record neither the client count nor the data's identity" in err
    assert "15 ledger entries not checkable against their run folders" in err
    assert (out / "report.md").read_text() == (committed / "report.md").read_text()  # the committed report is current
