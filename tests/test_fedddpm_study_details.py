"""benchmarks/fedddpm_study_details.py: the per-run facts behind a FedDDPM study's FIDs, hand-computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsynth.study.effective import settings_key
from fedsynth.study.ledger import Ledger
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def details():
    return load_benchmark("fedddpm_study_details")


ROUNDS = [
    {"round": 0, "phase": "warmup", "aux-fid": 30.0, "aux-kid": 5.0},
    {"round": 1, "train-loss": 0.2, "quicktest-fid": 90.0},
    {"round": 5, "fid": 200.0},
    {"round": 10, "fid": 100.0},
    {"round": 11, "quicktest-fid": 60.0},
    {"round": 15, "fid": 40.0},
    {"round": 20, "fid": 80.0},
]
SUMMARY = {"rounds": 20, "final-fid": 55.0, "final-kid": 12.0, "final-classes-covered": 9,
           "final-class-entropy": 0.9, "stopped-at-round": 11, "stop-reason": "quicktest"}


def test_run_facts_are_read_from_the_rounds_and_summary(details) -> None:
    facts = details.run_facts(ROUNDS, SUMMARY, last_k=3)
    assert facts["aux-fid"] == 30.0 and facts["aux-kid"] == 5.0
    assert facts["fid-curve"] == [(5, 200.0), (10, 100.0), (15, 40.0), (20, 80.0)]
    assert facts["last-k-fid"] == pytest.approx((100.0 + 40.0 + 80.0) / 3)
    assert facts["last-k-spread"] == pytest.approx(60.0)
    assert facts["quicktests"] == [(1, 90.0), (11, 60.0)]
    assert (facts["stopped-at"], facts["stop-reason"]) == (11, "quicktest")


def test_a_run_without_fedddpm_rounds_has_no_auxiliary_scores(details) -> None:
    facts = details.run_facts([{"round": 5, "fid": 10.0}], {"final-fid": 9.0}, last_k=4)
    assert facts["aux-fid"] is None and facts["quicktests"] == [] and facts["last-k-spread"] == 0.0


def test_the_markdown_has_a_row_per_arm_with_mean_and_sd_over_seeds(details, tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for seed, final in ((0, 50.0), (1, 70.0)):
        folder = tmp_path / f"run-{seed}"
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in ROUNDS) + "\n")
        (folder / "summary.json").write_text(json.dumps({**SUMMARY, "final-fid": final}))
        config = {"algorithm": "fedddpm+", "seed": seed}  # keyed as a ledger made before provenance: its settings
        ledger.append({"key": settings_key(config), "config": config, "arm": "fedddpm+", "seed": seed,
                       "phase": "report", "exit-code": 0, "run-dir": str(folder)})
    config = {"algorithm": "fedavg", "seed": 0}
    ledger.append({"key": settings_key(config), "config": config, "arm": "fedavg", "seed": 0, "phase": "report",
                   "exit-code": 0, "run-dir": str(tmp_path / "not-here")})
    out = tmp_path / "details.md"
    assert details.main(["--ledger", str(ledger.path), "--out", str(out), "--last-k", "3"]) == 0
    text = out.read_text()
    # final FID 50 and 70: mean 60.0, sample sd 14.1; the run whose folder is gone is left out
    assert "| fedddpm+ | 2 | 30.0 ± 0.0 | 5.0 ± 0.0 | 73.3 ± 0.0 | 60.0 ± 0.0 | 60.0 ± 14.1 |" in text
    assert "| fedavg |" not in text
    assert "| fedddpm+ | 1 | 20 | 30.0 | 5: 200, 10: 100, 15: 40, 20: 80 | 70.0 | 9 | 1: 90.0, 11: 60.0 | quicktest at 11 |" in text
