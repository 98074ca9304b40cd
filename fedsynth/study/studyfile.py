"""A study file: the runs that test a paper's claims, and how they are scored.

A study names a base run config, the arms (an algorithm and its overrides, with
an optional tuning grid and the paper's number), optional variants (settings
every arm runs in: codecs, splits), report and tuning seeds, the metric and
targets, and the claims. `docs/studies.md` documents the format. Everything is
checked when the file is loaded, each run's config through the app's own
validation (`common.run.config.parse_run_config`), so a bad study fails in seconds,
before any run starts.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedsynth.study.effective import KEY_VERSION, effective_config, effective_key, run_key, settings_key
from fedsynth.study.inputs import run_inputs
from fedsynth.study.scores import lower_is_better
from fedsynth.study.sharpness import SHARPNESS

SCORE_PATTERN = re.compile(r"^(last-k|final|best|(rounds|seconds)-to:[0-9.eE+-]+)$")
SCORES = "last-k, final, best, rounds-to:T or seconds-to:T (T a number)"
# The [study] table's keys and what each holds (docs/studies.md); any other key is refused with a "did you mean".
STUDY_KEYS = {
    "name": "a string", "description": "a string", "notes": "a string",
    "report-seeds": "a non-empty list of integers >= 0", "tuning-seeds": "a list of integers >= 0",
    "metric": "a metric name", "tuning-metric": "a metric name", "extra-metrics": "a list of metric names",
    "score": SCORES, "targets": "a list of numbers", "last-k": "an integer >= 1",
    "display-scale": "a number > 0", "num-supernodes": "an integer >= 1", "cpus-per-client": "a number > 0",
    "gpus-per-client": "a number >= 0 (a fraction <= 1 or a whole number)", "tuning-central-eval": "true or false",
    "sharpness-examples": "an integer >= 0 (0: every training example)",
}
CLAIM_KEYS = ("claim", "score", "metric")
# Metrics a run records (metrics.jsonl, summary.json) that a study may score; names with these prefixes are
# the rules' own statistics and diagnostics. A name that is neither is refused: a misspelt metric would leave
# every run "not run yet" in the report after the study finished.
KNOWN_METRICS = (
    "accuracy", "central-accuracy", "central-loss", "local-test-accuracy", "local-test-loss", "train-loss",
    "local-test-accuracy-min", "local-test-accuracy-max", "consensus-distance", "fid", "kid", "final-fid",
    "final-kid", "aux-fid", "aux-kid", "quicktest-fid", "correction-loss", "distill-loss-start", "distill-loss-end",
    SHARPNESS,
)
METRIC_PREFIXES = ("stat-", "cos-", "synthetic-", "node-accuracy-", "final-")
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
    # The app's default run config ([tool.flwr.app.config]); each run's effective config is these, then its settings.
    app_defaults: dict[str, Any] = field(default_factory=dict)
    # True: run keys are digests of the study's settings alone, as in ledgers made before provenance (reading them).
    keyed_by_settings: bool = False
    # The key version runs are keyed by (fedsynth/study/effective.py): 1 to read a ledger made before run inputs.
    key_version: int = KEY_VERSION

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

    def run_spec(self, cell: str, arm: str, variant: str, phase: str, seed: int, grid_point: dict[str, Any],
                 overrides: dict[str, Any]) -> "RunSpec":
        """One run, with its effective config (None when keyed by settings: a ledger from before provenance) and its
        inputs outside the run config (None when keyed by key version 1)."""
        effective = None if self.keyed_by_settings else effective_config(self.app_defaults, overrides)
        inputs = (run_inputs(effective, self.num_supernodes)
                  if effective is not None and self.key_version >= KEY_VERSION else None)
        return RunSpec(cell, arm, variant, phase, seed, grid_point, overrides, effective, inputs)


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: a cell on a seed, in the tuning or the report phase."""

    cell: str
    arm: str
    variant: str
    phase: str
    seed: int
    grid_point: dict[str, Any]
    overrides: dict[str, Any] = field(repr=False)  # the study's settings of this run
    effective: dict[str, Any] | None = field(default=None, repr=False)  # every run-config key, defaults resolved
    inputs: dict[str, Any] | None = field(default=None, repr=False)  # client count, data identity (study/inputs.py)

    @property
    def key(self) -> str:
        """A digest of everything that decides the run (its effective config and inputs): same key, same run.

        A spec without an effective config (`Study.keyed_by_settings`) has the key
        ledgers made before provenance used: a digest of the study's settings alone;
        one without inputs the key of version 1, the effective config alone.
        """
        if self.effective is None:
            return settings_key(self.overrides)
        return effective_key(self.effective) if self.inputs is None else run_key(self.effective, self.inputs)

    def recorded(self) -> dict[str, Any]:
        """The fields of its ledger entry that its key digests (a ledger checks them on every read): the key, the
        study settings, and the effective config and inputs where the key covers them."""
        record: dict[str, Any] = {"key": self.key, "config": self.overrides}
        if self.effective is not None:
            record["effective-config"] = self.effective
        if self.inputs is not None:
            record.update({"key-version": KEY_VERSION, "inputs": self.inputs})
        return record

    @property
    def settings_key(self) -> str:
        """The key this run had before provenance (its study settings' digest): how old ledgers name it."""
        return settings_key(self.overrides)

    @property
    def folder_name(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", self.cell)
        return f"{safe}-{self.phase}-s{self.seed}-{self.key}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _bad(key: str, value: Any) -> StudyError:
    return StudyError(f"[study] {key} = {value!r} is invalid; accepted: {STUDY_KEYS[key]}")


def _ints(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) and v >= 0 for v in value):
        raise _bad(key, value)
    return list(value)


