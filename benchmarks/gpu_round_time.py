"""Seconds per round of the paper-size CIFAR-10 studies on one GPU, on CIFAR-shaped stand-in data.

Why: `studies/oledfl-paper.toml` (CIFAR-10, ResNet-18-GN, 100 nodes, 500 rounds) and the CIFAR-10 ConvNet
rows of `studies/fedsynsam-paper.toml` (10 clients, K = 10, 1000 rounds) need the real CIFAR-10 files, which
no package ships and a host without internet cannot fetch (issue 35, item 6). Their cost per round does not
depend on the pixel values, so this script writes a CIFAR-shaped dataset (`cifar-10-batches-py/`: 50,000
train and 10,000 test 32x32x3 uint8 images of random pixels, 5,000 / 1,000 per class) and runs the studies'
own run configs (`[base]` + variant + arm, seed 0, exactly as `fedsynth study` builds them) for a few rounds
through the real ServerApp and ClientApp code on an in-process grid (fedsynth/inprocess.py: no Ray; the
nodes train one after another in this process). Accuracies are meaningless; only the times count.

Per run it records each round's `round-time` from metrics.jsonl (round 1 carries the one-off costs: the
partition cache, CUDA start-up, each node's first model); the steady time per round is the mean over
rounds >= 2 (FedSynSAM: without its distillation round). FedSynSAM is run with `trajectory-rounds = 2` so that its one-off distillation (after R
aggregations; its cost does not depend on R) and the rounds after it, which train with D_syn, come within
a few rounds. With `--share` it also times plain ResNet-18-GN training steps (batch 128) in 1 and in k
concurrent processes on the GPU: what Ray's `gpus-per-client = 0.1` (10 ClientApps sharing the GPU)
could gain over the in-process grid's one-at-a-time nodes.

Each run keeps the study's own round count and is stopped (common/run/interrupt.py) after the round in progress
once it has its PLAN's (or `--rounds`') maximum, or its minimum and its share of `--budget` is spent; a run
that would not fit its minimum in what is left is skipped. Existing `cifar-10-batches-py/` files in
`--data-dir` are used as they are (the real ones give the same times). Results: `--out`/round_times.json,
written as soon as each is known, and each run's metrics.jsonl; benchmarks/results/gpu-round-time-h100.md.

    python benchmarks/gpu_round_time.py --out /tmp/rt --budget 370 --share 8
    python benchmarks/gpu_round_time.py --out /tmp/rt --hint 68 --only oledfl-sam-b0.99 --rounds oledfl-sam-b0.99=1:1
    python benchmarks/gpu_round_time.py --tiny --out /tmp/smoke     # a 2-round cpu smoke test, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (label, study file, arm, variant, extra overrides, min rounds, max rounds, nominal seconds). Each run is the
# study's own config with its full round count; it is stopped (common/run/interrupt.py: after the round in progress)
# once it has finished max rounds, or min rounds and its seconds are spent, so the budget decides how many.
PLAN = [
    ("fedsynsam-paper fedsam cifar10-path1-qsgd4", "studies/fedsynsam-paper.toml", "fedsam", "cifar10-path1-qsgd4",
     {}, 3, 8, 20),
    ("fedsynsam-paper fedsynsam cifar10-path1-qsgd4", "studies/fedsynsam-paper.toml", "fedsynsam",
     "cifar10-path1-qsgd4", {"trajectory-rounds": 2}, 5, 10, 40),
    ("oledfl-paper dfedavg", "studies/oledfl-paper.toml", "dfedavg", "", {}, 2, 4, 85),
    ("oledfl-paper oledfl-sgd-b0.99", "studies/oledfl-paper.toml", "oledfl-sgd-b0.99", "", {}, 2, 3, 70),
    ("oledfl-paper oledfl-sam-b0.99", "studies/oledfl-paper.toml", "oledfl-sam-b0.99", "", {}, 2, 3, 100),
]

# Smaller stand-ins for the cpu smoke test (--tiny): same code paths, seconds of work.
TINY = {"num-server-rounds": 5, "local-epochs": 1, "local-steps": 1, "batch-size": 8, "synthetic-ipc": 1,
        "distill-iterations": 2, "trajectory-rounds": 1, "device": "cpu", "eval-every": 1}


def write_cifar(root: Path, train: int, test: int, seed: int = 0) -> Path:
    """`root/cifar-10-batches-py/` in CIFAR-10's python format: random pixels, balanced labels."""
    folder = root / "cifar-10-batches-py"
    if (folder / "test_batch").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def batch(n: int) -> dict[bytes, Any]:
        labels = rng.permutation(np.arange(n) % 10).tolist()
        return {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), b"labels": labels}

    per = train // 5
    for i in range(1, 6):
        with open(folder / f"data_batch_{i}", "wb") as handle:
            pickle.dump(batch(per), handle, protocol=4)
    with open(folder / "test_batch", "wb") as handle:
        pickle.dump(batch(test), handle, protocol=4)
    return folder


