"""Preset `fedddpm`: the FedDDPM paper's Table I (MNIST FID) and Figure 4 (sample grids), cpu or paper size.

    .venv/bin/python -m presets.fedddpm --size cpu|paper [--out DIR] [--algorithms a,b] [--splits shard,dir0.1]
                                        [--fractions 0.3] [--data-dir DIR] [--fid-features classifier|inception]
                                        [--seed N]

Every run goes through Flower's simulation engine (`fedsynth.cli.run_simulation`,
the same app as `flwr run .`), one algorithm after the other on the same split
and seed. The preset writes into the output folder (default
`results/presets/fedddpm-<size>/`):

- `fedddpm.md`: per split and participation p, each algorithm's final and best
  FID next to the paper's Table I number, the round FedDDPM+ stopped at, the
  size of the auxiliary set and the wall time; every FID is labelled with its
  feature extractor and sampler, which set its scale: the paper's numbers are
  Inception FIDs of MNIST with the ancestral sampler, ours at cpu size are
  FIDs of a small Fashion-MNIST classifier's features with DDIM, so compare
  the ordering, not the values;
- `fedddpm.png`: FID against rounds, one panel per (split, p);
- `fedddpm-samples.png`: the final sample grid of every algorithm (Figure 4),
  and `auxiliary.png` in each FedDDPM run's folder;
- one subfolder per (split, p) with one run folder per algorithm.

Sizes:
- `paper` (GPU hosts): MNIST, N = 100, p in {0.15, 0.3}, shard / Dirichlet 0.1 /
  Dirichlet 0.3, T = 400 rounds, K = 3 local epochs, batch 128, Adam 2e-4,
  `unet-paper-mnist` (T = 500 steps), warmup 200 epochs, |A_i| = 0.1 m_i,
  E = 1 (FedDDPM) / 20 (FedDDPM+), server lr 5e-5, QuickTest every 10 rounds on
  500 samples (gamma 0.4, threshold 0.2), ancestral sampling, Inception FID.
- `cpu` (2 CPU cores; fedavg, fedddpm and fedddpm+ in well under 45 minutes):
  Fashion-MNIST (the machines here have no MNIST) at 8x8 — at 16x16 neither
  the warm local models nor the global model learn recognisable images within
  this budget, so the auxiliary set would be noise — N = 10, p = 0.3, shard
  split, `unet-small`, 30 rounds of 20 local steps, Adam 2e-3 (server 5e-4,
  the paper's 1:4 ratio), warmup 400 steps, |A_i| = 0.02 m_i, E = 1 / 20,
  DDIM-50 sampling for everything (labelled), classifier FID on 500 samples
  every 10 rounds. QuickTest's threshold is scaled to the classifier FID
  (5.0; the paper's 0.2 is in Inception-FID units).
  `--algorithms fedavg,fedprox,scaffold,mofedsam,fedddpm,fedddpm+` adds the
  other baselines (a few minutes each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "mofedsam": "MoFedSAM",
         "fedddpm": "FedDDPM", "fedddpm+": "FedDDPM+"}
SPLITS = {
    "shard": {"partition": "shard"},
    "dir0.1": {"partition": "dirichlet", "alpha": 0.1},
    "dir0.3": {"partition": "dirichlet", "alpha": 0.3},
}
SPLIT_NAMES = {"shard": "Shard", "dir0.1": "Dirichlet 0.1", "dir0.3": "Dirichlet 0.3"}

# Table I: FID (Inception features, MNIST, 100 clients) by (split, p).
PAPER_TABLE1 = {
    "fedavg":   {("shard", 0.15): 5.822, ("dir0.1", 0.15): 4.448, ("dir0.3", 0.15): 2.786,
                 ("shard", 0.3): 4.868, ("dir0.1", 0.3): 2.842, ("dir0.3", 0.3): 2.377},
    "fedprox":  {("shard", 0.15): 5.714, ("dir0.1", 0.15): 4.331, ("dir0.3", 0.15): 2.981,
                 ("shard", 0.3): 4.651, ("dir0.1", 0.3): 2.893, ("dir0.3", 0.3): 2.343},
    "scaffold": {("shard", 0.15): 4.889, ("dir0.1", 0.15): 3.876, ("dir0.3", 0.15): 2.584,
                 ("shard", 0.3): 4.237, ("dir0.1", 0.3): 2.421, ("dir0.3", 0.3): 2.150},
    "mofedsam": {("shard", 0.15): 4.840, ("dir0.1", 0.15): 2.797, ("dir0.3", 0.15): 2.358,
                 ("shard", 0.3): 4.324, ("dir0.1", 0.3): 2.983, ("dir0.3", 0.3): 1.903},
    "fedddpm":  {("shard", 0.15): 1.910, ("dir0.1", 0.15): 2.151, ("dir0.3", 0.15): 1.997,
                 ("shard", 0.3): 1.842, ("dir0.1", 0.3): 1.662, ("dir0.3", 0.3): 1.768},
    "fedddpm+": {("shard", 0.15): 2.188, ("dir0.1", 0.15): 2.037, ("dir0.3", 0.15): 1.876,
                 ("shard", 0.3): 1.865, ("dir0.1", 0.3): 1.791, ("dir0.3", 0.3): 1.762},
}
# The rounds at which FedDDPM+ stopped in the paper (MNIST), same order as Table I's columns.
PAPER_STOPS = {("shard", 0.15): 160, ("dir0.1", 0.15): 150, ("dir0.3", 0.15): 170,
               ("shard", 0.3): 130, ("dir0.1", 0.3): 130, ("dir0.3", 0.3): 120}


@dataclass(frozen=True)
class Size:
    """What one size runs: clients, splits, participation, algorithms and run-config keys."""

    num_clients: int
    splits: tuple[str, ...]
    fractions: tuple[float, ...]
    algorithms: tuple[str, ...]
    keys: dict[str, Any] = field(default_factory=dict)


SIZES = {
    "cpu": Size(10, ("shard",), (0.3,), ("fedavg", "fedddpm", "fedddpm+"), {
        "dataset": "fashion-mnist", "model": "unet-small", "image-size": 8, "local-test-fraction": 0.0,
        "num-server-rounds": 30, "local-steps": 20, "batch-size": 64, "lr": 2e-3,
        "warmup-steps": 400, "aux-fraction": 0.02, "correction-epochs": 1, "correction-lr": 5e-4,
        "oneshot-epochs": 20, "quicktest-every": 10, "quicktest-size": 500, "quicktest-threshold": 5.0,
        "sampler": "ddim", "ddim-steps": 50, "fid-samples": 500, "fid-every": 10, "fid-features": "classifier",
    }),
    "paper": Size(100, ("shard", "dir0.1", "dir0.3"), (0.15, 0.3), tuple(NAMES), {
        "dataset": "mnist", "model": "unet-paper-mnist", "local-test-fraction": 0.0,
        "num-server-rounds": 400, "local-epochs": 3, "batch-size": 128, "lr": 2e-4,
        "warmup-epochs": 200, "aux-fraction": 0.1, "correction-epochs": 1, "correction-lr": 5e-5,
        "oneshot-epochs": 20, "quicktest-every": 10, "quicktest-size": 500, "quicktest-threshold": 0.2,
        "sampler": "ddpm", "fid-samples": 10000, "fid-every": 10, "fid-features": "inception",
    }),
}
# Shared by every run: FedDDPM's uniform mean, the paper's Adam (the seed is --seed).
COMMON_KEYS = {"aggregation": "uniform", "local-optimizer": "adam", "checkpoint-every": 0,
               "proximal-mu": 0.01, "mofedsam-alpha": 0.1, "sam-rho": 0.05}


def run_one(app_dir: Path, folder: Path, name: str, overrides: dict[str, Any], num_clients: int,
            gpus_per_client: float) -> dict[str, Any]:
    """One run in Flower's simulation engine; returns its summary and rounds."""
    from fedsynth.cli import run_simulation
    from common.results import read_metrics

    start = time.monotonic()
    run_dir = run_simulation(app_dir, {**overrides, "results-dir": str(folder), "run-name": name}, num_clients, 1.0,
                             gpus_per_client)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["preset-wall-time"] = time.monotonic() - start
    print(f"[preset fedddpm] {folder.name}/{name}: final FID {summary.get('final-fid', float('nan')):.3f} "
          f"({summary.get('sampler')}), {summary['preset-wall-time']:.0f}s", flush=True)
    return {"summary": summary, "rounds": read_metrics(run_dir / "metrics.jsonl"), "folder": str(run_dir)}


