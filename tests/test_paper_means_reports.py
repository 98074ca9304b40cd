"""A paper compares its arms under one mean: a study claim or `fedsynth compare` whose arms run different means
(FedSynSAM's and FedDDPM's default is the uniform mean, the baselines' the sample-weighted one) says so."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from fedsynth.cli import write_comparison
from fedsynth.study.ledger import Ledger
from fedsynth.study.report import mixed_means_note, render_markdown
from fedsynth.study.studyfile import parse_study

APP_DEFAULTS = {"aggregation": "auto"}  # as pyproject.toml declares it


def _study(base: dict | None = None, keyed_by_settings: bool = False):
    raw = {"study": {"name": "s", "report-seeds": [0, 1], "tuning-seeds": [], "last-k": 2},
           "base": {"model": "mlp", "num-server-rounds": 4, **(base or {})},
           "arms": {"synsam": {"algorithm": "fedsynsam"}, "sam": {"algorithm": "fedsam"}},
           "claims": [{"claim": "synsam > sam"}]}
    return replace(parse_study(raw, Path("s.toml")), app_defaults=APP_DEFAULTS, keyed_by_settings=keyed_by_settings)


def test_mixed_means_note_by_hand() -> None:
    assert mixed_means_note({"a": "uniform", "b": "uniform"}) == ""
    assert mixed_means_note({}) == ""
    note = mixed_means_note({"fedsynsam": "uniform", "fedsam": "weighted"})
    assert "fedsynsam uniform, fedsam weighted" in note and "set one `aggregation` for every arm" in note


def test_a_claim_whose_arms_run_different_means_says_so(tmp_path: Path) -> None:
    text = render_markdown(_study(), Ledger(tmp_path / "ledger.jsonl"))
    claim_line = next(line for line in text.splitlines() if line.startswith("- **synsam > sam**"))
    assert "**note**: the arms run different means (synsam uniform, sam weighted)" in claim_line


def test_a_claim_under_one_mean_and_a_ledger_without_effective_configs_say_nothing(tmp_path: Path) -> None:
    one_mean = render_markdown(_study({"aggregation": "uniform"}), Ledger(tmp_path / "a.jsonl"))
    legacy = render_markdown(_study(keyed_by_settings=True), Ledger(tmp_path / "b.jsonl"))
    assert "different means" not in one_mean and "different means" not in legacy


def _run(folder: Path, name: str, config: dict) -> Path:
    run = folder / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final-central-accuracy": 0.5}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "central-accuracy": 0.5}) + "\n")
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_compare_says_when_its_runs_ran_different_means(tmp_path: Path) -> None:
    runs = {"fedsynsam": _run(tmp_path, "fedsynsam", {"config": {"aggregation": "uniform"}}),
            "fedsam": _run(tmp_path, "fedsam", {"config": {"aggregation": "weighted"}})}
    write_comparison(runs, tmp_path)
    assert "**Note**: the arms run different means (fedsynsam uniform, fedsam weighted)" in (
        tmp_path / "comparison.md").read_text()


def test_compare_under_one_mean_or_with_an_unreadable_config_adds_no_note(tmp_path: Path) -> None:
    runs = {"a": _run(tmp_path, "a", {"config": {"aggregation": "uniform"}}),
            "b": _run(tmp_path, "b", {"aggregation": "uniform"})}
    (_run(tmp_path, "c", {}) / "config.json").write_text("{not json")
    runs["c"] = tmp_path / "c"
    write_comparison(runs, tmp_path)
    assert "Note" not in (tmp_path / "comparison.md").read_text()
