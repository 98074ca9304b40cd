"""Deployed round time against simulation: `make run`'s config, 3 rounds, 2 nodes on this host.

    python benchmarks/deployment_vs_simulation.py [--rounds 3] [--out benchmarks/results/deployment-vs-simulation.md]

Issue 22: two ClientApps on one host with torch's default threads oversubscribed the cores
(deployed rounds 70-189 s where simulation takes about 2 s). With `client_app/threads.py` each
deployed ClientApp uses the host's cores / `supernodes-per-host` threads, and a simulated one
`--cpus-per-client` (1). This runs, with the run config's defaults (pyproject.toml, as `make run`)
and `num-server-rounds` = 3:

- a loopback deployment (`fedsynth.loopback`: SuperLink + 2 SuperNodes, node config
  `supernodes-per-host=2`, so default threads), every ClientApp message a new process,
- the same loopback deployment with warm ClientApp processes (`deploy/warm-clientapp` first on the
  SuperNodes' PATH, the default of deploy/supernode.sh; issue 55),
- the warm deployment with the SuperNodes' adaptive waits (deploy/supernode-waits.py, also deploy/supernode.sh's
  default; the two arms before it run Flower's own waits), whose final models must be bitwise the cold
  deployment's (the script fails otherwise), and
- Flower's simulation engine with 2 SuperNodes (`fedsynth run --num-supernodes 2`),

all without `OMP_NUM_THREADS` in the environment, and reports each round's time, the server's
share of it (central evaluation, aggregation) and the threads the ClientApps reported. Target:
deployed within 3x of simulated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from fedsynth.loopback import LoopbackFederation  # noqa: E402

NODES = 2


def clean_env() -> dict[str, str]:
    """This environment without the thread settings that would override the default rule, and without
    PYTHONDONTWRITEBYTECODE (this machine sets it; a SuperNode host or the image does not, and with it every
    deployed task compiles the app's modules again)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONDONTWRITEBYTECODE")}


@contextmanager
def host_environment() -> Iterator[None]:
    """This process's environment as `clean_env()` while the block runs (a `LoopbackFederation` starts its
    processes with it), restored afterwards."""
    saved, host = dict(os.environ), clean_env()
    os.environ.clear()
    os.environ.update(host)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def rounds_of(folder: Path) -> list[dict]:
    return [r for r in (json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines())
            if r["round"] >= 1]


ARMS = {"cold": {"warm_clientapp": False, "adaptive_waits": False},
        "warm": {"warm_clientapp": True, "adaptive_waits": False},
        "warm-adaptive": {"warm_clientapp": True, "adaptive_waits": True}}


def deployed(rounds: int, work: Path, arm: str = "cold") -> tuple[list[dict], float]:
    """Round metrics and wall time of the loopback deployment of `arm` (`ARMS`: warm ClientApp processes or not,
    the SuperNodes' adaptive waits or Flower's)."""
    work = work / f"deployed-{arm}"
    work.mkdir()
    results = work / "results"
    config = " ".join([f"num-server-rounds={rounds}", f'cache-dir="{work / "cache"}"', f'results-dir="{results}"',
                       'run-name="deployed"', "node-wait-timeout=600.0"])
    start = time.monotonic()
    with host_environment(), LoopbackFederation(work, num_nodes=NODES, node_config=f"supernodes-per-host={NODES}",
                                                **ARMS[arm]) as federation:
        run = federation.run(REPO_ROOT, config, timeout=1800)
        if not (results / "deployed" / "summary.json").is_file():
            raise SystemExit(run.stdout[-3000:] + run.stderr[-3000:] + federation.log_tails())
    return rounds_of(results / "deployed"), time.monotonic() - start


def model_digest(work: Path, arm: str) -> str:
    """sha256 of the deployed run's final model (model.safetensors)."""
    model = work / f"deployed-{arm}" / "results" / "deployed" / "model.safetensors"
    return hashlib.sha256(model.read_bytes()).hexdigest()


def simulated(rounds: int, work: Path) -> tuple[list[dict], float]:
    results = work / "results"
    config = (f"num-server-rounds={rounds} cache-dir='{work / 'cache-sim'}' results-dir='{results}' "
              "run-name='simulated' node-wait-timeout=600.0")
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "fedsynth.cli", "run", "--num-supernodes", str(NODES), "--run-config",
                    config], cwd=REPO_ROOT, env={**clean_env(), "PYTHONPATH": str(REPO_ROOT)}, check=True,
                   stdout=subprocess.DEVNULL)
    return rounds_of(results / "simulated"), time.monotonic() - start


