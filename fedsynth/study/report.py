"""A study's report, made from its ledger alone: report.md, runs.csv, curves.png and claims.png.

`report.md` has one verdict line per claim (and variant), the claims' paired
differences with their 95 % intervals, each arm's scores with intervals over the
report seeds beside the paper's number, and the tuning table (every grid point's
validation score and the choice). `runs.csv` has one row per run with every
config value that differs between runs and every score; `curves.png` the mean
curve of each arm with a band of ± one standard deviation over seeds; `claims.png`
the claims' differences as bars (`fedsynth.study.figure`).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedsynth.study.checks import FolderCheck, check_run_folders
from fedsynth.study.effective import effective_config
from fedsynth.study.ledger import Ledger
from fedsynth.study.scores import lower_is_better
from fedsynth.study.statistics import Interval, t_interval
from fedsynth.study.plan import (choose, commits_of, every_possible_run, keyed_for, other_config_text,
                                 planned_entries, plan, rules_by_cell, runs_under_other_configs, total_runs)
from fedsynth.study.figure import plot_claims
from fedsynth.study.verdicts import cell_scores, claim_cells, claim_format, claim_result, digits_of, display_scale_of
from fedsynth.study.studyfile import Study

CLAIMS_FIGURE = "claims.png"


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2, sign: bool = False) -> str:
    if value is None or not isinstance(value, (int, float)) or math.isnan(value):
        return "–"
    return f"{value * scale:+.{digits}f}" if sign else f"{value * scale:.{digits}f}"


def _interval_text(interval: Interval, scale: float, digits: int, sign: bool = False) -> str:
    if interval.n < 2:
        return "–"
    return f"[{_fmt(interval.low, scale, digits, sign)}, {_fmt(interval.high, scale, digits, sign)}]"


def provenance_lines(study: Study, ledger: Ledger) -> list[str]:
    """The header's lines on what made the runs: their server rule, commits and versions, and the entries left
    out because they ran the same settings under another effective config (each named by key)."""
    study = keyed_for(study, ledger)
    lines = []
    if study.keyed_by_settings:
        lines.append("- **Made before provenance**: the ledger's entries record neither their effective config nor "
                     "their commit, and their run keys digest the study's settings alone (docs/studies.md).")
    if ledger.malformed:
        lines.append(f"- **{len(ledger.malformed)} ledger line(s) failed the ledger's checks and are left out**: "
                     + "; ".join(ledger.malformed[:5]) + ("; ..." if len(ledger.malformed) > 5 else "") + ".")
    rules = rules_by_cell(study, ledger)
    if len(rules) == 1:
        lines.append(f"- Server rule of every run: {next(iter(rules))}.")
    elif rules:
        lines.append("- Server rules (they differ between cells): "
                     + "; ".join(f"{rule} ({', '.join(cells)})" for rule, cells in rules.items()) + ".")
    commits = commits_of(study, ledger)
    if commits:
        lines.append("- Commit(s) the runs came from: "
                     + ", ".join(f"{label} ({count} runs)" for label, count in commits.items()) + ".")
    versions: dict[str, int] = {}
    for _, entry in planned_entries(study, ledger):
        record = entry.get("provenance")
        if isinstance(record, Mapping):
            text = (f"fedsynth {record.get('fedsynth-version')}, flwr {record.get('flwr')}, torch "
                    f"{record.get('torch')}, Python {record.get('python')} on {record.get('device')}")
            versions[text] = versions.get(text, 0) + 1
    if versions:
        lines.append("- Versions: " + "; ".join(f"{text} ({count} runs)" for text, count in versions.items()) + ".")
    if not study.keyed_by_settings:
        other = runs_under_other_configs(every_possible_run(study), ledger)
        if other:
            shown = [other_config_text(ledger, spec, entry) for spec, entry in other[:3]]
            lines.append(f"- **{len(other)} ledger entr{'y' if len(other) == 1 else 'ies'} ran this study's settings "
                         "under another effective config (or an unrecorded one) and are left out**, not mixed in: "
                         + "; ".join(shown) + ("; ..." if len(other) > 3 else "") + ".")
    return lines


def mixed_means_note(means: Mapping[str, str]) -> str:
    """A sentence when the arms (name -> the server mean it runs) do not all run one mean, else "".

    A paper compares all its arms under one mean; since `aggregation = "auto"` runs each algorithm's paper mean
    (uniform for FedSynSAM and FedDDPM, weighted for the others), two arms left at the default can differ in it.
    """
    if len(set(means.values())) <= 1:
        return ""
    arms = ", ".join(f"{name} {mean}" for name, mean in means.items())
    return (f"the arms run different means ({arms}): the difference mixes the rule with the mean; set one "
            "`aggregation` for every arm to compare the rules alone")


def cell_mean(study: Study, cell: str) -> str | None:
    """The server mean a cell's runs run (their effective `aggregation`), or None where the study's ledger keys
    runs by their settings alone (made before provenance: the rule is not recorded)."""
    if study.keyed_by_settings:
        return None
    arm, variant = next((arm, variant) for name, arm, variant in study.cells() if name == cell)
    return str(effective_config(study.app_defaults, study.cell_overrides(arm, variant)).get("aggregation"))


def claim_means_note(study: Study, cell_a: str, cell_b: str) -> str:
    """`mixed_means_note` of a claim's two cells (empty when either cell's mean is not known)."""
    means = {cell: cell_mean(study, cell) for cell in (cell_a, cell_b)}
    if None in means.values():
        return ""
    return mixed_means_note({cell: str(mean) for cell, mean in means.items()})


def render_markdown(study: Study, ledger: Ledger, folders: FolderCheck | None = None) -> str:
    """The text of report.md, from the entries that agree with their run folders where those are here
    (`folders`, `fedsynth.study.checks.check_run_folders`, made when not given)."""
    study = keyed_for(study, ledger)
    folders = folders or check_run_folders(study, ledger)
    ledger = folders.ledger
    tuning, report, chosen = plan(study, ledger)
    done = sum(1 for spec in tuning + report if spec.key in ledger)
    total = total_runs(study)
    direction = "lower" if lower_is_better(study.metric) else "higher"
    lines = [f"# Study `{study.name}`", ""]
    if study.description:
        lines += [study.description, ""]
    if study.part:
        lines += [f"**A part of the study file**, run with `--arms`/`--variants`: {study.part}. The other arms "
                  "and their claims are not in this report; run the whole file with the same `--out` to add them.", ""]
    lines += [
        f"- Study file: `{study.path.name}`; {done} of {total} runs finished"
        + ("" if done >= total else " — **incomplete**: the numbers below use the finished runs only") + ".",
        f"- Metric: `{study.metric}` ({direction} is better); runs scored by **{study.score}** "
        f"(last-k = mean of the last {study.last_k} evaluations).",
        f"- Report seeds {study.report_seeds} (the same seed is the same split and client sampling for every arm); "
        f"tuning seeds {study.tuning_seeds} on `{study.tuning_metric}` (never the official test split).",
        "- Claims: paired difference A − B over report seeds, two-sided 95 % Student-t interval; **holds** when the "
        "interval is on the claimed side of 0, **reversed** on the other side, **not resolved** when it contains 0.",
        *provenance_lines(study, ledger),
        *folders.lines(),
    ]
    reused = Counter(ledger.entries[spec.key]["reused-from"] for spec in tuning + report
                     if "reused-from" in ledger.entries.get(spec.key, {}))
    same = "same run config" if study.keyed_by_settings else "same effective run config"  # how it was matched
    lines += [f"- {count} run(s) reused from `{source}` ({same}; `--reuse`)." for source, count in reused.items()]
    lines.append("")
    if study.notes:
        lines += [study.notes.strip(), ""]
    cells = [cells for claim in study.claims for cells in claim_cells(study, claim)]
    results = [claim_result(study, ledger, claim, c) for claim in study.claims for c in claim_cells(study, claim)]
    if results:
        lines += ["## Claims", ""]
        for result, (_, cell_a, cell_b) in zip(results, cells):
            scale, digits = claim_format(study, result)
            where = f" ({result['variant']})" if result["variant"] else ""
            note = claim_means_note(study, cell_a, cell_b)
            lines.append(f"- **{result['claim']}**{where}, {result['score']}: difference "
                         f"{_fmt(result['interval'].mean, scale, digits, True)}, 95 % CI "
                         f"{_interval_text(result['interval'], scale, digits, True)} over {result['interval'].n} seeds "
                         f"→ **{result['verdict']}**" + (f"; **note**: {note}" if note else ""))
        lines += ["", f"![Each claim's paired difference with its 95 % interval, coloured by verdict]({CLAIMS_FIGURE})",
                  "", "| claim | variant | score | pairs | A − B per seed | mean | 95 % CI | verdict |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for result in results:
            scale, digits = claim_format(study, result)
            per_seed = ", ".join(f"{seed}: {_fmt(d, scale, digits, True)}" for seed, d in result["differences"].items())
            censored = f" ({result['censored']} censored)" if result["censored"] else ""
            lines.append(f"| {result['claim']} | {result['variant'] or '–'} | {result['score']} | "
                         f"{result['interval'].n}{censored} | {per_seed or '–'} | "
                         f"{_fmt(result['interval'].mean, scale, digits, True)} | "
                         f"{_interval_text(result['interval'], scale, digits, True)} | {result['verdict']} |")
        lines.append("")
    lines += _arms_table(study, ledger, chosen)
    lines += _extra_metrics_table(study, ledger)
    lines += _tuning_table(study, ledger)
    lines += ["## Files", "", "- `runs.csv`: one row per run (config values that differ, every score).",
              "- `curves.png`: mean curve per arm over report seeds, band ± 1 sd.",
              *([f"- `{CLAIMS_FIGURE}`: each claim's paired difference with its 95 % interval (colour: verdict; "
                 "diamond: the paper's difference, where the study file has both arms' paper numbers)."]
                if results else []),
              "- `ledger.jsonl`: the finished runs; `fedsynth study FILE --report-only` remakes this report from it.", ""]
    return "\n".join(lines)


def grid_edges(grid: Mapping[str, list[Any]], point: Mapping[str, Any]) -> list[str]:
    """The numeric grid keys (two values or more) whose chosen value is the grid's smallest or largest.

    A tuned value at the edge of its grid means the grid may not contain the best value; the
    report says so instead of presenting the edge as the method's optimum.
    """
    edges = []
    for key, values in grid.items():
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if key in point and len(numbers) == len(values) >= 2 and point[key] in (min(numbers), max(numbers)):
            edges.append(f"{key} = {point[key]}")
    return edges


def _arms_table(study: Study, ledger: Ledger, chosen: Mapping[str, dict[str, Any]]) -> list[str]:
    scores = ["last-k", "final", "best", *[f"rounds-to:{t:g}" for t in study.targets]]
    head = " | ".join(f"{s} mean ± sd" if s == "last-k" else s for s in scores)
    lines = ["## Arms", "", f"| arm | variant | seeds | {head} | last-k 95 % CI | paper | tuned values |",
             "| --- | --- | --- |" + " --- |" * len(scores) + " --- | --- | --- |"]
    for cell, arm, variant in study.cells():
        cells = []
        last_k_interval = None
        n = 0
        for score in scores:
            values, censored = cell_scores(study, ledger, cell, score)
            interval = t_interval(list(values.values()))
            scale, digits = display_scale_of(study, score), digits_of(study, score)
            if score == "last-k":
                last_k_interval, n = interval, interval.n
                cells.append(f"{_fmt(interval.mean, scale, digits)} ± {_fmt(interval.sd, scale, digits)}")
            else:
                cells.append(_fmt(interval.mean, scale, digits) + (f" ({censored} not reached)" if censored else ""))
        paper = study.arms[arm].paper_number(variant)
        tuned = json.dumps(chosen[cell]) if cell in chosen else ("–" if not study.arms[arm].grid else "tuning unfinished")
        edges = grid_edges(study.arms[arm].grid, chosen.get(cell, {}))
        if edges:
            tuned += f" (at the grid's edge: {', '.join(edges)}; the best value may lie outside the grid)"
        lines.append(f"| {arm} | {variant or '–'} | {n} | " + " | ".join(cells) + f" | "
                     f"{_interval_text(last_k_interval, study.display_scale, digits_of(study, 'last-k'))} | "
                     f"{'–' if paper is None else paper} | {tuned} |")
    return [*lines, ""]


def _extra_metrics_table(study: Study, ledger: Ledger) -> list[str]:
    """The study's `extra-metrics` (diagnostics), last-k mean ± sd over report seeds, for the arms that log them."""
    rows = []
    for cell, arm, variant in study.cells():
        cells, logged = [], False
        for metric in study.extra_metrics:
            values, _ = cell_scores(study, ledger, cell, "last-k", metric)
            interval = t_interval(list(values.values()))
            logged = logged or bool(values)
            cells.append(f"{_fmt(interval.mean, 1.0, 4)} ± {_fmt(interval.sd, 1.0, 4)}" if values else "–")
        if logged:
            rows.append(f"| {arm} | {variant or '–'} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["## Extra metrics", "", f"Last-{study.last_k} mean ± sd over report seeds, unscaled.", "",
            "| arm | variant | " + " | ".join(f"`{m}`" for m in study.extra_metrics) + " |",
            "| --- | --- |" + " --- |" * len(study.extra_metrics), *rows, ""]


