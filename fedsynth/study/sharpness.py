"""Sharpness as a study metric: the top Hessian eigenvalue of each report run's final model.

FedSynSAM's paper argues through sharpness (its Table I), and one model's eigenvalue is
a hint, not a result: a study that lists `sharpness` in `extra-metrics` measures it for
every report run, so claims such as "fedsynsam < fedsam" on `metric = "sharpness"` get
paired 95 % intervals over seeds like any other score.

The measurement is `python -m common.metrics.sharpness` on the run's folder (its `config.json`
and `model.safetensors`), run right after the run in the same job slot, so `--jobs`
bounds it too; it writes `sharpness.json`, which the ledger entry reads. The subsample
of training examples is drawn with the run's seed, so arms on the same seed are scored
on the same examples. Report runs recorded without it (a study that gained the metric
later, or a measurement that failed) are measured when the study is run again, from
the model the run left, without running them again. Tuning runs are never measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedsynth.app_process import app_process_env
from fedsynth.workers import run_worker

SHARPNESS = "sharpness"
SHARPNESS_FILE = "sharpness.json"
MODEL_FILE = "model.safetensors"

# A measurer takes a finished run's folder and its log, measures, and returns an exit code (0: sharpness.json written).
Measurer = Callable[[Path, Path], int]


def sharpness_measurer(app_dir: Path, examples: int, threads: int) -> Measurer:
    """Measures in a process of its own (`python -m common.metrics.sharpness`), appending its output to the run's log."""

    def measure(folder: Path, log_path: Path) -> int:
        env = app_process_env(app_dir, threads)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as log:
            log.write(f"\n--- sharpness of {folder} on {examples} training examples\n")
            log.flush()
            return run_worker([sys.executable, "-m", "common.metrics.sharpness", str(folder), "--max-examples", str(examples)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(app_dir))

    return measure


def sharpness_scores(folder: Path) -> dict[str, float] | None:
    """The run's eigenvalue as scores (one number, so final = best = last-k), or None when it was not measured."""
    path = Path(folder) / SHARPNESS_FILE
    if not path.is_file():
        return None
    try:
        value = float(json.loads(path.read_text())["top-hessian-eigenvalue"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return {"final": value, "best": value, "last-k": value}


def can_measure(phase: str, exit_code: int, folder: Path) -> bool:
    """A report run that finished and left its final model."""
    return phase == "report" and exit_code == 0 and (Path(folder) / MODEL_FILE).is_file()


def lacks_sharpness(entry: Mapping[str, Any]) -> bool:
    """A ledger entry whose sharpness score is missing."""
    value = entry.get("scores", {}).get(SHARPNESS, {}) or {}
    return not isinstance(value.get("last-k"), (int, float))
