"""Preset `fedsynsam`: the FedSynSAM paper's Table II (accuracy under compression) and Table I (sharpness).

    .venv/bin/python -m presets.fedsynsam --size cpu|paper [--out DIR] [--data-dir DIR]

Every algorithm runs on the same split and seed, once per uplink codec, each
run in Flower's simulation engine (`fedsynth.cli.run_simulation`, the same app as
`flwr run .`). The preset writes into the output folder, one subfolder per run:

- `fedsynsam.md`: per codec, final central accuracy and total uplink bytes
  (measured from the records sent, beside the float32 size they replace) of
  every algorithm, the paper's Table II number beside ours; the top Hessian
  eigenvalue of each final model (Table I's sharpness, `common.sharpness`); the
  distillation's matching loss before/after; and the perturbation diagnostic
  (paper Figure 2: cosine of each method's ascent direction with the true
  gradient of the sampled clients' data), logged in the FedSynSAM runs;
- `fedsynsam.png`: central accuracy per round, one panel per codec.

Sizes: `cpu` is Fashion-MNIST with the two-layer MLP, 10 clients, full
participation, Path(1), K = 10 local steps of batch 128, 4-bit qsgd and top-k
0.1, fewer rounds than the paper (the paper's R = 30 and M = 200 are kept), and
finishes in under 30 minutes on 2 idle CPU cores. `paper` is the paper's
setup for GPU hosts: Fashion-MNIST 300 rounds and CIFAR-10 ConvNet 1000 rounds;
Path(1) and Dir(0.01) with 10 clients in full participation, and Dir(0.01) with
50 clients at 20 %; 4/8-bit qsgd and top-k 0.1/0.25; all nine methods.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = {
    "fedavg": "FedAvg", "dynafed": "DynaFed", "fedsam": "FedSAM", "fedlesam": "FedLESAM", "fedsmoo": "FedSMOO",
    "fedgamma": "FedGAMMA",
    "fedlesam-d": "FedLESAM-D", "fedlesam-s": "FedLESAM-S", "fedsynsam": "FedSynSAM",
}
CODECS = {
    "qsgd4": ("4-bit qsgd", {"compression": "qsgd", "bits": 4}),
    "qsgd8": ("8-bit qsgd", {"compression": "qsgd", "bits": 8}),
    "topk0.1": ("top-k 0.1", {"compression": "topk", "topk-ratio": 0.1}),
    "topk0.25": ("top-k 0.25", {"compression": "topk", "topk-ratio": 0.25}),
    "none": ("no compression", {"compression": "none"}),  # Table I's reference; Table II has no column for it
}
SPLITS = {
    "path1-full": ("Path(1), 10 clients, full", {"partition": "pathological", "classes-per-client": 1}, 10, 1.0),
    "dir0.01-full": ("Dir(0.01), 10 clients, full", {"partition": "dirichlet", "alpha": 0.01}, 10, 1.0),
    "dir0.01-partial": ("Dir(0.01), 50 clients, 20 %", {"partition": "dirichlet", "alpha": 0.01}, 50, 0.2),
}

# Paper Table II (test accuracy %, mean of 3 runs), columns in CODECS order.
_T2 = {
    ("fashion-mnist", "path1-full"): {
        "fedsmoo": (78.99, 78.57, 82.01, 80.48), 
        "fedavg": (81.31, 81.19, 72.84, 77.90), "dynafed": (74.42, 74.38, 71.35, 73.15),
        "fedsam": (82.93, 82.88, 75.85, 80.40), "fedlesam": (82.47, 82.37, 74.81, 79.01),
        "fedgamma": (78.42, 80.78, 82.06, 81.98), "fedlesam-d": (68.22, 63.40, 65.27, 66.05),
        "fedlesam-s": (79.71, 77.61, 75.44, 77.43), "fedsynsam": (84.04, 83.93, 79.64, 82.91),
    },
    ("cifar10", "path1-full"): {
        "fedsmoo": (47.13, 48.85, 42.89, 42.66), 
        "fedavg": (68.55, 68.38, 57.50, 62.72), "dynafed": (52.77, 53.80, 46.51, 49.88),
        "fedsam": (70.40, 70.07, 57.78, 63.69), "fedlesam": (69.69, 69.70, 57.97, 63.49),
        "fedgamma": (65.18, 65.96, 49.58, 59.44), "fedlesam-d": (26.77, 28.30, 27.70, 27.42),
        "fedlesam-s": (63.31, 62.37, 57.02, 61.03), "fedsynsam": (71.56, 71.70, 63.60, 68.05),
    },
    ("fashion-mnist", "dir0.01-full"): {
        "fedsmoo": (83.03, 83.32, 81.84, 83.41), 
        "fedavg": (83.20, 83.40, 81.00, 82.33), "dynafed": (74.02, 74.65, 73.98, 74.65),
        "fedsam": (83.65, 83.63, 81.28, 82.61), "fedlesam": (83.65, 83.56, 81.24, 82.52),
        "fedgamma": (83.34, 83.07, 79.85, 81.78), "fedlesam-d": (79.63, 78.15, 79.46, 79.22),
        "fedlesam-s": (81.87, 82.63, 80.96, 81.74), "fedsynsam": (84.17, 84.21, 81.86, 83.38),
    },
    ("cifar10", "dir0.01-full"): {
        "fedsmoo": (70.09, 74.59, 64.84, 70.95), 
        "fedavg": (75.00, 74.91, 66.79, 71.51), "dynafed": (47.34, 47.45, 46.57, 46.56),
        "fedsam": (75.24, 75.32, 67.31, 71.88), "fedlesam": (74.95, 75.24, 67.03, 71.69),
        "fedgamma": (73.00, 73.59, 62.97, 70.54), "fedlesam-d": (65.48, 62.74, 63.13, 66.24),
        "fedlesam-s": (75.12, 75.00, 67.62, 71.75), "fedsynsam": (75.49, 75.51, 68.79, 72.66),
    },
    ("fashion-mnist", "dir0.01-partial"): {
        "fedsmoo": (82.95, 83.00, 81.86, 83.66), 
        "fedavg": (80.25, 80.24, 77.54, 79.75), "dynafed": (73.38, 72.18, 67.84, 70.94),
        "fedsam": (80.30, 80.31, 77.60, 79.83), "fedlesam": (80.33, 80.37, 77.64, 79.79),
        "fedgamma": (79.96, 80.34, 76.19, 78.81), "fedlesam-d": (80.44, 79.78, 80.83, 80.32),
        "fedlesam-s": (80.17, 81.09, 79.79, 80.08), "fedsynsam": (80.90, 80.89, 78.33, 80.52),
    },
    ("cifar10", "dir0.01-partial"): {
        "fedsmoo": (62.87, 64.02, 60.65, 63.45), 
        "fedavg": (71.32, 71.47, 67.11, 69.67), "dynafed": (52.78, 52.91, 51.39, 51.53),
        "fedsam": (71.61, 71.77, 67.21, 69.57), "fedlesam": (71.72, 71.67, 67.07, 69.71),
        "fedgamma": (67.27, 68.00, 63.06, 66.42), "fedlesam-d": (62.66, 64.31, 62.04, 63.91),
        "fedlesam-s": (71.00, 71.95, 67.19, 69.78), "fedsynsam": (72.74, 72.96, 70.53, 72.57),
    },
}
PAPER_TABLE2 = {key: {algo: dict(zip(CODECS, row)) for algo, row in table.items()} for key, table in _T2.items()}
# Paper Table I: top Hessian eigenvalue of FedAvg on Fashion-MNIST, 100 clients.
PAPER_TABLE1 = {"IID": {"none": 7.56, "qsgd8": 8.36, "topk0.25": 8.50, "qsgd4": 8.82},
                "Dir(0.01)": {"none": 17.04, "qsgd8": 17.78}}


@dataclass(frozen=True)
class Experiment:
    """One table: a dataset/model on a split, every algorithm under every codec."""

    dataset: str
    model: str
    split: str
    rounds: int
    codecs: tuple[str, ...]
    algorithms: tuple[str, ...]
    keys: dict[str, Any] = field(default_factory=dict)
    reference: tuple[str, ...] = ("fedavg",)  # also run without compression (Table I: sharpness with vs without)


# lr and rho: the paper tunes them in {0.01, 0.05, 0.1, 0.5} and {0.001, ..., 0.5}; these are our picks.
COMMON_KEYS = {"local-steps": 10, "batch-size": 128, "lr": 0.05, "sam-rho": 0.05, "seed": 0,
               "trajectory-rounds": 30, "synthetic-ipc": 20, "distill-iterations": 200, "eval-every": 5}
CPU_ALGORITHMS = ("fedavg", "fedsam", "fedlesam", "dynafed", "fedsynsam")
ALL_ALGORITHMS = tuple(NAMES)
SIZES: dict[str, list[Experiment]] = {
    "cpu": [Experiment("fashion-mnist", "mlp", "path1-full", 80, ("qsgd4", "topk0.1"), CPU_ALGORITHMS)],
    "paper": [
        Experiment(dataset, model, split, rounds, tuple(c for c in CODECS if c != "none"), ALL_ALGORITHMS)
        for dataset, model, rounds in (("fashion-mnist", "mlp", 300), ("cifar10", "convnet", 1000))
        for split in SPLITS
    ],
}
# The FedSynSAM runs log the perturbation diagnostic (Figure 2 is measured under 4-bit qsgd).
DIAGNOSTIC_CODECS = ("qsgd4",)


def run_one(app_dir: Path, folder: Path, name: str, overrides: dict[str, Any], num_clients: int,
            gpus_per_client: float = 0.0) -> dict[str, Any]:
    """One run in Flower's simulation engine; returns its summary, rounds and sharpness."""
    from fedsynth.cli import run_simulation
    from common.results import read_metrics
    from common.sharpness import results_folder_sharpness

    start = time.monotonic()
    run_dir = run_simulation(app_dir, {**overrides, "results-dir": str(folder), "run-name": name}, num_clients, 1.0,
                             gpus_per_client)
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = read_metrics(run_dir / "metrics.jsonl")
    sharpness = results_folder_sharpness(run_dir, max_examples=10000, iterations=50, tol=1e-3)
    print(f"[preset] {name}: accuracy {summary.get('final-central-accuracy', float('nan')):.4f}, "
          f"uplink {summary['uplink-bytes'] / 1e6:.1f} MB, eigenvalue {sharpness['top-hessian-eigenvalue']:.2f}, "
          f"{time.monotonic() - start:.0f}s", flush=True)
    return {"summary": summary, "rounds": rounds, "sharpness": sharpness, "folder": str(run_dir)}