def _tuning_table(study: Study, ledger: Ledger) -> list[str]:
    _, table = choose(study, ledger)
    if not table:
        return []
    lines = ["## Tuning", "", f"Validation score: last-{study.last_k} mean of `{study.tuning_metric}` on tuning seeds "
             f"{study.tuning_seeds}; a point with a missing or non-finite score on any seed is never chosen.", "",
             "| arm | grid point | score per tuning seed | mean | chosen |", "| --- | --- | --- | --- | --- |"]
    for row in table:
        scores = ", ".join(_fmt(v, study.display_scale, digits_of(study, "last-k")) for v in row["scores"])
        lines.append(f"| {row['cell']} | {json.dumps(row['point'])} | {scores} | "
                     f"{_fmt(row['mean'], study.display_scale, digits_of(study, 'last-k'))} | {'**yes**' if row['chosen'] else ''} |")
    return [*lines, ""]


def write_runs_csv(study: Study, ledger: Ledger, path: Path) -> None:
    """One row per run: identity, the config values that differ between runs, and every score."""
    entries = list(ledger.entries.values())
    keys = sorted({k for e in entries for k in e.get("config", {})})
    differing = [k for k in keys if len({json.dumps(e.get("config", {}).get(k), sort_keys=True) for e in entries}) > 1]
    score_columns = sorted({f"{m}:{s}" for e in entries for m, scores in e.get("scores", {}).items() for s in scores})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["cell", "arm", "variant", "phase", "seed", "exit-code", "seconds", "rounds", *differing, *score_columns])
        for e in entries:
            scores = {f"{m}:{s}": v for m, values in e.get("scores", {}).items() for s, v in values.items()}
            writer.writerow([e.get("cell"), e.get("arm"), e.get("variant"), e.get("phase"), e.get("seed"),
                             e.get("exit-code"), e.get("seconds"), e.get("rounds"),
                             *[e.get("config", {}).get(k, "") for k in differing],
                             *["" if scores.get(c) is None else scores[c] for c in score_columns]])


