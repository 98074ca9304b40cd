"""SCAFFOLD with local momentum on FedCOG's NIID-2: control-variate norms and the effective step, per round.

    .venv/bin/python benchmarks/scaffold_momentum.py [--configs scaffold:0.9:0.01,scaffold:0:0.1,...]
        [--rounds 12] [--local-steps 30] [--batch-size 32] [--out FILE]   (a config is algorithm:momentum:lr)

Runs the real ServerApp and ClientApp code on the in-process grid (10 clients,
`pairs` split, the FedCOG cpu setting: simple CNN, SGD lr 0.01, weight decay
1e-5, batch 32) and records after each round, from the strategy's own state:

- `|c|`: the server control variate's norm; `|c_i|` mean and max over clients;
- `step/K·lr`: each client's ||x - y_i|| / (K·lr), the norm of the option-II
  gradient estimate (x - y_i)/(K·lr) (mean over clients); without momentum it
  is the mean corrected gradient, with momentum beta it is about 1/(1 - beta)
  times that, because SGD with momentum moves about lr/(1 - beta) per unit of
  gradient once the buffer has filled;
- `|Δx|`: the global model's change in the round; `acc`: central test accuracy.

The table answers whether SCAFFOLD's control variates grow without bound with
momentum (a defect of the update formula would) or stay bounded while the
global step is simply larger.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from server_app.app import run_strategy

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def norm(weights: dict[str, np.ndarray]) -> float:
    """Euclidean norm over all arrays of a weights dict."""
    return float(np.sqrt(sum(float(np.sum(np.square(w.astype(np.float64)))) for w in weights.values())))


def measure(raw: dict[str, Any], num_nodes: int) -> list[dict[str, float]]:
    """One federation; a row of norms per round."""
    from common.run.config import parse_run_config
    from common.protocol import MODEL
    from common.records import from_record
    from common.run.results import RunResults
    from fedsynth.inprocess import InProcessGrid
    from server_app.handshake import handshake
    from server_app.strategies.base import TooManyFailedRounds
    from server_app.registry import SERVER_STRATEGIES, build_strategy, decayed_lr

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(num_nodes, raw)
    strategy = build_strategy(cfg, handshake(grid, cfg))
    rows: list[dict[str, float]] = []
    inner = strategy.server_step

    def recording_step(mean_delta, replies):
        # each reply carries the client's local model y_i; strategy.current is still x
        lr = decayed_lr(cfg.lr, cfg.lr_decay, len(rows) + 1)
        x = strategy.current
        displacements = []
        for reply in replies:
            y = from_record(reply.content.array_records[MODEL])
            displacements.append(norm({n: x[n] - y[n] for n in x}) / (cfg.local_steps * lr))
        new = inner(mean_delta, replies)
        row = {
            "round": len(rows) + 1,
            "eff": float(np.mean(displacements)),
            "dx": norm({n: new[n] - strategy.current[n] for n in new}),
        }
        if getattr(strategy, "control", None) is not None:
            controls = [norm(c) for c in strategy.client_controls.values()]
            row.update(c=norm(strategy.control), ci_mean=float(np.mean(controls)), ci_max=float(np.max(controls)))
        rows.append(row)
        return new

    strategy.server_step = recording_step
    results = RunResults(cfg)
    try:
        run_strategy(grid, cfg, strategy, results)
    except TooManyFailedRounds:  # diverged: the clients refuse a non-finite model; keep the rows so far
        pass
    accuracy = {r["round"]: r["central-accuracy"] for r in results.rounds if "central-accuracy" in r}
    for row in rows:
        row["acc"] = accuracy.get(row["round"], float("nan"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="scaffold:0.9:0.01,scaffold:0:0.01,scaffold:0:0.1,fedavg:0.9:0.01",
                        help="comma-separated algorithm:momentum:lr")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--local-steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--partition", default="pairs")
    parser.add_argument("--out", type=Path, default=None, help="append the table to this file")
    args = parser.parse_args(argv)

    import tempfile

    import torch

    torch.set_num_threads(1)
    lines = [
        f"K = {args.local_steps} local steps of batch {args.batch_size}, partition `{args.partition}`, "
        "10 clients, seed 0.", "",
        "| algorithm | momentum | lr | lr/(1-momentum) | round | acc % | |c| | |c_i| mean | |c_i| max "
        "| ||x-y_i||/(K·lr) | |Δx| |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for config in args.configs.split(","):
            algorithm, momentum, lr = config.split(":")
            momentum, lr = float(momentum), float(lr)
            raw = {
                "algorithm": algorithm, "model": "cnn", "dataset": "fashion-mnist", "partition": args.partition,
                "classes-per-client": 2, "lr": lr, "momentum": momentum, "weight-decay": 1e-5,
                "local-steps": args.local_steps, "batch-size": args.batch_size, "num-server-rounds": args.rounds,
                "eval-every": 1, "checkpoint-every": 0, "save-model": False, "seed": 0, "results-dir": folder,
                "run-name": f"{algorithm}-{momentum}-{lr}", "device": "cpu",
            }
            started = time.monotonic()
            rows = measure(raw, 10)
            seconds = (time.monotonic() - started) / max(len(rows), 1)
            for row in rows:
                cells = [f"{100 * row['acc']:.2f}"] + [
                    f"{row[k]:.3g}" if k in row else "–" for k in ("c", "ci_mean", "ci_max", "eff", "dx")]
                lines.append(f"| {algorithm} | {momentum} | {lr} | {lr / (1 - momentum):.3g} | {row['round']} | "
                             + " | ".join(cells) + " |")
            if len(rows) < args.rounds:
                lines.append(f"| {algorithm} | {momentum} | {lr} | {lr / (1 - momentum):.3g} | {len(rows) + 1}- "
                             "| diverged: non-finite model, clients refuse it | | | | | |")
            print(f"{config}: {seconds:.1f} s/round", flush=True)
            print("\n".join(lines[-len(rows) - 1:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
