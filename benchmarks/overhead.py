"""Framework overhead: the default run in Flower's simulation engine vs the same work as a plain loop.

Both sides run the same computation with the project's own code — the same
clients and partitions, the same local steps and seeds (`client_app.updates`),
the same local evaluation of the global model on each node's test split, the
same sample-weighted aggregation and the same central evaluation — once
through Flower (`fedsynth run`: Ray actors, messages, records) and once as a
single-process PyTorch loop. Reported, all from one invocation on one machine:

- total wall time of each and their ratio;
- the plain loop's time per round vs the simulation's per-round time
  (from metrics.jsonl), and their difference: Flower's per-round cost;
- a trivial round (tiny MLP, one local step, no evaluation) in simulation:
  the fixed framework cost of a round once Ray is up;
- the simulation's start-up (Ray and actors), paid once.

    .venv/bin/python benchmarks/overhead.py [--rounds 20] [--out benchmarks/results/overhead.md]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.training import LocalJob
from client_app.registry import CLIENT_UPDATES
from fedsynth.app_config import app_defaults
from fedsynth.simulation import find_app_dir, run_simulation
from common.run.config import parse_run_config
from common.metrics.evaluation import as_tensors, evaluate_model
from common.data.partition import PartitionSpec, load_client_data
from common.records import load_weights, model_weights
from common.run.task import make_model
from server_app.evaluation import CentralEvaluator
from server_app.registry import SERVER_STRATEGIES, train_records_of
from server_app.strategies.fedavg import weighted_mean


def plain_loop(raw: dict[str, Any], num_clients: int) -> dict[str, Any]:
    """The default run's computation in one process, without Flower."""
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    spec = PartitionSpec(cfg.dataset, cfg.partition, num_clients, cfg.seed, cfg.alpha,
                         cfg.classes_per_client, cfg.local_test_fraction)
    device = torch.device("cpu")
    start = time.monotonic()
    weights = model_weights(make_model(cfg, seeded=True))
    evaluator = CentralEvaluator(cfg)
    round_times, accuracy = [], float("nan")
    for server_round in range(1, cfg.num_server_rounds + 1):
        round_start = time.monotonic()
        deltas, counts = [], []
        # the train message's config as the app's strategy sends it (the round's lr, the rule's settings)
        incoming = train_records_of(cfg, server_round)
        for pid in range(num_clients):
            data = load_client_data(spec, pid, cfg.data_dir, cfg.cache_dir)
            model = make_model(cfg)
            load_weights(model, weights)
            # the ClientApp scores the global model on the node's local test split before training
            evaluate_model(model, *as_tensors(data.x_test, data.y_test, cfg.dataset, device))
            x, y = as_tensors(data.x_train, data.y_train, cfg.dataset, device)
            job = LocalJob(cfg=cfg, server_round=server_round, partition_id=pid, model=model, x=x, y=y,
                           device=device, incoming=incoming, state=RecordDict())
            CLIENT_UPDATES[cfg.algorithm](job)
            local = model_weights(model)
            deltas.append({k: local[k] - weights[k] for k in weights})
            counts.append(float(len(y)))
        mean = weighted_mean(deltas, counts)
        weights = {k: (weights[k] + cfg.server_lr * mean[k]).astype(np.float32) for k in weights}
        _, accuracy = evaluator.evaluate(weights)
        round_times.append(time.monotonic() - round_start)
    return {"wall-time": time.monotonic() - start, "round-times": round_times, "final-accuracy": accuracy}


def simulation(app_dir: Path, overrides: dict[str, Any], num_clients: int) -> dict[str, Any]:
    """The same run through Flower's simulation engine; per-round times from its metrics."""
    start = time.monotonic()
    folder = run_simulation(app_dir, overrides, num_supernodes=num_clients, cpus_per_client=1.0)
    wall = time.monotonic() - start
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rounds if r["round"] >= 1]
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "wall-time": wall,
        "round-times": [r["round-time"] for r in timed],
        "final-accuracy": summary.get("final-central-accuracy"),
        "loop-time": summary["wall-time"],
    }


