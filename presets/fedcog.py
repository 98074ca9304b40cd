"""Preset `fedcog`: the FedCOG paper's Tables 1, 3 and 5 (and Table 11's timing) at cpu or paper size.

    .venv/bin/python -m presets.fedcog --size cpu|paper [--out DIR] [--dataset fashion-mnist|cifar10]

For each split (NIID-1: Dirichlet(0.1); NIID-2: 2 classes per client), 10
clients, the simple CNN:

- each base X in fedavg, fedavgm, fedprox, scaffold, moon runs `base` rounds
  (the paper's 50) and stops with a checkpoint;
- from that checkpoint two continuations run `cog` more rounds (the paper's
  20): X, and X with FedCOG on (`cog = true`). **Table 1** compares their final
  accuracy, **Table 3** their accuracy after the first continued round (the
  paper's "one extra round of X vs X+FedCOG from the same checkpoint");
- from the FedAvg checkpoint, the three ablations of **Table 5** continue as well.

The continuations must start from the same server *and node* state (SCAFFOLD's
c_i, MOON's and FedCOG's previous local models live in each node's
`Context.state`), which Flower's simulation engine cannot fork. So the preset
runs the real ServerApp and ClientApp code in one process through the
in-process grid of `fedsynth/inprocess.py`, resumes each continuation from a copy
of the base's checkpoint file (`resume = true`), and hands every node a copy of
its state. It writes `fedcog.md` (tables, with the paper's numbers beside ours)
and `fedcog.png` (accuracy curves) into the output folder, one subfolder per run,
and `fedcog-generated.png` (the generated inputs of partition 0) in each
FedCOG run's folder.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASES = ("fedavg", "fedavgm", "fedprox", "scaffold", "moon")
BASE_NAMES = {"fedavg": "FedAvg", "fedavgm": "FedAvgM", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "moon": "MOON"}
SPLITS = {
    "niid1": {"partition": "dirichlet", "alpha": 0.1},
    "niid2": {"partition": "pathological", "classes-per-client": 2},
}
SPLIT_NAMES = {"niid1": "NIID-1 (Dir 0.1)", "niid2": "NIID-2 (2 classes/client)"}
ABLATIONS = {  # Table 5 rows: (1) Gaussian noise, (2) from the global model only, (3) hard labels, (4) full
    "noise": "(1) Gaussian noise, soft", "global-only": "(2) gen. from GM, soft",
    "hard-label": "(3) gen. from GM&LM, hard", "none": "(4) gen. from GM&LM, soft (full FedCOG)",
}
NUM_CLIENTS = 10

# The paper's numbers (accuracy %, global model on the test set).
PAPER_TABLE1 = {  # bases 70 rounds; FedCOG = 50 rounds of FedAvg + 20 of FedCOG
    "fashion-mnist": {
        "niid1": {"fedavg": 73.07, "fedavgm": 76.81, "fedprox": 73.35, "scaffold": 77.02, "moon": 73.21, "fedavg+cog": 77.34},
        "niid2": {"fedavg": 64.11, "fedavgm": 67.73, "fedprox": 64.44, "scaffold": 58.47, "moon": 63.11, "fedavg+cog": 73.68},
    },
    "cifar10": {
        "niid1": {"fedavg": 64.36, "fedavgm": 64.36, "fedprox": 63.91, "scaffold": 64.36, "moon": 63.65, "fedavg+cog": 64.83},
        "niid2": {"fedavg": 50.55, "fedavgm": 51.32, "fedprox": 53.51, "scaffold": 48.35, "moon": 51.01, "fedavg+cog": 54.00},
    },
}
PAPER_TABLE3 = {  # CIFAR-10 only: 50 rounds of X, then one round of X (A) or X+FedCOG (B)
    "niid1": {"fedavg": (63.34, 64.47), "fedavgm": (61.71, 64.63), "fedprox": (64.15, 64.87),
              "scaffold": (63.67, 65.36), "moon": (62.56, 63.24)},
    "niid2": {"fedavg": (49.30, 49.50), "fedavgm": (44.73, 45.14), "fedprox": (50.35, 50.89),
              "scaffold": (46.47, 51.26), "moon": (49.64, 50.72)},
}
PAPER_TABLE5 = {  # CIFAR-10
    "niid1": {"noise": 60.98, "global-only": 64.72, "hard-label": 63.59, "none": 64.88},
    "niid2": {"noise": 49.67, "global-only": 51.61, "hard-label": 51.64, "none": 53.20},
}
PAPER_TABLE11 = {16: 0.72, 32: 0.78, 64: 0.79, 128: 0.80, 256: 0.81, 512: 0.83, 1024: 1.27}  # seconds, GPU


@dataclass(frozen=True)
class Size:
    """How big the preset runs: rounds before and with FedCOG, and run-config keys."""

    base_rounds: int
    cog_rounds: int
    keys: dict[str, Any]
    timing_budgets: tuple[int, ...]


SIZES = {
    # about 15 minutes on 2 idle CPU cores: 8 + 3 rounds, 30 local steps, a shortened generation
    # (budget 64, 30 steps; the paper's Table 10 shows 50 steps doing as well as 100)
    "cpu": Size(8, 3, {"local-steps": 30, "batch-size": 32, "gen-budget": 64, "gen-steps": 30}, (64, 256)),
    # the paper's setup (section 6.1, appendix A.2): 50 + 20 rounds, 400 iterations, batch 64
    "paper": Size(50, 20, {"local-steps": 400, "batch-size": 64, "gen-budget": 256, "gen-steps": 100},
                  tuple(PAPER_TABLE11)),
}
# SGD lr 0.01 (momentum 0.9, weight decay 1e-5 as in the reference code); the FedCOG paper's baseline settings.
COMMON_KEYS = {
    "model": "cnn", "lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "server-momentum": 0.1,
    "proximal-mu": 0.01, "moon-mu": 0.01, "seed": 0, "save-model": False, "cog-grid-partition": 0,
}


@dataclass
class Finished:
    """A finished run: its config, its nodes (with their state) and its results."""

    raw: dict[str, Any]
    grid: Any
    folder: Path
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def accuracy(self, server_round: int | None = None) -> float:
        """Central test accuracy (%) after a round (default: the last evaluated)."""
        evaluated = [r for r in self.rounds if "central-accuracy" in r]
        if server_round is not None:
            evaluated = [r for r in evaluated if r["round"] == server_round]
        return 100.0 * evaluated[-1]["central-accuracy"]

    def mean_accuracy(self, last: int) -> float:
        """Mean central accuracy (%) over the last `last` evaluated rounds (NIID-2 accuracy oscillates)."""
        evaluated = [r for r in self.rounds if "central-accuracy" in r][-last:]
        return 100.0 * sum(r["central-accuracy"] for r in evaluated) / len(evaluated)


def run(raw: dict[str, Any], grid: Any) -> Finished:
    """One federation on the in-process grid, exactly as the ServerApp's main runs it."""
    from common.config import parse_run_config
    from common.results import RunResults
    from server_app.handshake import handshake
    from server_app.registry import SERVER_STRATEGIES

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    strategy = SERVER_STRATEGIES[cfg.algorithm](cfg, handshake(grid, cfg))
    with RunResults(cfg) as results:
        strategy.run(grid, results)
    return Finished(raw, grid, results.path, list(results.rounds))


