"""A study file: the runs that test a paper's claims, and how they are scored.

A study names a base run config, the arms (an algorithm and its overrides, with
an optional tuning grid and the paper's number), optional variants (settings
every arm runs in: codecs, splits), report and tuning seeds, the metric and
targets, and the claims. `docs/studies.md` documents the format. Everything is
checked when the file is loaded, each run's config through the app's own
validation (`common.config.parse_run_config`), so a bad study fails in seconds,
before any run starts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedsynth.scores import lower_is_better
from fedsynth.study_sharpness import SHARPNESS

SCORE_PATTERN = re.compile(r"^(last-k|final|best|(rounds|seconds)-to:[0-9.eE+-]+)$")
CLAIM_PATTERN = re.compile(r"^\s*(\S+)\s*([<>])\s*(\S+)\s*$")
# Keys the study runner sets itself on every run.
RUNNER_KEYS = ("seed", "results-dir", "run-name", "resume")


class StudyError(ValueError):
    """A study file that cannot be run, with the key and the reason."""


def scored_metrics(metric: str, tuning_metric: str, extra_metrics: list[str]) -> list[str]:
    """Every metric a study scores for each run, once each: the study's, the tuning one, then the extras."""
    return list(dict.fromkeys([metric, tuning_metric, *extra_metrics]))