def _value(head: Mapping[str, Any], key: str, default: Any, ok: Callable[[Any], bool]) -> Any:
    """head[key] (or the default) when `ok` accepts it; else a StudyError naming the key and what it accepts."""
    value = head.get(key, default)
    if not ok(value):
        raise _bad(key, value)
    return value


def check_score(score: Any, where: str) -> str:
    """A score name: last-k, final, best, rounds-to:T, seconds-to:T with T a number."""
    if not isinstance(score, str) or not SCORE_PATTERN.match(score):
        raise StudyError(f"{where}: score {score!r} must be {SCORES}")
    if "-to:" in score:
        try:
            float(score.split(":", 1)[1])
        except ValueError:
            raise StudyError(f"{where}: score {score!r}: the target after ':' is not a number") from None
    return score


def check_metric(metric: Any, where: str) -> str:
    """A metric a run records (KNOWN_METRICS or one of METRIC_PREFIXES), else refused with the closest names."""
    if isinstance(metric, str) and (metric in KNOWN_METRICS or metric.startswith(METRIC_PREFIXES)):
        return metric
    close = difflib.get_close_matches(str(metric), KNOWN_METRICS, n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    raise StudyError(f"{where}: metric {metric!r} is not one a run records{hint}; known: {', '.join(KNOWN_METRICS)} "
                     f"and names starting {', '.join(METRIC_PREFIXES)}")


def _unknown_keys(table: Mapping[str, Any], known: Any, where: str) -> None:
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise StudyError(f"{where}: unknown key {key!r}{hint}; known: {', '.join(known)}")


def _table(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise StudyError(f"'{key}' must be a table")
    return dict(value)


def _claim(entry: Any, default_score: str, arms: set[str], default_metric: str, metrics: list[str]) -> Claim:
    if isinstance(entry, str):
        text, score, metric = entry, default_score, default_metric
    elif isinstance(entry, Mapping):
        _unknown_keys(entry, CLAIM_KEYS, "[[claims]]")
        text, score, metric = entry.get("claim"), entry.get("score", default_score), entry.get("metric", default_metric)
    else:
        raise StudyError(f"[[claims]] entry {entry!r} must be a string 'A > B' or a table with claim, score, metric")
    if not isinstance(text, str):
        raise StudyError(f"[[claims]] claim = {text!r} must be a string 'A > B' or 'A < B' with arm names")
    check_score(score, f"claim {text!r}")
    match = CLAIM_PATTERN.match(text or "")
    if not match:
        raise StudyError(f"claim {text!r} must read 'A > B' or 'A < B' with arm names")
    better, direction, other = match.groups()
    for name in (better, other):
        if name not in arms:
            raise StudyError(f"claim {text!r} names '{name}', which is not an arm (arms: {', '.join(sorted(arms))})")
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
    _unknown_keys(head, STUDY_KEYS, "[study]")
    report_seeds = _ints(head.get("report-seeds", [0, 1, 2]), "report-seeds")
    tuning_seeds = _ints(head.get("tuning-seeds", []), "tuning-seeds")
    if not report_seeds:
        raise _bad("report-seeds", report_seeds)
    if set(report_seeds) & set(tuning_seeds):
        raise StudyError(f"[study] tuning-seeds {sorted(set(report_seeds) & set(tuning_seeds))} are also report seeds; "
                         "tuning must use seeds of its own")
    metric = check_metric(head.get("metric", "central-accuracy"), "[study] metric")
    tuning_metric = check_metric(head.get("tuning-metric", "local-test-accuracy"), "[study] tuning-metric")
    if tuning_metric.startswith("central-") or tuning_metric.startswith("final-central") or tuning_metric == "accuracy":
        raise StudyError(f"[study] tuning-metric {tuning_metric!r} is scored on the official test split; "
                         "tune on the clients' held-out split (local-test-accuracy) or a training hold-out")
    score = check_score(head.get("score", "last-k"), "[study]")
    targets = [float(t) for t in _value(head, "targets", [], lambda v: isinstance(v, list) and all(map(_is_number, v)))]
    last_k = _value(head, "last-k", 5, lambda v: _is_int(v) and v >= 1)
    display_scale = _value(head, "display-scale", 1.0, lambda v: _is_number(v) and v > 0)
    num_supernodes = _value(head, "num-supernodes", 10, lambda v: _is_int(v) and v >= 1)
    cpus_per_client = _value(head, "cpus-per-client", 1.0, lambda v: _is_number(v) and v > 0)
    gpus_per_client = _value(head, "gpus-per-client", 0.0,
                             lambda v: _is_number(v) and v >= 0 and (v <= 1 or float(v).is_integer()))
    tuning_central_eval = _value(head, "tuning-central-eval", False, lambda v: isinstance(v, bool))
    for key in ("name", "description", "notes"):
        _value(head, key, "", lambda v: isinstance(v, str))
    base = _table(raw, "base")
    variants = _table(raw, "variants")
    for name, table in variants.items():
        if "@" in name or not isinstance(table, Mapping):
            raise StudyError(f"variant {name!r} must be a table [variants.{name}] and its name must not contain '@'")
    variants = {name: dict(table) for name, table in variants.items()}
    arms: dict[str, Arm] = {}
    for name, table in _table(raw, "arms").items():
        if "@" in name or not isinstance(table, Mapping):
            raise StudyError(f"arm {name!r} must be a table and its name must not contain '@'")
        overrides = {k: v for k, v in table.items() if k not in ("grid", "paper")}
        if not isinstance(table.get("grid", {}), Mapping):
            raise StudyError(f"arm {name!r}: grid = {table.get('grid')!r} must be a table [arms.{name}.grid] of "
                             "run-config keys, each with a non-empty list of values")
        grid = dict(table.get("grid", {}))
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise StudyError(f"arm {name!r}: grid {key!r} must be a non-empty list")
        paper = table.get("paper")
        if paper is not None and not (_is_number(paper) or (isinstance(paper, Mapping) and all(
                _is_number(v) for v in paper.values()))):
            raise StudyError(f"arm {name!r}: paper = {paper!r} must be a number or a table of numbers per variant")
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
    extra = _value(head, "extra-metrics", [], lambda v: isinstance(v, list))
    extra_metrics = [check_metric(m, "[study] extra-metrics") for m in extra]
    scored = scored_metrics(metric, tuning_metric, extra_metrics)
    if not isinstance(raw.get("claims", []), list):
        raise StudyError("claims must be an array of tables [[claims]] (or strings 'A > B')")
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
        last_k=last_k, score=score, targets=targets, display_scale=float(display_scale),
        num_supernodes=num_supernodes, cpus_per_client=float(cpus_per_client),
        gpus_per_client=float(gpus_per_client),
        tuning_central_eval=tuning_central_eval, notes=str(head.get("notes", "")),
        sharpness_examples=sharpness_examples,
    )


def select(study: Study, arms: list[str] | None = None, variants: list[str] | None = None) -> Study:
    """The part of a study on some of its arms and variants, to run a slice of a large study first.

    Run keys are digests of the effective run config alone, so a run of the part is the same run (same key,
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


def load_study(path: Path, check_config: Callable[[dict[str, Any]], None] | None = None,
               app_defaults: Mapping[str, Any] | None = None) -> Study:
    """Read and check a study file; `check_config` validates every run config it can produce.

    `app_defaults` (the app's `[tool.flwr.app.config]`) resolve each run's effective config, which its key
    digests; without them the run config's own defaults do.
    """
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise StudyError(f"study file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise StudyError(f"study file {path} is not valid TOML: {err}") from None
    study = parse_study(raw, Path(path))
    if app_defaults is not None:
        study = replace(study, app_defaults=dict(app_defaults))
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
                runs.append(study.run_spec(cell, arm, variant, "tune", seed, point, overrides))
    return runs


def report_runs(study: Study, chosen: Mapping[str, dict[str, Any]]) -> list[RunSpec]:
    """Every cell on every report seed, with its chosen grid point (cells without a grid: their overrides)."""
    runs = []
    for cell, arm, variant in study.cells():
        point = dict(chosen.get(cell, {}))
        for seed in study.report_seeds:
            overrides = {**study.cell_overrides(arm, variant), **point, "seed": seed}
            runs.append(study.run_spec(cell, arm, variant, "report", seed, point, overrides))
    return runs


def better(a: float, b: float, metric: str) -> bool:
    """Whether score a beats score b for this metric's direction."""
    return a < b if lower_is_better(metric) else a > b
