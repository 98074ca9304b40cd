"""FedSynSAM's per-step gradient statistics of a study's runs, from their metrics.jsonl, per run and per arm.

    .venv/bin/python benchmarks/synsam_step_stats.py benchmarks/results/studies/fedsynsam-bucket-why
        # -> synsam-stats.csv (one row per run) and a markdown table per arm on stdout

A study's ledger keeps the curves of the metrics it scores, and a study that reuses another's runs
cannot score a metric those runs did not log (docs/studies.md). So the clients' per-step statistics
that FedSynSAM logs every round (`stat-synsam-norm-ratio-median`: each client's median over its local
steps of ||grad F(w; zeta)|| / ||grad F(w; xi)||, averaged over the round's clients; `stat-synsam-share-median`
and `stat-synsam-share`: the synthetic term's share of the ascent direction; `stat-synsam-cos`) are read
here from the run folders the ledger names (or, with `--runs`, from run folders outside a study). Each run
is summarised over its rounds after D_syn arrived (or over `--rounds FIRST-LAST`): the median over those
rounds (the ratio varies by orders of magnitude from round to round) and the mean of the last `--last-k`.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

STATS = ("stat-synsam-norm-ratio-median", "stat-synsam-share-median", "stat-synsam-share", "stat-synsam-cos")


def summarise(rounds: Sequence[Mapping[str, Any]], key: str, last_k: int) -> tuple[float, float]:
    """(median over the rounds that logged `key`, mean of its last `last_k`); NaN for a run that never logged it."""
    values = [float(r[key]) for r in sorted(rounds, key=lambda r: r["round"]) if key in r]
    if not values:
        return float("nan"), float("nan")
    return float(np.median(values)), float(np.mean(values[-last_k:]))


def read_rounds(run_dir: Path, first: int = 0, last: int = 10**9) -> list[dict[str, Any]]:
    """The run's per-round records (metrics.jsonl) of rounds first..last."""
    with open(run_dir / "metrics.jsonl") as handle:
        rounds = [json.loads(line) for line in handle if line.strip()]
    return [r for r in rounds if first <= int(r.get("round", 0)) <= last]


def run_folders(study: Path, extra: Sequence[Path]) -> list[tuple[str, int, Path]]:
    """(arm, seed, folder) of the study's own finished runs, then of `extra` folders (arm and seed from config.json)."""
    found = []
    with open(study / "ledger.jsonl") as handle:
        entries = [json.loads(line) for line in handle if line.strip()]
    for entry in sorted(entries, key=lambda e: (e["arm"], e["seed"])):
        run_dir = Path(entry.get("run-dir", ""))
        if not entry.get("reused-from") and (run_dir / "metrics.jsonl").is_file():  # a reused run's folder is elsewhere
            found.append((entry["arm"], int(entry["seed"]), run_dir))
    for folder in extra:
        config = json.loads((folder / "config.json").read_text())
        config = config.get("run-config", config)
        found.append((f"{config['algorithm']} lr {config['lr']} (--runs)", int(config["seed"]), folder))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the study's --out folder (holds ledger.jsonl)")
    parser.add_argument("--last-k", type=int, default=5)
    parser.add_argument("--rounds", default="", help="FIRST-LAST: only these rounds (default: all)")
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="more run folders (not in the study)")
    parser.add_argument("--csv", default="synsam-stats.csv", help="file name of the table, in the study folder")
    args = parser.parse_args(argv)
    first, last = (int(v) for v in args.rounds.split("-")) if args.rounds else (0, 10**9)
    rows = []
    for arm, seed, run_dir in run_folders(args.study, args.runs):
        rounds = read_rounds(run_dir, first, last)
        if not any(STATS[0] in r for r in rounds):
            continue  # not a FedSynSAM run
        row: dict[str, Any] = {"arm": arm, "seed": seed}
        for key in STATS:
            row[f"{key} (median of rounds)"], row[f"{key} (last-{args.last_k} mean)"] = summarise(rounds, key,
                                                                                                   args.last_k)
        rows.append(row)
    if not rows:
        print("no FedSynSAM run with its folder on this machine", file=sys.stderr)
        return 1
    with open(args.study / args.csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    columns = [c for c in rows[0] if c not in ("arm", "seed")]
    print("| arm | seeds | " + " | ".join(f"`{c}`" for c in columns) + " |")
    print("| --- | --- |" + " --- |" * len(columns))
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        cells = []
        for c in columns:
            values = np.array([r[c] for r in mine], dtype=float)
            cells.append(f"{np.mean(values):.4g} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.2g}")
        print(f"| {arm} | {len(mine)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
