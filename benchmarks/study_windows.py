"""A study's arms and claims rescored over a longer window of evaluations, from its committed ledger alone.

    .venv/bin/python benchmarks/study_windows.py STUDY.toml --out DIR [--window 20] [--end-round R] [--report FILE]

A study scores each run by the mean of its last k evaluations (SPEC 5; k = 5 in the FedSynSAM studies). Where
an arm's accuracy swings from one evaluation to the next (FedAvg and FedLESAM under Path(1) at lr 0.1 move by
1-3 points between evaluations 5 rounds apart, FedSAM by a few tenths), five evaluations can rank two arms by
where each happened to be in its swing. This rescores every report run over its last `--window` evaluations
and tests the study's claims on that score with the same paired Student-t interval as the report, and prints,
per arm, the spread between evaluations inside the window (the population sd of the window's values, mean over
seeds): the swing that the short window averages over.

`--end-round R` ends the window at the last evaluation at or before round R instead of at the run's end. With
`--window 1` it scores every run by its accuracy after one round, as FedCOG's Table 3 does (X or X+FedCOG
one round after the same base model: `--window 1 --end-round 21` in fedcog-cpu, whose arms fork at round 21).

It reads only the ledger (`DIR/ledger.jsonl`): a ledger keeps every run's curve whole up to
`fedsynth.study.ledger.MAX_CURVE_POINTS` evaluations; a thinned curve is refused rather than rescored on a subsample.
Claims on another metric than the study's (sharpness) are left out: they are one number per run.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, only benchmarks/ is on sys.path

from fedsynth.study.ledger import MAX_CURVE_POINTS, Ledger  # noqa: E402
from fedsynth.study.plan import keyed_for, plan  # noqa: E402
from fedsynth.study.verdicts import claim_cells, claim_result  # noqa: E402
from fedsynth.study.studyfile import Study, load_study  # noqa: E402


def window_stats(values: Sequence[float], window: int) -> tuple[float, float]:
    """Mean and population sd of the last `window` values (all of them when there are fewer)."""
    if window < 1:
        raise ValueError(f"a window has at least one evaluation, not {window}")
    tail = [float(v) for v in values][-window:]
    if not tail:
        return math.nan, math.nan
    return statistics.fmean(tail), statistics.pstdev(tail)


def points_until(points: Sequence[Sequence[float]], end_round: int | None) -> list[float]:
    """The values of a curve's (round, value) points up to and including `end_round` (all when None)."""
    return [float(value) for rnd, value in points if end_round is None or rnd <= end_round]


def rescore(study: Study, ledger: Ledger, window: int,
            end_round: int | None = None) -> dict[str, dict[int, tuple[float, float]]]:
    """Replace each report run's last-k score of the study's metric by its window mean, in this ledger object.

    The window is the last `window` evaluations at or before `end_round` (the run's end when None). Returns
    {cell: {seed: (window mean, window sd)}}. `render` passes it a copy.
    """
    _, report, _ = plan(keyed_for(study, ledger), ledger)  # a ledger from before provenance: its keys
    by_cell: dict[str, dict[int, tuple[float, float]]] = {}
    for spec in report:
        entry = ledger.get(spec.key)
        if entry is None or entry.get("exit-code") != 0:
            continue
        points = entry.get("curves", {}).get(study.metric, [])
        if len(points) >= MAX_CURVE_POINTS:
            raise SystemExit(f"{spec.cell} seed {spec.seed}: its ledger curve may be thinned ({len(points)} points); "
                             f"rescoring needs every evaluation")
        mean, sd = window_stats(points_until(points, end_round), window)
        entry.setdefault("scores", {}).setdefault(study.metric, {})["last-k"] = mean
        by_cell.setdefault(spec.cell, {})[spec.seed] = (mean, sd)
    return by_cell


def render(study: Study, ledger: Ledger, window: int, end_round: int | None = None) -> str:
    """Markdown: per-arm window means and within-window spread, then the claims at that window.

    The claims reuse the report's paired test (`claim_result`) on a copy of the ledger whose last-k scores are
    the window means; the caller's ledger is left as it was.
    """
    ledger = copy.deepcopy(ledger)
    cells = rescore(study, ledger, window, end_round)
    windowed = replace(study, last_k=window)
    scale = study.display_scale
    where = "" if end_round is None else f" up to round {end_round}"
    option = "" if end_round is None else f" --end-round {end_round}"
    lines = [f"# `{study.name}` rescored over the last {window} evaluations{where}", "",
             f"From `ledger.jsonl` alone (`benchmarks/study_windows.py --window {window}{option}`); the report's own "
             f"score is the last {study.last_k} of each run.", "",
             "| arm | seeds | window mean per seed | mean | spread inside the window (sd, mean over seeds) |",
             "| --- | --- | --- | --- | --- |"]
    for cell, seeds in cells.items():
        means = [seeds[s][0] for s in sorted(seeds)]
        per_seed = ", ".join(f"{s}: {seeds[s][0] * scale:.2f}" for s in sorted(seeds))
        spread = statistics.fmean(seeds[s][1] for s in seeds) * scale
        lines.append(f"| {cell} | {len(seeds)} | {per_seed} | {statistics.fmean(means) * scale:.2f} | {spread:.2f} |")
    lines += ["", "| claim | variant | A − B per seed | mean | 95 % CI | verdict |", "| --- | --- | --- | --- | --- | --- |"]
    for claim in study.claims:
        if claim.metric != study.metric:
            continue
        for variant_cells in claim_cells(study, claim):
            result: dict[str, Any] = claim_result(windowed, ledger, claim, variant_cells)
            if not result["differences"]:
                lines.append(f"| {claim.text} | {result['variant'] or '–'} | – | – | – | {result['verdict']} |")
                continue
            interval = result["interval"]
            differences = ", ".join(f"{s}: {d * scale:+.2f}" for s, d in result["differences"].items())
            lines.append(f"| {claim.text} | {result['variant'] or '–'} | {differences} | {interval.mean * scale:+.2f} | "
                         f"[{interval.low * scale:+.2f}, {interval.high * scale:+.2f}] | {result['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the study file")
    parser.add_argument("--out", type=Path, required=True, help="the study's output folder (its ledger.jsonl)")
    parser.add_argument("--window", type=int, default=20, help="evaluations at the end of each run (default 20)")
    parser.add_argument("--end-round", type=int, help="end the window at this round, not at the run's end")
    parser.add_argument("--report", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    text = render(load_study(args.study), Ledger(args.out / "ledger.jsonl"), args.window, args.end_round)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
