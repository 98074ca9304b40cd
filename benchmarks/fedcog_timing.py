"""FedCOG's cost on one client: generation time per budget (paper Table 11) and one round with and without FedCOG.

    .venv/bin/python benchmarks/fedcog_timing.py [--local-steps 100] [--batch-size 64] [--gen-steps 100]
        [--budgets 64,256] [--device cpu] [--threads 1] [--out FILE]

Runs the project's own client code on one NIID-2 client of Fashion-MNIST (the
`pairs` split's client 0: classes 0 and 1, 3000 images each, 80 % of them for
training) with the simple CNN:

- **generation**: seconds of `client_app.fedcog.generate` for each budget at
  `--gen-steps` Adam steps (the paper's Table 11: 100 steps on a GPU), with a
  previous local model (the disagreement term on, as in every FedCOG round
  after the first);
- **round**: seconds of one client's local round of each base X in `--bases`
  (default `fedavg`) and of `X+cog` (generation at `--gen-budgets`' last budget, then K steps that
  each add a KD forward/backward on a generated batch), after a warm-up round.

Times are this process's CPU seconds (`time.process_time`, one torch thread
by default), which on a shared machine stay close to what an idle core would
take while the wall clock does not. A federated round of 10 clients in one process costs about 10 times the
client's round plus the central evaluation (`--eval` measures it: 10,000 test
images). The study files (studies/fedcog-*.toml) are sized from these numbers
(docs/fedcog.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from flwr.app import RecordDict  # noqa: E402

from client_app.fedcog import frozen_copy, generate  # noqa: E402
from client_app.training import LocalJob  # noqa: E402
from client_app.registry import CLIENT_UPDATES  # noqa: E402
from server_app.registry import train_records_of  # noqa: E402
from common.run.config import parse_run_config  # noqa: E402
from common.data.datasets import load_dataset  # noqa: E402
from common.metrics.evaluation import as_tensors  # noqa: E402
from common.algorithms.fedcog import complementary_labels  # noqa: E402
from common.data.partition import PartitionSpec, build_client_datasets  # noqa: E402
from common.protocol import STATE_COG_PREVIOUS_MODEL  # noqa: E402
from common.records import model_weights, to_record  # noqa: E402
from common.run.task import make_model  # noqa: E402
from fedsynth.app_config import app_defaults  # noqa: E402

# The paper's Table 11: seconds of one client's generation (100 steps, GPU) per budget.
PAPER_TABLE11 = {16: 0.72, 32: 0.78, 64: 0.79, 128: 0.80, 256: 0.81, 512: 0.83, 1024: 1.27}


def client_zero(device: torch.device):
    """The pairs split's client 0 of Fashion-MNIST as tensors on the device, and its label counts."""
    spec = PartitionSpec("fashion-mnist", "pairs", 10, 0, classes_per_client=2)
    data = build_client_datasets(load_dataset("fashion-mnist"), spec)[0]
    x, y = as_tensors(data.x_train, data.y_train, "fashion-mnist", device)
    return x, y, data.label_counts(10)


def generation_seconds(cfg, x: torch.Tensor, counts: np.ndarray, budget: int, steps: int) -> float:
    """Seconds of one generation of `budget` inputs for `steps` steps, disagreement term on."""
    model = make_model(cfg, seeded=True).to(x.device)
    local = frozen_copy(model)
    with torch.no_grad():
        for p in local.parameters():
            p.add_(0.01 * torch.randn_like(p))
    targets = torch.from_numpy(complementary_labels(counts, budget)).to(x.device)
    generate(frozen_copy(model), local, targets[:8], tuple(x.shape[1:]), 2, cfg.gen_lr, cfg.lambda_dis, 0)  # warm-up
    start = time.process_time()
    generate(frozen_copy(model), local, targets, tuple(x.shape[1:]), steps, cfg.gen_lr, cfg.lambda_dis, 0)
    return time.process_time() - start


def round_seconds(cfg, algorithm: str, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds of one client's round (the second of two, so that the first warms up)."""
    model = make_model(cfg, seeded=True).to(x.device)
    state = RecordDict()
    state[STATE_COG_PREVIOUS_MODEL] = to_record(model_weights(model))
    seconds = 0.0
    for server_round in (1, 2):
        start = time.process_time()
        job = LocalJob(cfg=cfg, server_round=server_round, partition_id=0, model=model, x=x, y=y,
                       device=x.device, incoming=train_records_of(dataclasses.replace(cfg, algorithm=algorithm), server_round),
                       state=state)
        CLIENT_UPDATES[algorithm](job)
        seconds = time.process_time() - start
    return seconds


def eval_seconds(cfg, device: torch.device) -> float:
    """Seconds of one central evaluation on the official test split (10,000 images)."""
    from common.metrics.evaluation import evaluate_model

    data = load_dataset("fashion-mnist")
    x, y = as_tensors(data.x_test, data.y_test, "fashion-mnist", device)
    model = make_model(cfg, seeded=True).to(device)
    start = time.process_time()
    evaluate_model(model, x, y, 256)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gen-steps", type=int, default=100)
    parser.add_argument("--budgets", default="64,256")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bases", default="fedavg", help="comma-separated bases X: each runs as X and X+cog")
    parser.add_argument("--eval", action="store_true", help="also time one central evaluation")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    budgets = [int(b) for b in args.budgets.split(",")]
    raw = {**app_defaults(REPO_ROOT), "dataset": "fashion-mnist", "model": "cnn", "lr": 0.01, "momentum": 0.9,
           "weight-decay": 1e-5, "batch-size": args.batch_size, "local-steps": args.local_steps,
           "gen-steps": args.gen_steps, "gen-budget": budgets[-1], "cog-start-round": 1, "cog-grid-partition": -1,
           "device": str(device), "partition": "pairs"}
    cfg = parse_run_config(raw, CLIENT_UPDATES)
    x, y, counts = client_zero(device)
    lines = [f"# FedCOG cost on one client ({device}, {args.threads} thread(s), `{' '.join(sys.argv[1:])}`)", "",
             f"Generation, {args.gen_steps} Adam steps, disagreement term on (pairs client 0: {int(counts.sum())} "
             "training images of 2 classes):", "",
             "| budget | ours (CPU s) | paper Table 11 (s, GPU, 100 steps) |", "| --- | --- | --- |"]
    for budget in budgets:
        seconds = generation_seconds(cfg, x, counts, budget, args.gen_steps)
        paper = PAPER_TABLE11.get(budget)
        lines.append(f"| {budget} | {seconds:.2f} | {paper if paper is not None else '–'} |")
        print(lines[-1], flush=True)
    lines += ["", f"One client round, K = {args.local_steps} steps of batch {args.batch_size} "
              f"(fedavg+cog: generation of {budgets[-1]} inputs, then K steps with a KD batch each):", "",
              "| client rule | CPU seconds |", "| --- | --- |"]
    for algorithm in [a for base in args.bases.split(",") for a in (base, f"{base}+cog")]:
        lines.append(f"| {algorithm} | {round_seconds(cfg, algorithm, x, y):.2f} |")
        print(lines[-1], flush=True)
    if args.eval:
        lines += ["", f"Central evaluation (10,000 test images): {eval_seconds(cfg, device):.2f} CPU s"]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
