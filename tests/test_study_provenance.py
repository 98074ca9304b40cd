"""Study provenance (issue 51): run keys digest the effective config, ledgers record it with the commit, and
`--reuse` and the reports never mix runs of different effective configs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fedsynth.study.effective import effective_config, effective_key, run_key, server_rule
from fedsynth.study.ledger import Ledger
from fedsynth.study.report import render_markdown
from fedsynth.study.reuse import ReuseRefused, reuse_runs
from fedsynth.study.runner import RunOutcome, StudyPaths, ledger_entry, run_study
from fedsynth.study.studyfile import StudyError, parse_study, report_runs

CURVE = [[1, 0.2], [2, 0.5], [3, 0.7], [4, 0.6]]
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # the default data's files (benchmarks/fingerprints.py)


def _study(**app_defaults):
    raw = {"study": {"name": "s", "report-seeds": [0, 1], "tuning-seeds": [], "last-k": 2},
           "base": {"model": "mlp", "num-server-rounds": 4},
           "arms": {"a": {"algorithm": "fedavg"}, "b": {"algorithm": "fedprox"}},
           "claims": [{"claim": "a > b"}]}
    return replace(parse_study(raw, Path("s.toml")), app_defaults=app_defaults)


def _entry(spec, value: float, provenance: dict | None = None, effective: bool = True) -> dict:
    entry = {**spec.recorded(), "cell": spec.cell, "arm": spec.arm, "variant": "", "phase": "report",
             "seed": spec.seed, "grid-point": {}, "exit-code": 0, "rounds": 4,
             "scores": {"central-accuracy": {"last-k": value}},
             "curves": {"central-accuracy": [[r, v + value] for r, v in CURVE], "local-test-accuracy": []}}
    if not effective:  # a ledger made before provenance: keyed by its study settings
        entry = {**entry, "key": spec.settings_key}
        for name in ("effective-config", "key-version", "inputs"):
            entry.pop(name, None)
    else:
        entry["provenance"] = provenance or {"commit": "abcdef1234567", "dirty": False, "fedsynth-version": "0.1.0",
                                             "flwr": "1.x", "torch": "2.x", "python": "3.11", "device": "cpu"}
    return entry


def _ledger(path: Path, entries: list[dict]) -> Ledger:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return Ledger(path)


def test_two_runs_that_differ_only_in_a_default_get_different_keys():
    plain = report_runs(_study(**{"max-weight-share": 1.0}), {})
    capped = report_runs(_study(**{"max-weight-share": 0.4}), {})
    assert [s.overrides for s in plain] == [s.overrides for s in capped]  # the same study settings
    assert [s.settings_key for s in plain] == [s.settings_key for s in capped]  # the key before provenance
    assert all(p.key != c.key for p, c in zip(plain, capped))
    assert capped[0].effective["max-weight-share"] == 0.4 and "trim-fraction" in capped[0].effective  # every key


def test_a_setting_equal_to_its_default_and_where_files_go_leave_the_key_as_it_is(tmp_path):
    plain = report_runs(_study(), {})[0]
    share = effective_config({}, {})["max-weight-share"]
    assert report_runs(_study(**{"max-weight-share": share}), {})[0].key == plain.key
    same_files = tmp_path / "data"  # the same dataset's files in another folder: the same data, the same run
    same_files.mkdir()
    for path in FASHION_MNIST.glob("*-ubyte.gz"):
        (same_files / path.name).symlink_to(path)
    assert report_runs(_study(**{"results-dir": "/elsewhere", "data-dir": str(same_files)}), {})[0].key == plain.key


def test_a_ledger_entry_from_before_node_return_wait_keeps_its_key():
    """The key came with the restart fix (issue 55); entries that record effective configs without it are the same
    runs: a run that loses no node computes the same whatever the wait."""
    plain = report_runs(_study(), {})[0]
    assert report_runs(_study(**{"node-return-wait": 5.0}), {})[0].key == plain.key
    older = {k: v for k, v in plain.effective.items() if k != "node-return-wait"}
    assert "node-return-wait" in plain.effective and run_key(older, plain.inputs) == plain.key
    assert effective_key(older) == effective_key(plain.effective)  # and so in key version 1


def test_reuse_of_a_ledger_made_under_another_effective_config_is_refused_naming_the_keys(tmp_path):
    theirs = _study(**{"max-weight-share": 0.4})
    source = _ledger(tmp_path / "other" / "ledger.jsonl", [_entry(s, 0.1) for s in report_runs(theirs, {})])
    ours = _study(**{"max-weight-share": 1.0})
    ledger = Ledger(tmp_path / "ours" / "ledger.jsonl")
    with pytest.raises(ReuseRefused) as refused:
        reuse_runs(ours, ledger, [source])
    their_spec, our_spec = report_runs(theirs, {})[0], report_runs(ours, {})[0]
    message = str(refused.value)
    assert (f"ledger {source.path} entry {their_spec.key} (a report seed 0) ran under an effective config that "
            f"differs from this study's {our_spec.key} in: max-weight-share 0.4 vs 1.0") in message
    assert ledger.entries == {}  # nothing copied
    same = _study(**{"max-weight-share": 0.4})  # the same effective config: taken
    assert reuse_runs(same, Ledger(tmp_path / "same" / "ledger.jsonl"), [source]) == 4


def test_reuse_of_a_ledger_made_before_provenance_is_refused(tmp_path):
    legacy = replace(_study(), keyed_by_settings=True)
    source = _ledger(tmp_path / "old" / "ledger.jsonl",
                     [_entry(s, 0.1, effective=False) for s in report_runs(legacy, {})])
    with pytest.raises(ReuseRefused, match=r"records no effective config \(made before provenance\)"):
        reuse_runs(_study(), Ledger(tmp_path / "ours" / "ledger.jsonl"), [source])


def test_a_ledger_made_before_provenance_is_reported_from_its_own_keys_and_says_so(tmp_path):
    legacy = replace(_study(), keyed_by_settings=True)
    entries = [_entry(s, 0.1 if s.arm == "a" else 0.0, effective=False) for s in report_runs(legacy, {})]
    ledger = _ledger(tmp_path / "ledger.jsonl", entries)
    text = render_markdown(_study(), ledger)  # the study as the CLI loads it: effective keys
    assert "4 of 4 runs finished" in text
    assert "Server rule of every run: not recorded (made before provenance)." in text
    assert "Commit(s) the runs came from: not recorded (4 runs)." in text
    assert "**Made before provenance**" in text


def test_the_study_runs_nothing_on_a_ledger_made_before_provenance(tmp_path):
    legacy = replace(_study(), keyed_by_settings=True)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    _ledger(paths.ledger, [_entry(s, 0.1, effective=False) for s in report_runs(legacy, {})[:2]])
    calls = []

    def executor(spec, overrides, log):
        calls.append(spec)
        return RunOutcome(0, 0.0)

    with pytest.raises(StudyError, match="made before provenance.*--report-only.*another --out"):
        run_study(_study(), paths, executor, write=lambda line: None)
    assert calls == []


def test_the_report_header_states_the_rule_and_the_commits(tmp_path):
    bounded = _study(**{"max-update-norm-ratio": 1.5, "max-weight-share": 0.4})
    ledger = _ledger(tmp_path / "ledger.jsonl", [_entry(s, 0.1) for s in report_runs(bounded, {})])
    text = render_markdown(bounded, ledger)
    assert ("Server rule of every run: aggregation weighted, bounded influence on (max-update-norm-ratio 1.5, "
            "max-weight-share 0.4).") in text
    assert "Commit(s) the runs came from: abcdef1 (4 runs)." in text
    plain = _study(**{"max-update-norm-ratio": 0.0, "max-weight-share": 1.0})
    ledger = _ledger(tmp_path / "plain" / "ledger.jsonl", [_entry(s, 0.1) for s in report_runs(plain, {})])
    assert "Server rule of every run: aggregation weighted, bounded influence off (plain rule)." in render_markdown(
        plain, ledger)


def test_a_report_leaves_out_runs_of_another_effective_config_naming_the_keys(tmp_path):
    old, new = _study(**{"max-weight-share": 0.4}), _study(**{"max-weight-share": 1.0})
    ledger = _ledger(tmp_path / "ledger.jsonl", [_entry(s, 0.1) for s in report_runs(old, {})])
    text = render_markdown(new, ledger)
    assert "0 of 4 runs finished" in text  # not mixed in
    assert "4 ledger entries ran this study's settings under another effective config" in text
    assert f"entry {report_runs(old, {})[0].key}" in text and "max-weight-share 0.4 vs 1.0" in text


def test_a_legacy_entry_states_the_rule_only_when_its_settings_pin_it():
    assert server_rule({"config": {"algorithm": "fedavg"}}) == "not recorded (made before provenance)"
    pinned = {"config": {"aggregation": "uniform", "max-update-norm-ratio": 0, "max-weight-share": 1}}
    assert server_rule(pinned) == "aggregation uniform, bounded influence off (plain rule)"


def test_a_ledger_entry_records_the_effective_config_and_the_runs_provenance(tmp_path):
    spec = report_runs(_study(), {})[0]
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 1, "central-accuracy": 0.5}) + "\n")
    (folder / "provenance.json").write_text(json.dumps({"commit": "c0ffee", "device": "cuda:0 (H100)"}))
    entry = ledger_entry(_study(), spec, folder, RunOutcome(0, 1.0))
    assert entry["effective-config"] == spec.effective and entry["key"] == spec.key
    assert entry["provenance"] == {"commit": "c0ffee", "device": "cuda:0 (H100)"}
    (folder / "provenance.json").unlink()  # a run that failed before writing it: this machine's record
    entry = ledger_entry(_study(), spec, folder, RunOutcome(1, 1.0))
    assert entry["provenance"]["python"] and "study process" in entry["provenance"]["source"]