def row(name: str, rounds: list[dict], wall: float) -> str:
    times = [r["round-time"] for r in rounds]
    server = [r["server-time"] for r in rounds]
    threads = sorted({r.get("stat-torch-threads-max") for r in rounds})
    return (f"| {name} | {', '.join(f'{t:.1f}' for t in times)} | {statistics.median(times):.1f} | "
            f"{statistics.median(server):.1f} | {', '.join(str(t) for t in threads)} | {wall:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/deployment-vs-simulation.md")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        sim, sim_wall = simulated(args.rounds, Path(tmp))
        dep, dep_wall = deployed(args.rounds, Path(tmp), "cold")
        warm, warm_wall = deployed(args.rounds, Path(tmp), "warm")
        adaptive, adaptive_wall = deployed(args.rounds, Path(tmp), "warm-adaptive")
        same_model = len({model_digest(Path(tmp), arm) for arm in ARMS}) == 1
    sim_median = statistics.median(r["round-time"] for r in sim)
    ratio = statistics.median(r["round-time"] for r in dep) / sim_median
    warm_ratio = statistics.median(r["round-time"] for r in warm) / sim_median
    adaptive_ratio = statistics.median(r["round-time"] for r in adaptive) / sim_median
    lines = [
        f"# Deployed vs simulated round time ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)", "",
        f"Command: `python benchmarks/deployment_vs_simulation.py --rounds {args.rounds}`: `make run`'s run config "
        f"(pyproject.toml defaults), {args.rounds} rounds, {NODES} nodes on this host, default threads, no "
        "OMP_NUM_THREADS, no PYTHONDONTWRITEBYTECODE (set on this machine, not on a SuperNode host or in the image); "
        "simulation, then the deployment with cold and with warm ClientApp processes (Flower's SuperNode waits), "
        "then warm with the adaptive waits, one after another in this run.", "",
        "| engine | round times (s) | median round (s) | median server time (s) | ClientApp threads | wall (s) |",
        "| --- | --- | --- | --- | --- | --- |",
        row(f"deployment, cold ClientApp processes (loopback, {NODES} SuperNodes, supernodes-per-host={NODES})",
            dep, dep_wall),
        row("deployment, warm ClientApp processes (`deploy/warm-clientapp`, the default of deploy/supernode.sh)",
            warm, warm_wall),
        row("deployment, warm, adaptive SuperNode waits (`deploy/supernode-waits.py`, deploy/supernode.sh's default)",
            adaptive, adaptive_wall),
        row(f"simulation (`--num-supernodes {NODES}`, `--cpus-per-client 1`)", sim, sim_wall),
        "", f"Deployed / simulated median round time: cold **{ratio:.2f}x**, warm **{warm_ratio:.2f}x**, warm with "
        f"adaptive waits **{adaptive_ratio:.2f}x** (target: within 1.5x on a quiet machine, load under 1).", "",
        "Final models of the three deployments (model.safetensors): "
        + ("**bitwise equal**." if same_model else "**DIFFERENT** (a bug: the same messages must give the same model)."),
    ]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    if not same_model:
        raise SystemExit("the deployments' final models differ")


if __name__ == "__main__":
    main()