def start(raw: dict[str, Any]) -> Finished:
    """A run from round 1 with fresh nodes."""
    from fedsynth.inprocess import InProcessGrid

    return run(raw, InProcessGrid(NUM_CLIENTS, raw))


def fork(base: Finished, name: str, total_rounds: int, **overrides: Any) -> Finished:
    """Continue `base` from its checkpoint to `total_rounds` under another name and config.

    The new run resumes from a copy of the base's checkpoint, and each node
    starts with a copy of the state it had at the end of the base run.
    """
    from flwr.app import Context

    from common.config import parse_run_config
    from fedsynth.inprocess import InProcessGrid
    from server_app.checkpoint import fork_checkpoint
    from server_app.registry import SERVER_STRATEGIES

    raw = {**base.raw, **overrides, "run-name": name, "resume": True, "num-server-rounds": total_rounds,
           "eval-every": 1, "checkpoint-every": 0}
    folder = Path(raw["results-dir"]) / name
    folder.mkdir(parents=True, exist_ok=True)
    fork_checkpoint(base.folder, folder, parse_run_config(raw, SERVER_STRATEGIES))
    grid = InProcessGrid(NUM_CLIENTS, raw)
    for node_id, context in grid.contexts.items():
        grid.contexts[node_id] = Context(
            run_id=context.run_id, node_id=node_id, node_config=dict(context.node_config),
            state=copy.deepcopy(base.grid.contexts[node_id].state), run_config=dict(raw),
        )
    return run(raw, grid)