@dataclass(frozen=True)
class Arm:
    """An algorithm with its overrides, tuning grid and the paper's number(s)."""

    name: str
    overrides: dict[str, Any]
    grid: dict[str, list[Any]]
    paper: float | dict[str, float] | None = None

    def paper_number(self, variant: str) -> float | None:
        if isinstance(self.paper, Mapping):
            return self.paper.get(variant)
        return self.paper

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, in file order ([{}] without a grid)."""
        keys = list(self.grid)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.grid[k] for k in keys))]


@dataclass(frozen=True)
class Claim:
    """"A > B": A's score above B's (literal; FID and rounds-to-target claims use "<").

    `metric` is the study's metric unless the claim names another scored one
    (an extra metric such as `final-fid`, the final model on more samples).
    """

    better: str
    direction: str
    other: str
    score: str
    text: str
    metric: str


@dataclass(frozen=True)
class Study:
    """A parsed, checked study file."""

    name: str
    description: str
    path: Path
    base: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    arms: dict[str, Arm]
    claims: list[Claim]
    report_seeds: list[int]
    tuning_seeds: list[int]
    metric: str
    tuning_metric: str
    extra_metrics: list[str]
    last_k: int
    score: str
    targets: list[float]
    display_scale: float
    num_supernodes: int
    cpus_per_client: float
    gpus_per_client: float
    tuning_central_eval: bool
    notes: str = ""
    sharpness_examples: int = 10000  # training examples of the `sharpness` extra metric (0: the whole split)
    part: str = ""  # set by `select`: which arms and variants of the file this study is

    @property
    def metrics(self) -> list[str]:
        """Every metric scored for every run: the study's, the tuning one, then the extras."""
        return scored_metrics(self.metric, self.tuning_metric, self.extra_metrics)

    def cells(self) -> list[tuple[str, str, str]]:
        """(cell name, arm, variant) for every arm in every variant; a cell is `arm@variant` with variants."""
        variants = list(self.variants) or [""]
        return [(f"{arm}@{variant}" if variant else arm, arm, variant) for variant in variants for arm in self.arms]

    def cell_overrides(self, arm: str, variant: str) -> dict[str, Any]:
        """Base, then the variant, then the arm: the arm wins."""
        return {**self.base, **self.variants.get(variant, {}), **self.arms[arm].overrides}


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: a cell on a seed, in the tuning or the report phase."""

    cell: str
    arm: str
    variant: str
    phase: str
    seed: int
    grid_point: dict[str, Any]
    overrides: dict[str, Any] = field(repr=False)

    @property
    def key(self) -> str:
        """A digest of everything that decides the run: same key, same run."""
        text = json.dumps(self.overrides, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def folder_name(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", self.cell)
        return f"{safe}-{self.phase}-s{self.seed}-{self.key}"


def _ints(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise StudyError(f"[study] {key} must be a list of integers, got {value!r}")
    return list(value)


def _table(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise StudyError(f"'{key}' must be a table")
    return dict(value)


def _claim(entry: Any, default_score: str, arms: set[str], default_metric: str, metrics: list[str]) -> Claim:
    if isinstance(entry, str):
        text, score, metric = entry, default_score, default_metric
    else:
        text, score, metric = entry.get("claim"), entry.get("score", default_score), entry.get("metric", default_metric)
    match = CLAIM_PATTERN.match(text or "")
    if not match:
        raise StudyError(f"claim {text!r} must read 'A > B' or 'A < B' with arm names")
    better, direction, other = match.groups()
    for name in (better, other):
        if name not in arms:
            raise StudyError(f"claim {text!r} names '{name}', which is not an arm (arms: {', '.join(sorted(arms))})")
    if not SCORE_PATTERN.match(score):
        raise StudyError(f"claim {text!r}: score {score!r} must be last-k, final, best, rounds-to:T or seconds-to:T")
    if metric not in metrics:
        raise StudyError(f"claim {text!r}: metric {metric!r} is not scored; add it to [study] extra-metrics "
                         f"(scored: {', '.join(metrics)})")
    return Claim(better, direction, other, score, text.strip(), str(metric))


def parse_study(raw: Mapping[str, Any], path: Path) -> Study:
    """A study from the file's TOML tables; raises StudyError naming the key at fault."""
    unknown = set(raw) - {"study", "base", "variants", "arms", "claims"}
    if unknown:
        raise StudyError(f"unknown top-level table(s) {sorted(unknown)}; a study has [study], [base], [variants.*], [arms.*], [[claims]]")
    head = _table(raw, "study")
    report_seeds = _ints(head.get("report-seeds", [0, 1, 2]), "report-seeds")
    tuning_seeds = _ints(head.get("tuning-seeds", []), "tuning-seeds")
    if not report_seeds:
        raise StudyError("[study] report-seeds is empty")
    if set(report_seeds) & set(tuning_seeds):
        raise StudyError(f"[study] tuning-seeds {sorted(set(report_seeds) & set(tuning_seeds))} are also report seeds; "
                         "tuning must use seeds of its own")
    metric = str(head.get("metric", "central-accuracy"))
    tuning_metric = str(head.get("tuning-metric", "local-test-accuracy"))
    if tuning_metric.startswith("central-") or tuning_metric.startswith("final-central") or tuning_metric == "accuracy":
        raise StudyError(f"[study] tuning-metric {tuning_metric!r} is scored on the official test split; "
                         "tune on the clients' held-out split (local-test-accuracy) or a training hold-out")
    score = str(head.get("score", "last-k"))
    if not SCORE_PATTERN.match(score):
        raise StudyError(f"[study] score {score!r} must be last-k, final, best, rounds-to:T or seconds-to:T")
    targets = [float(t) for t in head.get("targets", [])]
    last_k = int(head.get("last-k", 5))
    if last_k < 1:
        raise StudyError("[study] last-k must be at least 1")
    base = _table(raw, "base")
    variants = {name: dict(table) for name, table in _table(raw, "variants").items()}
    for name in variants:
        if "@" in name:
            raise StudyError(f"variant name {name!r} must not contain '@'")
    arms: dict[str, Arm] = {}
    for name, table in _table(raw, "arms").items():
        if "@" in name or not isinstance(table, Mapping):
            raise StudyError(f"arm {name!r} must be a table and its name must not contain '@'")
        overrides = {k: v for k, v in table.items() if k not in ("grid", "paper")}
        grid = dict(table.get("grid", {}))
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise StudyError(f"arm {name!r}: grid {key!r} must be a non-empty list")
        if grid and not tuning_seeds:
            raise StudyError(f"arm {name!r} has a tuning grid but [study] tuning-seeds is empty")
        arms[name] = Arm(name, overrides, grid, table.get("paper"))
    if not arms:
        raise StudyError("a study needs at least one [arms.NAME] table")
    for key in RUNNER_KEYS:
        for where, table in [("base", base), *[(f"variants.{n}", t) for n, t in variants.items()],
                             *[(f"arms.{a.name}", a.overrides) for a in arms.values()]]:
            if key in table:
                raise StudyError(f"[{where}] sets '{key}', which the study runner sets itself")
    extra_metrics = [str(m) for m in head.get("extra-metrics", [])]
    scored = scored_metrics(metric, tuning_metric, extra_metrics)
    claims = [_claim(entry, score, set(arms), metric, scored) for entry in raw.get("claims", [])]
    sharpness_examples = head.get("sharpness-examples", 10000)
    if not isinstance(sharpness_examples, int) or isinstance(sharpness_examples, bool) or sharpness_examples < 0:
        raise StudyError(f"[study] sharpness-examples must be an integer >= 0 (0: every training example), "
                         f"got {sharpness_examples!r}")
    if SHARPNESS in scored:
        for where, table in [("base", base), *[(f"variants.{n}", t) for n, t in variants.items()],
                             *[(f"arms.{a.name}", a.overrides) for a in arms.values()]]:
            if table.get("save-model") is False:
                raise StudyError(f"[{where}] sets save-model = false, but the extra metric '{SHARPNESS}' is measured "
                                 "on each report run's final model")
    for needed in re.findall(r"to:([0-9.eE+-]+)", " ".join([score, *(c.score for c in claims)])):
        if float(needed) not in targets:  # a rounds-to / seconds-to score needs its target scored
            targets.append(float(needed))
    return Study(
        name=str(head.get("name", path.stem)), description=str(head.get("description", "")), path=path,
        base=base, variants=variants, arms=arms, claims=claims, report_seeds=report_seeds, tuning_seeds=tuning_seeds,
        metric=metric, tuning_metric=tuning_metric, extra_metrics=extra_metrics,
        last_k=last_k, score=score, targets=targets, display_scale=float(head.get("display-scale", 1.0)),
        num_supernodes=int(head.get("num-supernodes", 10)), cpus_per_client=float(head.get("cpus-per-client", 1.0)),
        gpus_per_client=float(head.get("gpus-per-client", 0.0)),
        tuning_central_eval=bool(head.get("tuning-central-eval", False)), notes=str(head.get("notes", "")),
        sharpness_examples=sharpness_examples,
    )


