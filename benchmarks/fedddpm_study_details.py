"""What a FedDDPM study's report does not show, read from its runs' folders: why the FIDs are what they are.

    .venv/bin/python benchmarks/fedddpm_study_details.py [--ledger FILE] [--out FILE]

The study report (`fedsynth study`) compares the arms' scores. Issue 17 asks, where a claim does not hold, for
measurements that say why. This script reads every report run of the ledger from its folder (`run-dir`:
`metrics.jsonl` and `summary.json`) and tabulates, per run and as the mean and standard deviation per arm:

- the auxiliary set's own FID and KID (round 0: the paper's Table IV reference row), which bounds what the
  server's correction can teach;
- every FID evaluation and the spread (max - min) of the last k, the round-to-round swing that the last-k
  mean averages over;
- the final model's 5,000-sample FID and KID, and how many classes its samples cover (the feature
  classifier's predicted-class histogram: a model that drew only some classes scores a high FID however
  clean its images);
- FedDDPM+'s QuickTest scores, the round it stopped at and why.

It needs the runs' folders (they are not committed); the ledger alone remakes only the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, only benchmarks/ is on sys.path

from fedsynth.study.ledger import Ledger  # noqa: E402
from fedsynth.study.plan import read_rounds  # noqa: E402

DEFAULT_LEDGER = REPO_ROOT / "benchmarks" / "results" / "studies" / "fedddpm-cpu" / "ledger.jsonl"


def last_values(rounds: Sequence[dict[str, Any]], metric: str, k: int) -> list[float]:
    """The metric's values in the run's last k evaluations, oldest first."""
    values = [float(r[metric]) for r in rounds if isinstance(r.get(metric), (int, float))]
    return values[-k:]


def run_facts(rounds: Sequence[dict[str, Any]], summary: dict[str, Any], last_k: int) -> dict[str, Any]:
    """One run's facts: auxiliary-set scores, FID curve, last-k mean and spread, final scores, QuickTest."""
    warmup = next((r for r in rounds if r.get("round") == 0), {})
    fid_curve = [(int(r["round"]), float(r["fid"])) for r in rounds if isinstance(r.get("fid"), (int, float))]
    last = last_values(rounds, "fid", last_k)
    quicktests = [(int(r["round"]), float(r["quicktest-fid"])) for r in rounds if "quicktest-fid" in r]
    return {
        "aux-fid": warmup.get("aux-fid"), "aux-kid": warmup.get("aux-kid"),
        "fid-curve": fid_curve,
        "last-k-fid": statistics.fmean(last) if last else None,
        "last-k-spread": (max(last) - min(last)) if last else None,
        "final-fid": summary.get("final-fid"), "final-kid": summary.get("final-kid"),
        "classes-covered": summary.get("final-classes-covered"),
        "class-entropy": summary.get("final-class-entropy"),
        "quicktests": quicktests,
        "stopped-at": summary.get("stopped-at-round"), "stop-reason": summary.get("stop-reason"),
        "rounds": summary.get("rounds"),
    }


def _fmt(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _mean_sd(values: Sequence[Any], digits: int = 1) -> str:
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    if not numbers:
        return "–"
    sd = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
    return f"{statistics.fmean(numbers):.{digits}f} ± {sd:.{digits}f}"


def render(facts: Sequence[tuple[str, int, dict[str, Any]]], last_k: int, source: str) -> str:
    """The markdown: one table per run, one per arm (mean ± sd over seeds)."""
    lines = [
        "# FedDDPM study: what the report does not show", "",
        f"Command: `python benchmarks/fedddpm_study_details.py --ledger {source}` (reads each report run's "
        "`metrics.jsonl` and `summary.json`).", "",
        "FIDs and KIDs use the study's feature classifier (not Inception); KID is x 1e3. "
        f"`last-{last_k} spread` is max - min over the last {last_k} FID evaluations (1,000 samples each); "
        "`final` scores the final model on 5,000 samples. `classes` is how many of the 10 classes hold at "
        "least a quarter of the uniform share of the final samples (entropy / log 10 beside it).", "",
        "## Per arm (mean ± sd over seeds)", "",
        f"| arm | seeds | aux FID | aux KID | last-{last_k} FID | last-{last_k} spread | final FID | final KID "
        "| classes | class entropy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    arms = sorted({arm for arm, _, _ in facts}, key=[arm for arm, _, _ in facts].index)
    for arm in arms:
        rows = [f for a, _, f in facts if a == arm]
        column = lambda key: [r[key] for r in rows]  # noqa: E731
        lines.append(
            f"| {arm} | {len(rows)} | {_mean_sd(column('aux-fid'))} | {_mean_sd(column('aux-kid'))} "
            f"| {_mean_sd(column('last-k-fid'))} | {_mean_sd(column('last-k-spread'))} "
            f"| {_mean_sd(column('final-fid'))} | {_mean_sd(column('final-kid'))} "
            f"| {_mean_sd(column('classes-covered'))} | {_mean_sd(column('class-entropy'), 2)} |"
        )
    lines += ["", "## Per run", "",
              "| arm | seed | rounds | aux FID | FID by round | final FID | classes | QuickTest FID by round | stop |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, seed, f in facts:
        curve = ", ".join(f"{r}: {v:.0f}" for r, v in f["fid-curve"])
        quick = ", ".join(f"{r}: {v:.1f}" for r, v in f["quicktests"]) or "–"
        stop = f"{f['stop-reason']} at {f['stopped-at']}" if f["stop-reason"] else "–"
        lines.append(f"| {arm} | {seed} | {_fmt(f['rounds'])} | {_fmt(f['aux-fid'])} | {curve} "
                     f"| {_fmt(f['final-fid'])} | {_fmt(f['classes-covered'])} | {quick} | {stop} |")
    return "\n".join(lines) + "\n"


def collect(ledger: Ledger, last_k: int) -> list[tuple[str, int, dict[str, Any]]]:
    """(arm, seed, facts) of every finished report run whose folder is still on this machine."""
    out = []
    entries = sorted((e for e in ledger.entries.values() if e.get("phase") == "report" and e.get("exit-code") == 0),
                     key=lambda e: (e["arm"], e["seed"]))
    for entry in entries:
        folder = Path(entry["run-dir"])
        summary_path = folder / "summary.json"
        if not summary_path.is_file():
            print(f"skipped {entry['arm']} seed {entry['seed']}: {folder} is not here", file=sys.stderr)
            continue
        out.append((entry["arm"], int(entry["seed"]),
                    run_facts(read_rounds(folder), json.loads(summary_path.read_text()), last_k)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER)
    parser.add_argument("--out", type=Path, default=None, help="default: details.md beside the ledger")
    parser.add_argument("--last-k", type=int, default=4, help="the study's last-k (fedddpm-cpu: 4)")
    args = parser.parse_args(argv)
    facts = collect(Ledger(args.ledger), args.last_k)
    if not facts:
        print("no finished report run with its folder on this machine", file=sys.stderr)
        return 1
    out = args.out or args.ledger.parent / "details.md"
    try:
        source = args.ledger.resolve().relative_to(REPO_ROOT)
    except ValueError:
        source = args.ledger
    out.write_text(render(facts, args.last_k, str(source)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