def generation_timing(warm: Finished, budgets: tuple[int, ...], steps: int = 100) -> dict[int, float]:
    """Seconds of one client's generation (paper Table 11: 100 steps) for several budgets.

    Uses the warm-up's final global model and partition 0's previous local model and label counts.
    """
    import numpy as np
    import torch

    from client_app.fedcog import STATE_PREVIOUS_MODEL, frozen_copy, generate
    from common.config import parse_run_config
    from common.datasets import run_dataset_info
    from common.evaluation import resolve_device
    from common.fedcog_math import complementary_labels
    from common.partition import PartitionSpec, load_client_data
    from common.records import from_record, load_weights
    from common.task import make_model
    from server_app.checkpoint import CHECKPOINT_FILE
    from server_app.registry import SERVER_STRATEGIES

    cfg = parse_run_config(warm.raw, SERVER_STRATEGIES)
    device = resolve_device(cfg.device)
    from safetensors.numpy import load_file

    stored = load_file(str(warm.folder / CHECKPOINT_FILE))
    model = make_model(cfg)
    load_weights(model, {k[len("model/"):]: v for k, v in stored.items() if k.startswith("model/")})
    model.to(device)
    context = warm.grid.contexts[min(warm.grid.contexts)]
    local = frozen_copy(model, from_record(context.state.array_records[STATE_PREVIOUS_MODEL]))
    spec = PartitionSpec(dataset=cfg.dataset, partition=cfg.partition, num_partitions=NUM_CLIENTS, seed=cfg.seed,
                         alpha=cfg.alpha, classes_per_client=cfg.classes_per_client,
                         local_test_fraction=cfg.local_test_fraction)
    data = load_client_data(spec, 0, cfg.data_dir, cfg.cache_dir)
    counts = data.label_counts(run_dataset_info(cfg).num_classes)
    shape = run_dataset_info(cfg).shape
    seconds = {}
    for budget in budgets:
        targets = torch.from_numpy(np.asarray(complementary_labels(counts, budget))).to(device)
        generate(frozen_copy(model), local, targets[:8], shape, 2, cfg.gen_lr, cfg.lambda_dis, 0)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        result = generate(frozen_copy(model), local, targets, shape, steps, cfg.gen_lr, cfg.lambda_dis, 0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds[budget] = result.seconds
    return seconds


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def run_name(key: str) -> str:
    """The folder of a run in a split's folder (`fedavg+cog:noise` -> `fedavg+cog-noise`)."""
    return key.replace(":", "-")


def load_runs(out: Path) -> dict[tuple[str, str], Finished]:
    """The finished runs of an earlier preset run, from their metrics.jsonl files."""
    from common.results import read_metrics

    keys = [k for base in BASES for k in (base, f"{base}+cog")] + [f"fedavg+cog:{a}" for a in ABLATIONS if a != "none"]
    return {(split, key): Finished({}, None, out / split / run_name(key), read_metrics(out / split / run_name(key) / "metrics.jsonl"))
            for split in SPLITS for key in keys}


def write_report(out: Path, size_name: str, size: Size, dataset: str, runs: dict[tuple[str, str], Finished],
                 timing: dict[int, float], elapsed: float | None) -> str:
    """fedcog.md: Tables 1, 3, 5 and the generation times, paper numbers beside ours."""
    first = size.base_rounds + 1
    total = size.base_rounds + size.cog_rounds
    paper1 = PAPER_TABLE1.get(dataset, {})
    lines = [
        f"# FedCOG preset, size `{size_name}`, {dataset}, {NUM_CLIENTS} clients, simple CNN",
        "",
        f"{size.base_rounds} rounds of each base, then {size.cog_rounds} rounds of the base with and without FedCOG "
        f"from the same checkpoint (paper: 50 + 20). Run-config keys: "
        + ", ".join(f"`{k}={v}`" for k, v in {**COMMON_KEYS, **size.keys}.items())
        + f". Accuracy: global model on the official test split, %. Wall time {_fmt(elapsed and elapsed / 60, 1)} min.",
        "",
        f"## Table 1: final accuracy after {total} rounds (paper: Fashion-MNIST/CIFAR-10 after 70 rounds)",
        "",
        f"\"last {size.cog_rounds}\": mean over the last {size.cog_rounds} rounds, because one round's accuracy "
        "swings by up to 20 points under NIID-2 here.",
        "",
        "| method | " + " | ".join(f"{SPLIT_NAMES[s]} ours | last {size.cog_rounds} | paper" for s in SPLITS) + " |",
        "| --- | " + " | ".join("--- | --- | ---" for _ in SPLITS) + " |",
    ]
    for base in BASES:
        for cog in (False, True):
            key = f"{base}+cog" if cog else base
            name = BASE_NAMES[base] + (" + FedCOG" if cog else "")
            cells = []
            for split in SPLITS:
                ours, mean = runs[(split, key)].accuracy(), runs[(split, key)].mean_accuracy(size.cog_rounds)
                cells.append(f"{ours:.2f} | {mean:.2f} | {_fmt(paper1.get(split, {}).get(key))}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    margin2 = runs[("niid2", "fedavg+cog")].accuracy() - runs[("niid2", "fedavg")].accuracy()
    margin1 = runs[("niid1", "fedavg+cog")].accuracy() - runs[("niid1", "fedavg")].accuracy()
    mean_margin2 = (runs[("niid2", "fedavg+cog")].mean_accuracy(size.cog_rounds)
                    - runs[("niid2", "fedavg")].mean_accuracy(size.cog_rounds))
    lines += [
        "",
        f"FedAvg+FedCOG minus FedAvg, final accuracy: NIID-1 {margin1:+.2f} points, NIID-2 {margin2:+.2f} points "
        f"(last {size.cog_rounds} rounds' mean, NIID-2: {mean_margin2:+.2f}; paper, Fashion-MNIST: "
        f"{77.34 - 73.07:+.2f} and {73.68 - 64.11:+.2f}).",
        "",
        f"## Table 3: one extra round from the same checkpoint (accuracy after round {first}; paper: CIFAR-10 after round 51)",
        "",
        "| base | " + " | ".join(f"{SPLIT_NAMES[s]}: X | X+FedCOG | gain | paper X | paper X+FedCOG" for s in SPLITS) + " |",
        "| --- | " + " | ".join("--- | --- | --- | --- | ---" for _ in SPLITS) + " |",
    ]
    for base in BASES:
        cells = []
        for split in SPLITS:
            a, b = runs[(split, base)].accuracy(first), runs[(split, f"{base}+cog")].accuracy(first)
            pa, pb = PAPER_TABLE3[split][base]
            cells.append(f"{a:.2f} | {b:.2f} | {b - a:+.2f} | {pa:.2f} | {pb:.2f}")
        lines.append(f"| {BASE_NAMES[base]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## Table 5: ablations of FedAvg+FedCOG, accuracy after {total} rounds (paper: CIFAR-10)",
        "",
        "| variant | " + " | ".join(f"{SPLIT_NAMES[s]} ours | last {size.cog_rounds} | paper" for s in SPLITS) + " |",
        "| --- | " + " | ".join("--- | --- | ---" for _ in SPLITS) + " |",
    ]
    for ablation, label in ABLATIONS.items():
        key = "fedavg+cog" if ablation == "none" else f"fedavg+cog:{ablation}"
        cells = [f"{runs[(s, key)].accuracy():.2f} | {runs[(s, key)].mean_accuracy(size.cog_rounds):.2f} | "
                 f"{PAPER_TABLE5[s][ablation]:.2f}" for s in SPLITS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Generation time per client per round (paper Table 11: GPU, 100 steps)",
        "",
        f"In the FedCOG rounds above (budget {size.keys['gen-budget']}, {size.keys['gen-steps']} steps), "
        "mean / max over clients and rounds, seconds:",
        "",
        "| run | mean | max |",
        "| --- | --- | --- |",
    ]
    for split in SPLITS:
        cog_rounds = [r for r in runs[(split, "fedavg+cog")].rounds if "stat-cog-gen-seconds" in r]
        mean = sum(r["stat-cog-gen-seconds"] for r in cog_rounds) / max(len(cog_rounds), 1)
        worst = max((r["stat-cog-gen-seconds-max"] for r in cog_rounds), default=None)
        lines.append(f"| FedAvg+FedCOG, {SPLIT_NAMES[split]} | {mean:.3f} | {_fmt(worst, 3)} |")
    lines += [
        "",
        "At the paper's 100 steps, partition 0 of NIID-2, this machine:",
        "",
        "| generated samples | ours (s) | paper (s) |",
        "| --- | --- | --- |",
    ]
    for budget, seconds in timing.items():
        lines.append(f"| {budget} | {seconds:.2f} | {_fmt(PAPER_TABLE11.get(budget))} |")
    text = "\n".join(lines) + "\n"
    (out / "fedcog.md").write_text(text)
    return text


def plot(out: Path, size: Size, runs: dict[tuple[str, str], Finished]) -> Path:
    """fedcog.png: central accuracy per round, X solid and X+FedCOG dashed, one panel per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SPLITS), figsize=(12, 4.5), sharey=False)
    for ax, split in zip(axes, SPLITS):
        for index, base in enumerate(BASES):
            color = f"C{index}"
            for cog, style in ((False, "-"), (True, "--")):
                finished = runs[(split, f"{base}+cog" if cog else base)]
                evaluated = [r for r in finished.rounds if "central-accuracy" in r]
                ax.plot([r["round"] for r in evaluated], [100 * r["central-accuracy"] for r in evaluated], style,
                        color=color, label=BASE_NAMES[base] + (" + FedCOG" if cog else ""), marker=".")
        ax.axvline(size.base_rounds + 0.5, color="grey", lw=0.8)
        ax.set(title=SPLIT_NAMES[split], xlabel="round", ylabel="central test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out / "fedcog.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m presets.fedcog", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default results/presets/fedcog-<size>)")
    parser.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "cifar10"))
    parser.add_argument("--data-dir", default="", help="torchvision root (Fashion-MNIST: found automatically)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild fedcog.md and fedcog.png from the runs already in the output folder")
    args = parser.parse_args(argv)

    import torch

    from common.results import results_root

    if args.size == "cpu":
        torch.set_num_threads(1)
    size = SIZES[args.size]
    out = (args.out or results_root("results") / "presets" / f"fedcog-{args.size}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    total = size.base_rounds + size.cog_rounds
    if args.report_only:
        saved = json.loads((out / "fedcog.json").read_text())
        runs = load_runs(out)
        timing = {int(k): v for k, v in saved["generation-seconds"].items()}
        print(write_report(out, args.size, size, args.dataset, runs, timing, saved.get("wall-seconds")))
        plot(out, size, runs)
        return 0
    started = time.monotonic()
    runs: dict[tuple[str, str], Finished] = {}
    timing: dict[int, float] = {}
    for split, split_keys in SPLITS.items():
        folder = out / split
        for base in BASES:
            raw = {**COMMON_KEYS, **size.keys, **split_keys, "algorithm": base, "dataset": args.dataset,
                   "data-dir": args.data_dir, "results-dir": str(folder), "run-name": f"{base}-first-{size.base_rounds}",
                   "num-server-rounds": size.base_rounds, "checkpoint-every": size.base_rounds,
                   "eval-every": max(1, size.base_rounds // 5),
                   # FedCOG on but starting after this run: the rounds are exactly X's, and each
                   # node keeps its local model for the first FedCOG round's disagreement term
                   "cog": True, "cog-start-round": size.base_rounds + 1}
            warm = start(raw)
            print(f"[fedcog preset] {split} {base}: {size.base_rounds} rounds, accuracy {warm.accuracy():.2f} "
                  f"({(time.monotonic() - started) / 60:.1f} min)", flush=True)
            runs[(split, base)] = fork(warm, base, total, cog=False)
            runs[(split, f"{base}+cog")] = fork(warm, f"{base}+cog", total, cog=True)
            if base == "fedavg":
                for ablation in ABLATIONS:
                    if ablation != "none":
                        key = f"fedavg+cog:{ablation}"
                        runs[(split, key)] = fork(warm, run_name(key), total, cog=True, **{"cog-ablation": ablation})
                if split == "niid2":
                    timing = generation_timing(warm, size.timing_budgets)
            print(f"[fedcog preset] {split} {base}: {base} {runs[(split, base)].accuracy():.2f}, "
                  f"{base}+cog {runs[(split, f'{base}+cog')].accuracy():.2f} "
                  f"({(time.monotonic() - started) / 60:.1f} min)", flush=True)
    elapsed = time.monotonic() - started
    text = write_report(out, args.size, size, args.dataset, runs, timing, elapsed)
    plot(out, size, runs)
    summary = {f"{split}/{name}": finished.accuracy() for (split, name), finished in runs.items()}
    (out / "fedcog.json").write_text(json.dumps(
        {"size": args.size, "accuracy": summary, "generation-seconds": timing, "wall-seconds": elapsed}, indent=2) + "\n")
    print(text)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