def in_process(app_dir: Path, overrides: dict[str, Any], num_clients: int) -> dict[str, Any]:
    """The same ServerApp/ClientApp logic on the in-process grid (no Flower engine, no Ray)."""
    from fedsynth.inprocess import InProcessGrid, run_federation

    raw = {**app_defaults(app_dir), **overrides}
    run_federation(raw, InProcessGrid(num_clients, raw))
    folder = Path(raw["results-dir"]) / raw["run-name"]
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {"round-times": [r["round-time"] for r in rounds if r["round"] >= 1]}


def run_config_pairs(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs as run-config overrides, each VALUE read as TOML (as `--run-config` reads it)."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        try:
            overrides[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = value  # a bare word: a string
    return overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead.md"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config key of the measured run (TOML value; repeatable), e.g. model=mlp")
    args = parser.parse_args()
    app_dir = find_app_dir()
    results_dir = "/tmp/fedsynth-overhead"
    stamp = int(time.time())
    overrides = {"num-server-rounds": args.rounds, "results-dir": results_dir, "run-name": f"sim-{stamp}",
                 "checkpoint-every": 0, **run_config_pairs(args.set)}
    raw = {**app_defaults(app_dir), **overrides}

    trivial_overrides = {
        "num-server-rounds": 10, "model": "mlp", "local-steps": 1, "batch-size": 8, "central-eval": False,
        "results-dir": results_dir, "run-name": f"trivial-{stamp}", "checkpoint-every": 0, "save-model": False,
    }
    # the in-process measurements first, then the simulation engine's (each side loads its own data)
    plain = plain_loop(raw, args.clients)
    trivial_app = in_process(app_dir, {**trivial_overrides, "run-name": f"trivial-inprocess-{stamp}"}, args.clients)
    sim = simulation(app_dir, overrides, args.clients)
    trivial = simulation(app_dir, trivial_overrides, args.clients)

    sim_round = float(np.median(sim["round-times"][1:]))
    plain_round = float(np.median(plain["round-times"][1:]))
    trivial_round = float(np.median(trivial["round-times"][1:]))
    trivial_app_round = float(np.median(trivial_app["round-times"][1:]))
    workers = min(args.clients, os.cpu_count() or 1)
    startup = sim["wall-time"] - sum(sim["round-times"])
    lines = [
        f"# Framework overhead ({args.clients} clients, {args.rounds} rounds, `make run`'s config; {time.strftime('%Y-%m-%d')})",
        "",
        f"Command: `.venv/bin/python benchmarks/overhead.py --rounds {args.rounds} --clients {args.clients}"
        + "".join(f" --set {pair}" for pair in args.set) + "`, "
        f"{torch.get_num_threads()} torch threads in the plain loop, 1 CPU per simulated ClientApp.",
        "",
        "| measure | Flower simulation | plain PyTorch loop | ratio |",
        "| --- | --- | --- | --- |",
        f"| total wall time (s) | {sim['wall-time']:.1f} | {plain['wall-time']:.1f} | {sim['wall-time'] / plain['wall-time']:.2f} |",
        f"| median round time (s) | {sim_round:.2f} | {plain_round:.2f} | {sim_round / plain_round:.2f} |",
        f"| final central accuracy | {sim['final-accuracy']:.4f} | {plain['final-accuracy']:.4f} | |",
        "",
        f"- simulation start-up (Ray, actors, handshake, round-0 evaluation): {startup:.1f} s, paid once",
        f"- per-round difference (simulation - plain): {sim_round - plain_round:+.2f} s",
        f"- trivial round in simulation (mlp, 1 local step, no evaluation, {args.clients} clients): "
        f"{trivial_round:.3f} s = fixed framework cost per round, of which the app's own work (the same round "
        f"in process, no Flower, one message after the other: {trivial_app_round:.3f} s) spread over the "
        f"{workers} Ray actors is about {trivial_app_round / workers:.3f} s, leaving "
        f"{trivial_round - trivial_app_round / workers:.3f} s to Flower (messages, Ray, the 0.1 s polls of its "
        "in-memory SuperLink)",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"simulation": sim, "plain": plain, "trivial": trivial}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
