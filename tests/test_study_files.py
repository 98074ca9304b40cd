"""Every study file under studies/ is one a user can run: it parses, and every run config it makes is valid.

The per-paper tests (test_fedddpm_studies.py, test_fedcog_studies.py) check each file's settings against
its paper; this one catches a file whose keys or values the apps would refuse before anyone runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsynth.study.cli import run_config_check
from fedsynth.study.studyfile import StudyError, load_study

REPO_ROOT = Path(__file__).resolve().parents[1]
STUDY_FILES = sorted((REPO_ROOT / "studies").glob("*.toml"))
check_config = run_config_check(REPO_ROOT)  # the check `fedsynth study` applies


def test_there_are_study_files():
    assert len(STUDY_FILES) >= 12


@pytest.mark.parametrize("path", STUDY_FILES, ids=[p.stem for p in STUDY_FILES])
def test_study_file_loads_with_valid_run_configs(path):
    study = load_study(path, check_config)
    assert study.report_seeds and study.cells()
    for claim in study.claims:  # a claim names two of the file's arms
        assert {claim.better, claim.other} <= set(study.arms)


def test_a_study_file_with_an_invalid_run_config_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[study]\nreport-seeds = [0]\n[base]\ndataset = "fashion-mnist"\n'
                   '[arms.x]\nalgorithm = "no-such-algorithm"\n')
    with pytest.raises(StudyError, match="run config"):
        load_study(bad, check_config)