def _fmt(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def table(size: str, runs: dict[tuple[str, float, str], dict[str, Any]], configs: list[tuple[str, float]],
          algorithms: list[str]) -> str:
    """The markdown report: one table per (split, p), ours beside the paper's."""
    lines = [f"# FedDDPM preset, size `{size}`", ""]
    any_run = next(iter(runs.values()), None)
    if any_run is not None:
        summary = any_run["summary"]
        lines += [
            f"FID feature extractor: **{summary.get('fid-features', '-')}**; sampler: **{summary.get('sampler', '-')}**; "
            f"{summary.get('fid-samples', '-')} samples per FID against the real training split. "
            "The paper's numbers are Inception-FIDs on MNIST (100 clients) with the ancestral sampler: compare "
            "orderings, not values.", "",
        ]
    for split, fraction in configs:
        lines += [f"## {SPLIT_NAMES[split]}, p = {fraction}", "",
                  "| algorithm | final FID (ours) | best FID (ours) | paper Table I | stopped at round (ours / paper) "
                  "| aux set | wall time s |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for algorithm in algorithms:
            run = runs.get((split, fraction, algorithm))
            paper = PAPER_TABLE1[algorithm].get((split, fraction))
            if run is None:
                lines.append(f"| {NAMES[algorithm]} | not run | - | {_fmt(paper)} | - | - | - |")
                continue
            s = run["summary"]
            stop = "-"
            if algorithm == "fedddpm+":
                stop = f"{s.get('stopped-at-round', '-')} ({s.get('stop-reason', '')}) / {PAPER_STOPS.get((split, fraction), '-')}"
            lines.append(
                f"| {NAMES[algorithm]} | {_fmt(s.get('final-fid'))} | {_fmt(s.get('best-fid'))} | {_fmt(paper)} | {stop} "
                f"| {s.get('aux-size', '-')} | {_fmt(s.get('preset-wall-time'), 0)} |"
            )
        ours = {a: runs[(split, fraction, a)]["summary"].get("final-fid") for a in algorithms
                if (split, fraction, a) in runs}
        if "fedavg" in ours and "fedddpm" in ours and None not in (ours["fedavg"], ours["fedddpm"]):
            verdict = "lower" if ours["fedddpm"] < ours["fedavg"] else "NOT lower"
            lines += ["", f"FedDDPM's final FID is {verdict} than FedAvg's at the same rounds "
                          f"({ours['fedddpm']:.3f} vs {ours['fedavg']:.3f}); the paper: "
                          f"{_fmt(PAPER_TABLE1['fedddpm'].get((split, fraction)))} vs "
                          f"{_fmt(PAPER_TABLE1['fedavg'].get((split, fraction)))}."]
        aux = [runs[(split, fraction, a)]["rounds"][0].get("aux-fid") for a in ("fedddpm", "fedddpm+")
               if (split, fraction, a) in runs and runs[(split, fraction, a)]["rounds"]]
        if aux and isinstance(aux[0], (int, float)):
            lines += ["", f"FID of the auxiliary set itself (Table IV's reference row): {aux[0]:.3f}."]
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(out: Path, runs: dict[tuple[str, float, str], dict[str, Any]], configs: list[tuple[str, float]],
         algorithms: list[str]) -> None:
    """fedddpm.png (FID curves per split) and fedddpm-samples.png (final grids of the first split)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4), squeeze=False)
    for ax, (split, fraction) in zip(axes[0], configs):
        for algorithm in algorithms:
            run = runs.get((split, fraction, algorithm))
            if run is None:
                continue
            points = [(r["round"], r["fid"]) for r in run["rounds"] if isinstance(r.get("fid"), (int, float))]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=NAMES[algorithm])
        ax.set(xlabel="round", ylabel="FID (lower is better)", title=f"{SPLIT_NAMES[split]}, p = {fraction}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fedddpm.png", dpi=100)
    plt.close(fig)

    split, fraction = configs[0]
    grids = [(NAMES[a], Path(runs[(split, fraction, a)]["folder"]) / "samples-final.png") for a in algorithms
             if (split, fraction, a) in runs]
    grids = [(name, path) for name, path in grids if path.is_file()]
    if not grids:
        return
    fig, axes = plt.subplots(1, len(grids), figsize=(3.2 * len(grids), 3.6), squeeze=False)
    for ax, (name, path) in zip(axes[0], grids):
        ax.imshow(Image.open(path), cmap="gray")
        ax.set_title(name)
        ax.axis("off")
    fig.suptitle(f"Final samples, {SPLIT_NAMES[split]}, p = {fraction}")
    fig.tight_layout()
    fig.savefig(out / "fedddpm-samples.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m presets.fedddpm", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default results/presets/fedddpm-<size>)")
    parser.add_argument("--algorithms", default="", help=f"comma-separated, from {', '.join(NAMES)}")
    parser.add_argument("--splits", default="", help=f"comma-separated, from {', '.join(SPLITS)}")
    parser.add_argument("--fractions", default="", help="comma-separated participation fractions p")
    parser.add_argument("--rounds", type=int, default=0, help="override num-server-rounds (quick checks)")
    parser.add_argument("--data-dir", default="", help="torchvision root (MNIST for the paper size)")
    parser.add_argument("--fid-features", default="", help="override the size's FID extractor")
    parser.add_argument("--gpus-per-client", type=float, default=0.0, help="GPUs reserved per ClientApp (GPU hosts)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (split, models, sampling)")
    args = parser.parse_args(argv)

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    import torch

    torch.set_num_threads(1)  # the server's sampling and correction share the cores with the ClientApps
    from fedsynth.cli import find_app_dir
    from common.results import results_root

    size = SIZES[args.size]
    algorithms = [a for a in (args.algorithms.split(",") if args.algorithms else size.algorithms) if a]
    unknown = [a for a in algorithms if a not in NAMES]
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; choose from {', '.join(NAMES)}")
    splits = args.splits.split(",") if args.splits else list(size.splits)
    fractions = [float(f) for f in args.fractions.split(",")] if args.fractions else list(size.fractions)
    configs = [(split, fraction) for split in splits for fraction in fractions]
    app_dir = find_app_dir()
    out = args.out or results_root("results") / "presets" / f"fedddpm-{args.size}"
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, float, str], dict[str, Any]] = {}
    start = time.monotonic()
    for split, fraction in configs:
        folder = out / f"{split}-p{fraction}"
        for algorithm in algorithms:
            overrides = {
                **COMMON_KEYS, **size.keys, **SPLITS[split], "algorithm": algorithm, "fraction-train": fraction,
                "data-dir": args.data_dir, "cache-dir": str(out / "cache"), "seed": args.seed,
            }
            if args.rounds:
                overrides["num-server-rounds"] = args.rounds
            if args.fid_features:
                overrides["fid-features"] = args.fid_features
            runs[(split, fraction, algorithm)] = run_one(app_dir, folder, algorithm, overrides, size.num_clients,
                                                         args.gpus_per_client)
            (out / "fedddpm.md").write_text(table(args.size, runs, configs, algorithms))
    report = table(args.size, runs, configs, algorithms)
    report += f"\nSeed {args.seed}. Total wall time: {time.monotonic() - start:.0f} s.\n"
    (out / "fedddpm.md").write_text(report)
    plot(out, runs, configs, algorithms)
    print(report)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
