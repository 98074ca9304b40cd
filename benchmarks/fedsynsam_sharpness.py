"""Sharpness under compression: the FedSynSAM paper's Table I (top Hessian eigenvalue of FedAvg's final model).

    .venv/bin/python benchmarks/fedsynsam_sharpness.py [--split iid|dir0.01|path1] [--clients N] [--rounds R]
        [--algorithms fedavg,fedsam,fedsynsam] [--codecs none,qsgd4,qsgd8,topk0.25] [--out FILE]

The paper motivates FedSynSAM by Table I: FedAvg on Fashion-MNIST (100 clients) ends sharper with compressed
updates than without (IID: 7.56 uncompressed, 8.36 8-bit, 8.50 top-k 0.25, 8.82 4-bit; Dir(0.01): 17.04 and
17.78 8-bit). This runs each algorithm under each codec in Flower's simulation engine
(`fedsynth.simulation.run_simulation`, the path of `flwr run .`) and measures the top Hessian eigenvalue of each final
model's training loss (`common.metrics.sharpness`, 10,000 training examples, power iteration to 1e-3). The paper's
4-bit and 8-bit codecs are its eq. 3: one norm over the whole update, 17 and 257 levels (6 and 10 bits per
coordinate on the wire).

Table II (accuracy) moved to the study files `studies/fedsynsam-*.toml` (`fedsynth study`); this script replaces
the sharpness part of the former `presets/fedsynsam.py`. It writes a markdown table to `--out` (default
`results/fedsynsam-sharpness/sharpness.md`) with the paper's numbers beside ours.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, only benchmarks/ is on sys.path

CODECS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("no compression", {"compression": "none"}),
    "qsgd8": ("8-bit qsgd (model scope, 257 levels, 10 bits/coord)",
              {"compression": "qsgd", "qsgd-scope": "model", "levels": 257}),
    "topk0.25": ("top-k 0.25", {"compression": "topk", "topk-ratio": 0.25}),
    "qsgd4": ("4-bit qsgd (model scope, 17 levels, 6 bits/coord)",
              {"compression": "qsgd", "qsgd-scope": "model", "levels": 17}),
}
SPLITS: dict[str, tuple[str, dict[str, Any]]] = {
    "iid": ("IID", {"partition": "iid"}),
    "dir0.01": ("Dir(0.01)", {"partition": "dirichlet", "alpha": 0.01}),
    "path1": ("Path(1)", {"partition": "pathological", "classes-per-client": 1}),
}
# Paper Table I: top Hessian eigenvalue of FedAvg on Fashion-MNIST, 100 clients.
PAPER_TABLE1: dict[str, dict[str, float]] = {
    "iid": {"none": 7.56, "qsgd8": 8.36, "topk0.25": 8.50, "qsgd4": 8.82},
    "dir0.01": {"none": 17.04, "qsgd8": 17.78},
}
COMMON_KEYS: dict[str, Any] = {
    "dataset": "fashion-mnist", "model": "mlp", "local-steps": 10, "batch-size": 128, "lr": 0.05, "sam-rho": 0.05,
    "trajectory-rounds": 30, "synthetic-ipc": 20, "distill-iterations": 200, "eval-every": 10,
    "checkpoint-every": 0, "save-model": True,
}


def run_one(folder: Path, name: str, overrides: dict[str, Any], clients: int) -> dict[str, Any]:
    """One run in Flower's simulation engine; its final accuracy and the final model's top Hessian eigenvalue."""
    from common.metrics.sharpness import results_folder_sharpness
    from fedsynth.simulation import find_app_dir, run_simulation

    start = time.monotonic()
    run_dir = run_simulation(find_app_dir(), {**overrides, "results-dir": str(folder), "run-name": name}, clients, 1.0)
    summary = json.loads((run_dir / "summary.json").read_text())
    sharpness = results_folder_sharpness(run_dir, max_examples=10000, iterations=50, tol=1e-3)
    result = {"accuracy": summary.get("final-central-accuracy"), "eigenvalue": sharpness["top-hessian-eigenvalue"],
              "seconds": time.monotonic() - start, "folder": str(run_dir)}
    print(f"[sharpness] {name}: {json.dumps(result)}", flush=True)
    return result


def report(split: str, clients: int, rounds: int, results: dict[tuple[str, str], dict[str, Any]],
           algorithms: list[str], codecs: list[str]) -> str:
    """Markdown: final accuracy / lambda_max per algorithm and codec, the paper's FedAvg numbers beside."""
    paper = PAPER_TABLE1.get(split, {})
    lines = [f"# Sharpness under compression: Fashion-MNIST MLP, {SPLITS[split][0]}, {clients} clients, {rounds} rounds",
             "", "Cells: final central accuracy (%) / top Hessian eigenvalue of the final model's training loss. "
             "Paper: Table I (FedAvg, 100 clients).", "",
             "| method |" + "".join(f" {CODECS[c][0]} |" for c in codecs), "| --- |" + " ---: |" * len(codecs)]
    for algo in algorithms:
        cells = []
        for codec in codecs:
            r = results.get((algo, codec))
            cells.append(" - |" if r is None else f" {100 * (r['accuracy'] or 0):.2f} / {r['eigenvalue']:.2f} |")
        lines.append(f"| {algo} |" + "".join(cells))
    lines.append("| paper (FedAvg) |" + "".join(f" {paper[c]:.2f} |" if c in paper else " - |" for c in codecs))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=sorted(SPLITS), default="iid")
    parser.add_argument("--clients", type=int, default=100, help="simulated clients (the paper: 100)")
    parser.add_argument("--fraction-train", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--algorithms", default="fedavg")
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "fedsynsam-sharpness" / "sharpness.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

    algorithms = [a for a in args.algorithms.split(",") if a]
    codecs = [c for c in args.codecs.split(",") if c]
    unknown = sorted(set(codecs) - set(CODECS))
    if unknown:
        parser.error(f"unknown codecs {unknown}; known: {sorted(CODECS)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for algo in algorithms:
        for codec in codecs:
            overrides = {**COMMON_KEYS, **SPLITS[args.split][1], **CODECS[codec][1], "algorithm": algo,
                         "num-server-rounds": args.rounds, "fraction-train": args.fraction_train, "seed": args.seed,
                         "cache-dir": str(args.out.parent / "cache")}
            results[(algo, codec)] = run_one(args.out.parent, f"{args.split}-{codec}-{algo}", overrides, args.clients)
            args.out.write_text(report(args.split, args.clients, args.rounds, results, algorithms, codecs))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
