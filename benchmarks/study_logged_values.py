"""Values a study's runs log once (not as a curve), per arm, read from the runs' folders.

    .venv/bin/python benchmarks/study_logged_values.py STUDY.toml --out DIR --keys K1,K2[,...] [--ratio A/B] [--report FILE]

A study's ledger keeps each run's scores and curves; values a run logs in one round only, such as the
distillation's `distill-loss-start` and `distill-loss-end` (FedSynSAM and DynaFed, the round they distil), are
not in it. This reads every finished report run of the study's ledger from its folder (the entry's `run-dir`,
`metrics.jsonl`), takes the first round that logged each key, and tabulates the values per run and their mean
and sd per arm. `--ratio A/B` adds the column A / B per run (for example the matching loss's end over its start).
It needs the runs' folders, which are not committed; the ledger says where they were.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, only benchmarks/ is on sys.path

from fedsynth.study.ledger import Ledger  # noqa: E402
from fedsynth.study.plan import keyed_for, plan, read_rounds  # noqa: E402
from fedsynth.study.studyfile import Study, load_study  # noqa: E402


def first_logged(rounds: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The value of `key` in the first round that logged it as a number, or None."""
    for record in rounds:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def ratio_column(ratio: tuple[str, str]) -> str:
    """The name of the ratio's column: "A/B"."""
    return f"{ratio[0]}/{ratio[1]}"


def with_ratio(values: dict[str, float | None], ratio: tuple[str, str] | None) -> dict[str, float | None]:
    """The values, plus "A/B" when a ratio is asked for and both are there (B non-zero)."""
    if ratio is None:
        return values
    a, b = values.get(ratio[0]), values.get(ratio[1])
    return {**values, ratio_column(ratio): a / b if a is not None and b else None}


def collect(study: Study, ledger: Ledger, keys: Sequence[str],
            ratio: tuple[str, str] | None) -> dict[str, dict[int, dict[str, float | None]]]:
    """{cell: {seed: {column: value}}} of the report runs that finished and whose folder is there."""
    _, report, _ = plan(keyed_for(study, ledger), ledger)  # a ledger from before provenance: its keys
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    for spec in report:
        entry = ledger.get(spec.key)
        if entry is None or entry.get("exit-code") != 0 or not entry.get("run-dir"):
            continue
        rounds = read_rounds(Path(entry["run-dir"]))
        if not rounds:
            continue
        values = with_ratio({key: first_logged(rounds, key) for key in keys}, ratio)
        if any(value is not None for value in values.values()):
            out.setdefault(spec.cell, {})[spec.seed] = values
    return out


def render(study: Study, table: Mapping[str, Mapping[int, Mapping[str, float | None]]], columns: Sequence[str]) -> str:
    """Markdown: one row per arm, each column's mean ± sd over seeds and the per-seed values."""
    lines = [f"# `{study.name}`: values logged once per run, mean ± sd over report seeds (per seed in brackets)", "",
             "| arm | seeds | " + " | ".join(f"`{c}`" for c in columns) + " |",
             "| --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    for cell, seeds in table.items():
        cells = []
        for column in columns:
            values = [seeds[s][column] for s in sorted(seeds) if seeds[s].get(column) is not None]
            if not values:
                cells.append("–")
                continue
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.4g} ± {sd:.2g} ({', '.join(f'{v:.4g}' for v in values)})")
        lines.append(f"| {cell} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the study file")
    parser.add_argument("--out", type=Path, required=True, help="the study's output folder (its ledger.jsonl)")
    parser.add_argument("--keys", required=True, help="comma-separated metrics.jsonl keys")
    parser.add_argument("--ratio", help="A/B: add the column A / B (both among --keys)")
    parser.add_argument("--report", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    keys = [k for k in args.keys.split(",") if k]
    ratio = tuple(args.ratio.split("/", 1)) if args.ratio else None
    if ratio is not None and (len(ratio) != 2 or not set(ratio) <= set(keys)):
        parser.error(f"--ratio {args.ratio!r} must be A/B with A and B among --keys")
    study = load_study(args.study)
    table = collect(study, Ledger(args.out / "ledger.jsonl"), keys, ratio)
    columns = [*keys, *([ratio_column(ratio)] if ratio else [])]
    text = render(study, table, columns)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
