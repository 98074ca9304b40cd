"""What a study runs and what its tuning chose, read from the study file and the ledger alone.

Below the runner (fedsynth/study/runner.py), the report (fedsynth/study/report.py) and reuse
(fedsynth/study/reuse.py), which all plan from the same ledger.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedsynth.study.ledger import Ledger
from fedsynth.study.scores import lower_is_better
from fedsynth.study.studyfile import RunSpec, Study, report_runs, tuning_runs


def read_rounds(folder: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl, skipping a line cut short; [] when there is none."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    rounds = []
    for line in path.read_text().splitlines():
        try:
            rounds.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rounds


def tuning_score(entry: Mapping[str, Any], metric: str) -> float:
    """A tuning run's validation score (last-k of the tuning metric); NaN when it has none."""
    value = entry.get("scores", {}).get(metric, {}).get("last-k")
    return float(value) if isinstance(value, (int, float)) else math.nan


def choose(study: Study, ledger: Ledger) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Each gridded cell's chosen point (best mean validation score over tuning seeds) and the tuning table.

    A grid point with a missing or non-finite score on any tuning seed ranks
    last: a diverged setting is never chosen over one that trained. Ties go to
    the first point in the grid's order. Cells whose tuning is unfinished, or
    where no point scored, get no choice: their report runs wait.
    """
    chosen: dict[str, dict[str, Any]] = {}
    table: list[dict[str, Any]] = []
    by_cell: dict[str, list[RunSpec]] = {}
    for spec in tuning_runs(study):
        by_cell.setdefault(spec.cell, []).append(spec)
    lower = lower_is_better(study.tuning_metric)
    for cell, specs in by_cell.items():
        points: dict[str, tuple[dict[str, Any], list[float]]] = {}
        complete = True
        for spec in specs:
            label = json.dumps(spec.grid_point, sort_keys=True)
            entry = ledger.get(spec.key)
            if entry is None:
                complete = False
                continue
            points.setdefault(label, (spec.grid_point, []))[1].append(tuning_score(entry, study.tuning_metric))
        best_label, best_value = None, math.nan
        for label, (point, values) in points.items():
            mean = math.fsum(values) / len(values) if values and all(math.isfinite(v) for v in values) else math.nan
            if math.isfinite(mean) and (best_label is None or (mean < best_value if lower else mean > best_value)):
                best_label, best_value = label, mean
            table.append({"cell": cell, "point": point, "scores": values, "mean": mean, "chosen": False})
        if complete and best_label is not None:  # no point with a finite score: nothing to choose
            chosen[cell] = points[best_label][0]
            for row in table:
                if row["cell"] == cell and json.dumps(row["point"], sort_keys=True) == best_label:
                    row["chosen"] = True
    return chosen, table


def plan(study: Study, ledger: Ledger) -> tuple[list[RunSpec], list[RunSpec], dict[str, dict[str, Any]]]:
    """Tuning runs, the report runs known so far (cells whose tuning is finished) and the choices."""
    tuning = tuning_runs(study)
    chosen, _ = choose(study, ledger)
    gridded = {spec.cell for spec in tuning}
    report = [spec for spec in report_runs(study, chosen) if spec.cell not in gridded or spec.cell in chosen]
    return tuning, report, chosen


def total_runs(study: Study) -> int:
    """How many runs the whole study has: tuning runs plus every cell on every report seed."""
    return len(tuning_runs(study)) + len(study.cells()) * len(study.report_seeds)