def select(study: Study, arms: list[str] | None = None, variants: list[str] | None = None) -> Study:
    """The part of a study on some of its arms and variants, to run a slice of a large study first.

    Run keys are digests of the run config alone, so a run of the part is the same run (same key,
    same ledger entry) as in the whole study: a later call on the whole file skips it. Claims are
    kept when both their arms are selected.
    """
    for kind, names, known in (("arm", arms, study.arms), ("variant", variants, study.variants)):
        unknown = [name for name in names or [] if name not in known]
        if unknown:
            listed = ", ".join(known) or "none"
            raise StudyError(f"no {kind} {', '.join(map(repr, unknown))} in {study.path} ({kind}s: {listed})")
    kept_arms = {name: arm for name, arm in study.arms.items() if not arms or name in arms}
    kept_variants = {name: v for name, v in study.variants.items() if not variants or name in variants}
    claims = [c for c in study.claims if c.better in kept_arms and c.other in kept_arms]
    if len(kept_arms) == len(study.arms) and len(kept_variants) == len(study.variants):
        return study
    part = f"arms {', '.join(kept_arms)}" + (f"; variants {', '.join(kept_variants)}" if study.variants else "")
    return replace(study, arms=kept_arms, variants=kept_variants, claims=claims, part=part)


def load_study(path: Path, check_config: Callable[[dict[str, Any]], None] | None = None) -> Study:
    """Read and check a study file; `check_config` validates every run config it can produce."""
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise StudyError(f"study file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise StudyError(f"study file {path} is not valid TOML: {err}") from None
    study = parse_study(raw, Path(path))
    if check_config is not None:
        for cell, arm, variant in study.cells():
            for point in study.arms[arm].grid_points():
                try:
                    check_config({**study.cell_overrides(arm, variant), **point, "seed": study.report_seeds[0]})
                except ValueError as err:
                    raise StudyError(f"{path}: run config of {cell} {point or ''}: {err}") from None
    return study


def tuning_runs(study: Study) -> list[RunSpec]:
    """Every grid point of every cell with a grid, on every tuning seed."""
    runs = []
    for cell, arm, variant in study.cells():
        if not study.arms[arm].grid:
            continue
        for point in study.arms[arm].grid_points():
            for seed in study.tuning_seeds:
                overrides = {**study.cell_overrides(arm, variant), **point, "seed": seed}
                if not study.tuning_central_eval:
                    overrides["central-eval"] = False  # tuning never reads the official test split
                runs.append(RunSpec(cell, arm, variant, "tune", seed, point, overrides))
    return runs


def report_runs(study: Study, chosen: Mapping[str, dict[str, Any]]) -> list[RunSpec]:
    """Every cell on every report seed, with its chosen grid point (cells without a grid: their overrides)."""
    runs = []
    for cell, arm, variant in study.cells():
        point = dict(chosen.get(cell, {}))
        for seed in study.report_seeds:
            overrides = {**study.cell_overrides(arm, variant), **point, "seed": seed}
            runs.append(RunSpec(cell, arm, variant, "report", seed, point, overrides))
    return runs


def better(a: float, b: float, metric: str) -> bool:
    """Whether score a beats score b for this metric's direction."""
    return a < b if lower_is_better(metric) else a > b
