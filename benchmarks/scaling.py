"""Scaling in simulation: round time and memory as the number of sampled clients grows.

    .venv/bin/python benchmarks/scaling.py [--clients 10,50,100] [--rounds 5] [--out FILE]

Each client does the same work whatever the federation's size (`local-steps`
fixed, the simple CNN on Fashion-MNIST, an IID split so every partition holds
at least that many batches), every client takes part in every round, and
central evaluation is off, so a round's time is the per-client cost times the
clients plus the round's fixed cost. One Flower simulation per size, in this
process as `make run` runs it (1 CPU per ClientApp). Reported: the median
round time (rounds 2..R; round 1 also builds the partition cache), time per
client, and the resident memory of the ServerApp process and of the ClientApp
actors (sampled every 0.5 s), with the memory added per client.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from memory import sample
from report import write_report

from fedsynth.simulation import find_app_dir, run_simulation


def one_size(num_clients: int, rounds: int, local_steps: int) -> dict:
    samples: list[dict] = []
    stop = threading.Event()
    thread = threading.Thread(target=sample, args=(stop, samples), daemon=True)
    thread.start()
    overrides = {
        "num-server-rounds": rounds, "partition": "iid", "model": "cnn", "local-steps": local_steps,
        "batch-size": 32, "central-eval": False, "checkpoint-every": 0, "save-model": False,
        "run-name": f"scaling-{num_clients}-{int(time.time())}", "results-dir": "/tmp/fedsynth-scaling-results",
        "node-wait-timeout": 600.0,
    }
    started = time.monotonic()
    try:
        folder = run_simulation(find_app_dir(), overrides, num_supernodes=num_clients, cpus_per_client=1.0)
        wall = time.monotonic() - started
    finally:  # a failed run leaves no sampling thread behind
        stop.set()
        thread.join()
    round_times = [json.loads(line)["round-time"] for line in (folder / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["round"] >= 2]
    median = statistics.median(round_times)
    return {
        "clients": num_clients, "wall-s": wall, "round-s": median, "per-client-s": median / num_clients,
        "server-max-mb": max(s["server"] for s in samples),
        "actors-max-mb": max((sum(s["clients"]) for s in samples if s["clients"]), default=0.0),
        "actors": max((len(s["clients"]) for s in samples), default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,50,100")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scaling.md"))
    args = parser.parse_args()
    rows = [one_size(int(n), args.rounds, args.local_steps) for n in args.clients.split(",")]
    first, last = rows[0], rows[-1]
    per_client_mb = ((last["server-max-mb"] + last["actors-max-mb"]) - (first["server-max-mb"] + first["actors-max-mb"])) \
        / max(last["clients"] - first["clients"], 1)
    lines = [
        f"# Scaling in simulation ({time.strftime('%Y-%m-%d')})",
        "",
        f"Command: `.venv/bin/python benchmarks/scaling.py --clients {args.clients} --rounds {args.rounds} "
        f"--local-steps {args.local_steps}`; simple CNN, Fashion-MNIST IID, {args.local_steps} local steps of batch 32 "
        "per client, full participation, no central evaluation, 1 CPU per ClientApp.",
        "",
        "| clients | median round s | s per client | server max MB | ClientApp actors | actors max MB (sum) | run wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r['clients']} | {r['round-s']:.2f} | {r['per-client-s']:.3f} | {r['server-max-mb']:.0f} | "
              f"{r['actors']} | {r['actors-max-mb']:.0f} | {r['wall-s']:.0f} |" for r in rows]
    lines += ["", f"- memory added per client from {first['clients']} to {last['clients']} clients "
                  f"(server + actors, maxima): {per_client_mb:.2f} MB"]
    write_report(args.out, lines, rows)


if __name__ == "__main__":
    main()
