"""What a study runs and what its tuning chose, read from the study file and the ledger alone.

Below the runner (fedsynth/study/runner.py), the report (fedsynth/study/report.py) and reuse
(fedsynth/study/reuse.py), which all plan from the same ledger.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.run.provenance import commit_label
from fedsynth.study.effective import KEY_VERSION, RUN_INPUTS, differences, key_version, server_rule, settings_key
from fedsynth.study.ledger import Ledger
from fedsynth.study.scores import lower_is_better
from fedsynth.study.studyfile import RunSpec, Study, report_runs, tuning_runs

# An entry of a ledger made before provenance: keyed by its study settings, without an effective config.
EFFECTIVE_CONFIG = "effective-config"


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


def every_possible_run(study: Study) -> list[RunSpec]:
    """Every run the study can make: its tuning runs and each cell on each report seed at each grid point."""
    runs = tuning_runs(study)
    for cell, arm, variant in study.cells():
        for point in study.arms[arm].grid_points():
            for seed in study.report_seeds:
                overrides = {**study.cell_overrides(arm, variant), **point, "seed": seed}
                runs.append(study.run_spec(cell, arm, variant, "report", seed, point, overrides))
    return runs


def is_before_provenance(entry: Mapping[str, Any]) -> bool:
    """Whether a ledger entry was made before provenance: it records no effective config."""
    return not isinstance(entry.get(EFFECTIVE_CONFIG), Mapping)


def keyed_for(study: Study, ledger: Ledger) -> Study:
    """The study keyed as its ledger is: by the key version its entries have (fedsynth/study/effective.py).

    A ledger is read by the study's keys (version 2) when any of its entries has one
    of them; else by version 1 keys (the effective config alone) when entries match
    those; else, when entries recorded without an effective config match the study's
    settings keys (a ledger made before provenance), by those; else as given.
    """
    if study.keyed_by_settings or not ledger.entries:
        return study
    if any(spec.key in ledger for spec in every_possible_run(study)):
        return study
    if study.key_version >= KEY_VERSION:
        first = replace(study, key_version=1)
        if any(spec.key in ledger for spec in every_possible_run(first)):
            return first
    old = replace(study, keyed_by_settings=True)
    if any(is_before_provenance(ledger.entries.get(spec.key, {EFFECTIVE_CONFIG: {}}))
           for spec in every_possible_run(old)):
        return old
    return study


def runs_under_other_configs(specs: list[RunSpec], ledger: Ledger) -> list[tuple[RunSpec, dict[str, Any]]]:
    """(spec, entry) for each of `specs` the ledger lacks but holds with the same study settings under another
    (or an unrecorded) effective config: the same run in the study file, not the same run."""
    by_settings: dict[str, list[dict[str, Any]]] = {}
    for entry in ledger.entries.values():
        by_settings.setdefault(settings_key(entry.get("config", {})), []).append(entry)
    found = []
    for spec in specs:
        if spec.effective is None or spec.key in ledger:
            continue
        found += [(spec, entry) for entry in by_settings.get(spec.settings_key, []) if entry["key"] != spec.key]
    return found


def other_config_text(ledger: Ledger, spec: RunSpec, entry: Mapping[str, Any]) -> str:
    """Why `entry` is not the study's run `spec`, naming both keys and the effective-config keys that differ."""
    where = f"ledger {ledger.path} entry {entry['key']} ({spec.cell} {spec.phase} seed {spec.seed})"
    if is_before_provenance(entry):
        return (f"{where} records no effective config (made before provenance): the defaults it ran under are "
                f"unknown, so it is not this study's run {spec.key}")
    changed = differences(spec.effective or {}, entry[EFFECTIVE_CONFIG])
    configs = len(changed)
    if spec.inputs is not None and key_version(entry) != KEY_VERSION:
        changed.append(f"its key (version {key_version(entry)}) does not cover the client count nor the data's "
                       "identity, which it did not record")
    elif spec.inputs is not None:
        theirs = entry.get(RUN_INPUTS) or {}
        changed += [f"input {name} {json.dumps(theirs.get(name, 'absent'))} vs {json.dumps(value)}"
                    for name, value in spec.inputs.items() if theirs.get(name) != value]
    what = "an effective config that differs" if len(changed) == configs else "an effective config or inputs that differ"
    return f"{where} ran under {what} from this study's {spec.key} in: " + "; ".join(changed)


def planned_entries(study: Study, ledger: Ledger, cells: set[str] | None = None) -> list[tuple[RunSpec, dict[str, Any]]]:
    """(spec, entry) of every planned run the ledger holds (of `cells` only, when given), read as the ledger is keyed."""
    study = keyed_for(study, ledger)
    tuning, report, _ = plan(study, ledger)
    return [(spec, ledger.entries[spec.key]) for spec in tuning + report
            if spec.key in ledger and (cells is None or spec.cell in cells)]


def rules_by_cell(study: Study, ledger: Ledger, cells: set[str] | None = None) -> dict[str, list[str]]:
    """{server rule: the cells whose runs used it} over the planned runs the ledger holds (`server_rule`)."""
    rules: dict[str, list[str]] = {}
    for spec, entry in planned_entries(study, ledger, cells):
        names = rules.setdefault(server_rule(entry), [])
        if spec.cell not in names:
            names.append(spec.cell)
    return rules


def commits_of(study: Study, ledger: Ledger, cells: set[str] | None = None) -> dict[str, int]:
    """{commit label: how many of the planned runs the ledger holds came from it} (`commit_label`)."""
    counts: dict[str, int] = {}
    for _, entry in planned_entries(study, ledger, cells):
        label = commit_label(entry.get("provenance"))
        counts[label] = counts.get(label, 0) + 1
    return counts
