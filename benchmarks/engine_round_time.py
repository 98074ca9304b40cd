"""Seconds per round of `fedsynth run --engine inprocess` against Flower's simulation engine, on study configs.

Why: `fedsynth study --engine inprocess` runs each run's nodes in the run's own process, one after another,
without Ray. This measures what that saves on the studies it is meant for, each engine in its own
process (as `fedsynth study` starts a run) with one BLAS/OpenMP thread (as `fedsynth study --jobs 2` gives each run on 2 cores),
`--jobs` runs at once (default: one per core, as a study on the whole host runs them), the two engines
alternating so that both see the same machine. Per batch: each run's median `round-time` of metrics.jsonl
over rounds >= 2 (round 1 carries one-off costs) and the batch's wall time (start-up, handshake and round 0
included). The report gives each engine's median over repetitions and the ratio inprocess / simulation;
both engines give the same metrics (tests/test_simulation.py). In the simulation engine one run's Ray
starts as many ClientApp actors as the host has cores, so the runs of a batch compete for the cores there;
in process each run uses one.

    python benchmarks/engine_round_time.py --rounds 4 --repeats 2 --out /tmp/engine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (label, study file, arm, variant): a decentralized study of 100 small nodes and a 10-client FedAvg study
CASES = [
    ("oledfl-long dfedavg (100 nodes, MLP)", "studies/oledfl-long.toml", "dfedavg", ""),
    ("fedsynsam-bucket fedavg qsgd4b (10 clients, MLP)", "studies/fedsynsam-bucket.toml", "fedavg", "qsgd4b"),
]


def run_batch(raw: dict, nodes: int, engine: str, folders: list[Path]) -> dict:
    """Runs at once, each in its own process as `fedsynth study --jobs N` starts them (fedsynth/study/worker.py).

    Returns the batch's wall time and each run's rounds' times (seeds 0, 1, ...: different splits, same work).
    """
    children = []
    start = time.monotonic()
    for seed, folder in enumerate(folders):
        job = {"app-dir": str(REPO), "num-supernodes": nodes, "cpus-per-client": 1.0, "gpus-per-client": 0.0,
               "ray-address": None, "engine": engine,
               "overrides": {**raw, "seed": seed, "results-dir": str(folder.parent), "run-name": folder.name,
                             "overwrite": True}}
        children.append(subprocess.Popen([sys.executable, "-m", "fedsynth.study.worker", json.dumps(job)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                         env={**os.environ, "OMP_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"}))
    for child in children:
        _, err = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"{engine}: exit {child.returncode}: {err[-1500:]}")
    wall = time.monotonic() - start
    medians = []
    for folder in folders:
        rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        medians.append(statistics.median(r["round-time"] for r in rounds if r.get("round", 0) >= 2))
    return {"wall": wall, "median-round-per-run": medians, "median-round": statistics.median(medians)}


def main() -> int:
    from benchmarks.gpu_round_time import study_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once (default: the cores)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cpus": os.cpu_count(), "cases": {}}
    for label, study_file, arm, variant in CASES:
        raw, nodes = study_config(study_file, arm, variant)
        raw.update({"num-server-rounds": args.rounds, "cache-dir": str(args.out / "cache"), "checkpoint-every": 0,
                    "eval-every": 1})
        runs: dict[str, list[dict]] = {"simulation": [], "inprocess": []}
        for repeat in range(args.repeats):
            order = ("simulation", "inprocess") if repeat % 2 == 0 else ("inprocess", "simulation")
            for engine in order:
                folders = [args.out / "runs" / f"{arm}-{variant}-{engine}-{repeat}-{job}" for job in range(args.jobs)]
                runs[engine].append(run_batch(raw, nodes, engine, folders))
                print(label, engine, repeat, json.dumps(runs[engine][-1]), flush=True)
        summary = {engine: {"median-round": statistics.median(r["median-round"] for r in rs),
                            "median-wall": statistics.median(r["wall"] for r in rs)} for engine, rs in runs.items()}
        summary["ratio-round"] = summary["inprocess"]["median-round"] / summary["simulation"]["median-round"]
        summary["ratio-wall"] = summary["inprocess"]["median-wall"] / summary["simulation"]["median-wall"]
        results["cases"][label] = {"nodes": nodes, "runs": runs, "summary": summary}
        (args.out / "engine_round_time.json").write_text(json.dumps(results, indent=1))
        print(label, json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