def study_config(study_file: str, arm: str, variant: str) -> tuple[dict[str, Any], int]:
    """The app defaults + the study's cell overrides for seed 0, as `fedsynth study` runs them; and its nodes."""
    from fedsynth.study.studyfile import load_study

    with open(REPO / "pyproject.toml", "rb") as handle:
        defaults = dict(tomllib.load(handle)["tool"]["flwr"]["app"]["config"])
    study = load_study(REPO / study_file)
    return {**defaults, **study.cell_overrides(arm, variant), "seed": study.report_seeds[0]}, study.num_supernodes


def _finished_rounds(path: Path) -> int:
    """Rounds >= 1 in metrics.jsonl; -1 before round 0 (the initial evaluation) is there: no round started."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return -1
    return len(lines) - 1 if lines else -1


def time_run(raw: dict[str, Any], nodes: int, min_rounds: int, max_rounds: int, seconds: float) -> dict[str, Any]:
    """The run through the in-process grid, stopped after the round in progress once it has enough rounds."""
    import threading

    import torch

    from common.run import interrupt
    from fedsynth.inprocess import InProcessGrid, run_federation

    folder = Path(raw["results-dir"]) / raw["run-name"]
    metrics = folder / "metrics.jsonl"
    start = time.monotonic()
    done = threading.Event()

    def watch() -> None:  # ask for a stop during the last wanted round: it finishes, then the run stops
        while not done.wait(0.2):
            finished = _finished_rounds(metrics)
            if finished < 0:
                continue
            if finished >= max_rounds - 1 or (finished >= min_rounds - 1 and time.monotonic() - start > seconds):
                interrupt.request_stop(2)
                return

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stopped = False
    try:
        run_federation(raw, InProcessGrid(nodes, raw))
    except interrupt.RunInterrupted:
        stopped = True
    finally:
        done.set()
        watcher.join()
        interrupt.reset()
    wall = time.monotonic() - start
    rounds = [json.loads(line) for line in metrics.read_text().splitlines()]
    times = {r["round"]: r["round-time"] for r in rounds if r.get("round", 0) >= 1 and "round-time" in r}
    server = [r["server-time"] for r in rounds if r.get("round", 0) >= 2 and "server-time" in r]
    extra = {k: r[k] for r in rounds for k in ("distill-time", "distill-loss-start", "distill-loss-end") if k in r}
    distilled = [r["round"] for r in rounds if "distill-time" in r]  # FedSynSAM's one-off round: not steady
    steady = [t for rnd, t in times.items() if rnd >= 2 and rnd not in distilled]
    after = [t for rnd, t in times.items() if distilled and rnd > distilled[0] + 1]  # trained with D_syn
    result = {"wall": wall, "stopped-by-budget": stopped, "round-times": times,
              "steady": float(np.mean(steady)) if steady else None,
              "server-time-steady": float(np.mean(server)) if server else None, **extra,
              "gpu-peak-gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0}
    if "distill-time" in extra and after:
        result["steady-after-distillation"] = float(np.mean(after))
        result["distill-round"] = distilled[0]
    return result


def share_benchmark(procs: int, steps: int) -> dict[str, Any]:
    """Aggregate training steps/s of ResNet-18-GN (batch 128) in 1 and in `procs` concurrent processes."""
    import subprocess

    result: dict[Any, Any] = {}
    for k in (1, procs):
        start = time.monotonic()
        start_at = time.time() + 8 + 2.5 * k  # after every process's imports and warm-up: the timed steps overlap
        children = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--share-worker", str(steps),
                                      "--start-at", str(start_at), "--out", "/tmp"],
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                    for _ in range(k)]
        lines = [c.communicate()[0].strip().splitlines()[-1].split() for c in children]
        rates, late = [float(line[0]) for line in lines], [float(line[1]) for line in lines]
        result[k] = {"processes": k, "steps-per-s-each": rates, "steps-per-s-total": sum(rates),
                     "late-start-s": max(late), "wall": time.monotonic() - start}
    result["speedup"] = result[procs]["steps-per-s-total"] / result[1]["steps-per-s-total"]
    return result


def share_worker(steps: int, start_at: float) -> None:
    """One process: `steps` timed SGD steps of the study's ResNet-18-GN on batch 128 (after 10 untimed)."""
    import torch

    from common.run.config import parse_run_config
    from common.run.task import make_model
    from server_app.registry import SERVER_STRATEGIES

    raw, _ = study_config("studies/oledfl-paper.toml", "dfedavg", "")
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    device = torch.device("cuda")
    model = make_model(cfg).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=5e-4)
    x = torch.randn(128, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    late = time.time() - start_at
    if late < 0:
        time.sleep(-late)
    start = time.monotonic()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    print(steps / (time.monotonic() - start), max(0.0, late))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/fedsynth-cifar-shaped"))
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/fedsynth-gpu-round-time"),
                        help="partition cache and the runs' folders (--out gets the results and metrics only)")
    parser.add_argument("--budget", type=float, default=380.0, help="seconds for the whole script")
    parser.add_argument("--only", default="", help="comma-separated arms to run, in this order (default: the whole plan)")
    parser.add_argument("--rounds", default="", help="ARM=MIN:MAX,... rounds of those arms instead of the plan's")
    parser.add_argument("--hint", type=float, default=0.0,
                        help="OledFL DFedAvg's s/round from an earlier run: sizes the other OledFL arms without it")
    parser.add_argument("--share", type=int, default=0, help="also time k concurrent training processes")
    parser.add_argument("--share-steps", type=int, default=150)
    parser.add_argument("--tiny", action="store_true", help="cpu smoke test: tiny data, 4 nodes, 2 rounds")
    parser.add_argument("--share-worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.share_worker:
        share_worker(args.share_worker, args.start_at)
        return 0
    began = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    import torch

    torch.backends.cudnn.benchmark = False  # as the app runs
    machine = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
        "torch": torch.__version__, "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "torch-threads": torch.get_num_threads(), "command": " ".join(sys.argv),
    }
    results: dict[str, Any] = {"machine": machine, "runs": {}}
    out_json = args.out / "round_times.json"

    def save() -> None:
        out_json.write_text(json.dumps(results, indent=1, default=str))

    t0 = time.monotonic()
    write_cifar(args.data_dir, 2000 if args.tiny else 50000, 500 if args.tiny else 10000)
    results["data-write-s"] = time.monotonic() - t0
    save()
    print(json.dumps(machine), flush=True)
    estimates: dict[str, float] = {}  # steady s/round of what ran, to size the rest
    reserve = 60.0 if args.share and not args.tiny else 0.0
    if args.hint:
        estimates["oledfl-paper dfedavg"] = args.hint
    rounds_override = {k: tuple(int(x) for x in v.split(":")) for k, v in
                       (item.split("=") for item in args.rounds.split(",") if item)}
    plan = [p for name in args.only.split(",") for p in PLAN if p[2] == name] if args.only else PLAN
    for label, study_file, arm, variant, extra, min_rounds, max_rounds, seconds in plan:
        min_rounds, max_rounds = rounds_override.get(arm, (min_rounds, max_rounds))
        raw, nodes = study_config(study_file, arm, variant)
        raw.update(extra)
        tag = label.replace(" ", "_")
        raw.update({"data-dir": str(args.data_dir), "cache-dir": str(args.work_dir / "cache"),
                    "results-dir": str(args.work_dir / "runs"), "run-name": tag, "device": "cuda",
                    "checkpoint-every": 0, "save-model": False})
        if args.tiny:
            raw.update(TINY)
            nodes, min_rounds, max_rounds, seconds = 4, 2, 2, float("inf")
        else:
            left = args.budget - (time.monotonic() - began) - reserve
            # OledFL's other arms sized by its DFedAvg (SAM: twice the gradient work, about a third of a round)
            per_round = estimates.get("oledfl-paper dfedavg") if "oledfl" in study_file else None
            if per_round is not None and "sam" in arm:
                per_round *= 1.5
            need = 15.0 + min_rounds * 1.15 * per_round if per_round else 30.0
            if left < need:
                results["runs"][label] = {"skipped": f"{left:.0f} s left, about {need:.0f} s needed"}
                save()
                print(f"-- {label}: skipped, {left:.0f} s left, about {need:.0f} s needed", flush=True)
                continue
            seconds = min(seconds, left - 1.1 * (per_round or 0.0))
        print(f"== {label}: {nodes} nodes, {min_rounds}-{max_rounds} rounds, {seconds:.0f} s", flush=True)
        try:
            measured = time_run(raw, nodes, min_rounds, max_rounds, seconds)
        except Exception as err:  # noqa: BLE001 - record it and go on to the next run
            results["runs"][label] = {"error": f"{type(err).__name__}: {err}"}
            save()
            print(f"!! {label}: {type(err).__name__}: {err}", flush=True)
            continue
        measured.update({"nodes": nodes, "study": study_file, "arm": arm, "variant": variant, "extra": extra,
                         "model": raw.get("model"), "local-epochs": raw.get("local-epochs"),
                         "local-steps": raw.get("local-steps"), "batch-size": raw.get("batch-size"),
                         "eval-every": raw.get("eval-every")})
        if measured["steady"] is not None:
            estimates[label] = measured["steady"]
        elif measured["round-times"]:
            estimates[label] = float(np.mean(list(measured["round-times"].values())))
        results["runs"][label] = measured
        save()
        shutil.copyfile(args.work_dir / "runs" / tag / "metrics.jsonl", args.out / f"metrics-{tag}.jsonl")
        print(f"== {label}: {json.dumps(measured, default=str)}", flush=True)
    if args.share and not args.tiny:
        left = args.budget - (time.monotonic() - began)
        if left > 45:
            print(f"== share: 1 and {args.share} processes", flush=True)
            try:
                results["share"] = share_benchmark(args.share, args.share_steps)
            except Exception as err:  # noqa: BLE001
                results["share"] = {"error": f"{type(err).__name__}: {err}"}
        else:
            results["share"] = {"skipped": f"{left:.0f} s left"}
        save()
    results["total-s"] = time.monotonic() - began
    save()
    print(json.dumps(results, indent=1, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
