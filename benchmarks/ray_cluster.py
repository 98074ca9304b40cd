"""`make run` on a Ray cluster: 1, 2 and 4 ClientApp actors on two local Ray nodes against the same on one node.

    .venv/bin/python benchmarks/ray_cluster.py [--actors 1,2,4] [--rounds 20] [--out FILE]

For each actor count N, two clusters are started on this host with
`ray.cluster_utils.Cluster` (separate raylets, as `ray start` makes them) and
`fedsynth run --ray-address` runs `make run`'s config on each, with
`--cpus-per-client 1`:

- one node: a head with N CPUs (N actors on it);
- two nodes: a head and a worker with N/2 CPUs each (N = 1: the head has none
  and the one actor runs on the worker, so every message crosses raylets).

Reported: the command's wall time (Ray connection, engine start-up and the
rounds), the ServerApp's own wall time from summary.json, the ratio of each
to one node, and how many partitions ran on each node (`ray-placement.jsonl`).
Both "nodes" share this machine's cores, so two nodes cannot be faster here
than one: the table measures what spreading costs, not what it gains.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_layout(actors: int, nodes: int, rounds: int, results: Path) -> dict:
    from ray.cluster_utils import Cluster

    head_cpus = actors if nodes == 1 else actors // 2
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": head_cpus,
                                                                           "include_dashboard": False})
    if nodes == 2:
        cluster.add_node(num_cpus=actors - head_cpus)
    cluster.wait_for_nodes(timeout=120)
    name = f"ray-{actors}a-{nodes}n-{int(time.time())}"
    try:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "fedsynth.cli", "run", "--num-supernodes", "10", "--cpus-per-client", "1",
             "--ray-address", cluster.address, "--run-config",
             f'num-server-rounds={rounds} results-dir="{results}" run-name="{name}"'],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )
        wall = time.monotonic() - started
    finally:
        cluster.shutdown()
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr[-2000:]}")
    folder = results / name
    summary = json.loads((folder / "summary.json").read_text())
    by_node: dict[str, set[int]] = {}
    for line in (folder / "ray-placement.jsonl").read_text().splitlines():
        entry = json.loads(line)
        by_node.setdefault(entry["ray-node-id"][:8], set()).add(entry["partition-id"])
    return {"actors": actors, "nodes": nodes, "wall-s": wall, "server-s": float(summary["wall-time"]),
            "load": os.getloadavg()[1],
            "accuracy": summary.get("final-central-accuracy"),
            "partitions-per-node": sorted(len(parts) for parts in by_node.values())}


def render(rows: list[dict], rounds: int) -> str:
    lines = [
        "# `make run` on a Ray cluster: two local Ray nodes against one",
        "",
        f"`benchmarks/ray_cluster.py --rounds {rounds}`: `make run`'s config (FedAvg, 10 clients, Dirichlet(0.3), "
        f"{rounds} rounds), `--cpus-per-client 1`, through `fedsynth run --ray-address` on clusters started by "
        "`ray.cluster_utils.Cluster` on one 2-core machine. Both nodes share those 2 cores (and other work ran on "
        "them: the last column is the machine's 5-minute load average after each run), so spreading cannot gain "
        "here; the table shows its cost.",
        "",
        "| actors | nodes | wall time s | ratio to one node | ServerApp time s | ratio | final accuracy | partitions run per node | load (5 min) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = {row["actors"]: row for row in rows if row["nodes"] == 1}
    for row in rows:
        one = base.get(row["actors"])
        ratio = f"{row['wall-s'] / one['wall-s']:.2f}" if one else "-"
        server_ratio = f"{row['server-s'] / one['server-s']:.2f}" if one else "-"
        accuracy = f"{row['accuracy']:.4f}" if isinstance(row["accuracy"], float) else "-"
        lines.append(f"| {row['actors']} | {row['nodes']} | {row['wall-s']:.1f} | {ratio} | {row['server-s']:.1f} | "
                     f"{server_ratio} | {accuracy} | {', '.join(map(str, row['partitions-per-node']))} | {row['load']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ray-cluster.md")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    results = Path("/tmp/fedsynth-ray-cluster-results")
    rows = []
    for actors in (int(a) for a in args.actors.split(",")):
        for nodes in (1, 2):
            rows.append(one_layout(actors, nodes, args.rounds, results))
            print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(render(rows, args.rounds))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