def _mean_after(rounds: list[dict[str, Any]], key: str, after: int) -> float | None:
    values = [r[key] for r in rounds if r["round"] > after and isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def write_report(out: Path, size: str, experiments: list[Experiment], runs: dict[tuple, dict], elapsed: float,
                 seed: int) -> Path:
    """fedsynsam.md: the tables, the paper's numbers beside ours."""
    lines = [f"# FedSynSAM preset, size `{size}`", "",
             f"Seed {seed}; total wall time {elapsed / 60:.1f} min. Accuracy: final central test accuracy (%) of the global model. "
             "Uplink: MB sent by all clients over the run, measured from the records actually sent, "
             "with the float32 size they replace. lambda_max: top Hessian eigenvalue of the final model's training "
             "loss (10,000 training examples, power iteration to 1e-3). Paper: Table II, mean of 3 runs of 300 "
             "(Fashion-MNIST) / 1000 (CIFAR-10) rounds.", ""]
    for exp in experiments:
        split_name = SPLITS[exp.split][0]
        paper = PAPER_TABLE2.get((exp.dataset, exp.split), {})
        lines += [f"## {exp.dataset} / {exp.model} / {split_name}, {exp.rounds} rounds", ""]
        header = "| method |" + "".join(f" {CODECS[c][0]} ours | paper | uplink MB (float32 MB) | lambda_max |" for c in exp.codecs)
        lines += [header, "| --- |" + " ---: | ---: | ---: | ---: |" * len(exp.codecs)]
        for algo in exp.algorithms:
            cells = []
            for codec in exp.codecs:
                run = runs.get((exp.dataset, exp.split, codec, algo))
                if run is None:
                    cells.append(" - | - | - | - |")
                    continue
                s = run["summary"]
                cells.append(
                    f" {_fmt(s.get('final-central-accuracy'), 100)} | {_fmt(paper.get(algo, {}).get(codec))} | "
                    f"{_fmt(s['uplink-bytes'], 1e-6, 1)} ({_fmt(s['uplink-float32-bytes'], 1e-6, 1)}) | "
                    f"{_fmt(run['sharpness']['top-hessian-eigenvalue'])} |"
                )
            lines.append(f"| {NAMES[algo]} |" + "".join(cells))
        lines.append("")
        distilled = [(codec, algo, run["rounds"]) for (d, sp, codec, algo), run in runs.items()
                     if d == exp.dataset and sp == exp.split and algo in ("fedsynsam", "dynafed")]
        if distilled:
            lines += ["Trajectory distillation (normalised matching loss over all segments of w^0..w^R):", "",
                      "| run | loss before | loss after | learned alpha | seconds |", "| --- | ---: | ---: | ---: | ---: |"]
            for codec, algo, rounds in distilled:
                record = next((r for r in rounds if "distill-loss-start" in r), None)
                if record:
                    lines.append(f"| {NAMES[algo]}, {CODECS[codec][0]} | {record['distill-loss-start']:.4f} | "
                                 f"{record['distill-loss-end']:.4f} | {record['distill-alpha']:.5f} | "
                                 f"{record['distill-time']:.1f} |")
            lines.append("")
        diagnosed = [(codec, run["rounds"]) for (d, sp, codec, algo), run in runs.items()
                     if d == exp.dataset and sp == exp.split and algo == "fedsynsam" and codec in DIAGNOSTIC_CODECS]
        if diagnosed:
            r_after = COMMON_KEYS["trajectory-rounds"]
            lines += [f"Perturbation diagnostic (paper Fig. 2), FedSynSAM run: mean over rounds > R = {r_after} of the "
                      "cosine between each ascent direction and the full gradient on the sampled clients' data "
                      "(FedSAM's and FedSynSAM's averaged over clients):", "",
                      "| codec | FedSAM (local gradient) | FedLESAM (w^{t-1} - w^t) | FedSynSAM (beta-mix) | synthetic gradient alone |",
                      "| --- | ---: | ---: | ---: | ---: |"]
            for codec, rounds in diagnosed:
                means = [_mean_after(rounds, k, r_after) for k in ("cos-fedsam", "cos-fedlesam", "cos-fedsynsam", "cos-synthetic")]
                lines.append(f"| {CODECS[codec][0]} | " + " | ".join(_fmt(m, 1, 3) for m in means) + " |")
            lines.append("")
        references = [algo for algo in exp.reference if (exp.dataset, exp.split, "none", algo) in runs]
        if references:
            lines += ["Sharpness with and without compression (paper Table I): final accuracy (%) / lambda_max", "",
                      "| method |" + "".join(f" {CODECS[c][0]} |" for c in ("none", *exp.codecs)),
                      "| --- |" + " ---: |" * (1 + len(exp.codecs))]
            for algo in references:
                cells = []
                for codec in ("none", *exp.codecs):
                    run = runs.get((exp.dataset, exp.split, codec, algo))
                    cells.append(" - |" if run is None else
                                 f" {_fmt(run['summary'].get('final-central-accuracy'), 100)} / "
                                 f"{_fmt(run['sharpness']['top-hessian-eigenvalue'])} |")
                lines.append(f"| {NAMES[algo]} |" + "".join(cells))
            lines.append("")
    lines += ["Paper Table I (top Hessian eigenvalue, FedAvg, Fashion-MNIST, 100 clients): "
              + "; ".join(f"{split}: " + ", ".join(f"{k} {v}" for k, v in row.items()) for split, row in PAPER_TABLE1.items()), ""]
    path = out / "fedsynsam.md"
    path.write_text("\n".join(lines))
    return path


def write_plot(out: Path, experiments: list[Experiment], runs: dict[tuple, dict]) -> Path:
    """fedsynsam.png: central accuracy per round, one panel per (experiment, codec)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(exp, codec) for exp in experiments for codec in exp.codecs]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (exp, codec) in zip(axes[0], panels):
        for algo in exp.algorithms:
            run = runs.get((exp.dataset, exp.split, codec, algo))
            if run is None:
                continue
            points = [(r["round"], 100 * r["central-accuracy"]) for r in run["rounds"] if "central-accuracy" in r]
            ax.plot(*zip(*points), marker=".", label=NAMES[algo])
        for algo in exp.reference:
            run = runs.get((exp.dataset, exp.split, "none", algo))
            if run is not None:
                points = [(r["round"], 100 * r["central-accuracy"]) for r in run["rounds"] if "central-accuracy" in r]
                ax.plot(*zip(*points), linestyle="--", color="grey", label=f"{NAMES[algo]}, no compression")
        ax.set(title=f"{exp.dataset} {SPLITS[exp.split][0]}, {CODECS[codec][0]}", xlabel="round", ylabel="accuracy %")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out / "fedsynsam.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m presets.fedsynsam", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default results/presets/fedsynsam-<size>)")
    parser.add_argument("--data-dir", default="", help="torchvision root (Fashion-MNIST: found automatically)")
    parser.add_argument("--rounds", type=int, default=0, help="override every experiment's rounds (quick checks)")
    parser.add_argument("--algorithms", default="", help="comma-separated subset of the size's algorithms")
    parser.add_argument("--codecs", default="", help="comma-separated subset of the size's codecs")
    parser.add_argument("--gpus-per-client", type=float, default=0.0, help="GPUs reserved per ClientApp (GPU hosts)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (the paper averages 3 runs)")
    args = parser.parse_args(argv)

    import os

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    from fedsynth.cli import find_app_dir
    from common.results import results_root

    app_dir = find_app_dir()
    out = args.out or results_root("results") / "presets" / f"fedsynsam-{args.size}"
    out.mkdir(parents=True, exist_ok=True)
    experiments = SIZES[args.size]
    keep_algos = set(args.algorithms.split(",")) if args.algorithms else None
    keep_codecs = set(args.codecs.split(",")) if args.codecs else None
    experiments = [
        Experiment(e.dataset, e.model, e.split, args.rounds or e.rounds,
                   tuple(c for c in e.codecs if keep_codecs is None or c in keep_codecs),
                   tuple(a for a in e.algorithms if keep_algos is None or a in keep_algos), e.keys,
                   tuple(a for a in e.reference if keep_algos is None or a in keep_algos))
        for e in experiments
    ]
    start = time.monotonic()
    runs: dict[tuple, dict] = {}
    for exp in experiments:
        _, split_keys, num_clients, fraction = SPLITS[exp.split]
        plan = [(codec, algo) for codec in exp.codecs for algo in exp.algorithms]
        plan += [("none", algo) for algo in exp.reference]
        for codec, algo in plan:
            overrides = {
                **COMMON_KEYS, **split_keys, **CODECS[codec][1], **exp.keys, "seed": args.seed,
                "algorithm": algo, "dataset": exp.dataset, "model": exp.model, "num-server-rounds": exp.rounds,
                "fraction-train": fraction, "data-dir": args.data_dir, "cache-dir": str(out / "cache"),
                "perturbation-diagnostic": algo == "fedsynsam" and codec in DIAGNOSTIC_CODECS,
                "checkpoint-every": 0,
            }
            name = f"{exp.dataset}-{exp.split}-{codec}-{algo}"
            runs[(exp.dataset, exp.split, codec, algo)] = run_one(
                app_dir, out, name, overrides, num_clients, args.gpus_per_client)
            write_report(out, args.size, experiments, runs, time.monotonic() - start, args.seed)
    report = write_report(out, args.size, experiments, runs, time.monotonic() - start, args.seed)
    write_plot(out, experiments, runs)
    (out / "runs.json").write_text(json.dumps(
        {"|".join(key): {"summary": r["summary"], "sharpness": r["sharpness"]} for key, r in runs.items()}, indent=1))
    print(report.read_text())
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