def plot_curves(study: Study, ledger: Ledger, path: Path) -> None:
    """Mean curve of each arm over its report seeds with a ± 1 sd band; one panel per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, report, _ = plan(study, ledger)
    variants = list(study.variants) or [""]
    fig, axes = plt.subplots(1, len(variants), figsize=(6 * len(variants), 4), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        for arm in study.arms:
            cell = f"{arm}@{variant}" if variant else arm
            by_round: dict[int, list[float]] = {}
            for spec in report:
                entry = ledger.get(spec.key)
                if spec.cell == cell and entry is not None:
                    for r, v in entry.get("curves", {}).get(study.metric, []):
                        if isinstance(v, (int, float)) and math.isfinite(v):
                            by_round.setdefault(int(r), []).append(float(v) * study.display_scale)
            if not by_round:
                continue
            rounds = sorted(by_round)
            means = [sum(by_round[r]) / len(by_round[r]) for r in rounds]
            sds = [t_interval(by_round[r]).sd if len(by_round[r]) > 1 else 0.0 for r in rounds]
            line, = ax.plot(rounds, means, label=arm)
            ax.fill_between(rounds, [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)],
                            color=line.get_color(), alpha=0.2)
        ax.set(xlabel="round", ylabel=study.metric, title=variant or study.name)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(study: Study, ledger: Ledger, out: Path) -> None:
    """report.md, runs.csv, curves.png and (when the study has claims) claims.png into `out`.

    A ledger made before provenance is read by the keys it was made with (`keyed_for`).
    """
    study = keyed_for(study, ledger)
    folders = check_run_folders(study, ledger)  # the entries that disagree with their run folders are left out
    ledger = folders.ledger
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(study, ledger, folders))
    write_runs_csv(study, ledger, out / "runs.csv")
    plot_curves(study, ledger, out / "curves.png")
    if study.claims:  # a part of a study may have none; then there is nothing to draw
        plot_claims(study, ledger, out / CLAIMS_FIGURE)
