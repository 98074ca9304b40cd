"""Memory over a long simulation: does the server or any client grow without bound?

Runs `fedsynth run` in Flower's simulation engine (in this process, as `make run`
does) for many rounds of a small model and samples the resident memory of this
process (the ServerApp runs here) and of the ClientApp actor processes every
half second. Reports the first/last-quarter means and the maximum; growth is
the last-quarter mean minus the first-quarter mean (after the first rounds,
when imports and caches are warm).

    .venv/bin/python benchmarks/memory.py --rounds 200 --out benchmarks/results/memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

from fedsynth.simulation import find_app_dir, run_simulation


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def client_actor_pids() -> list[int]:
    """PIDs of Ray's ClientApp actor processes."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"ClientAppActor" in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def sample(stop: threading.Event, samples: list[dict]) -> None:
    start = time.monotonic()
    while not stop.is_set():
        actors = client_actor_pids()
        samples.append({
            "t": time.monotonic() - start,
            "server": rss_mb(os.getpid()),
            "clients": [rss_mb(pid) for pid in actors],
        })
        stop.wait(0.5)


def summarize(values: list[float]) -> dict[str, float]:
    quarter = max(len(values) // 4, 1)
    first, last = values[quarter:2 * quarter] or values[:quarter], values[-quarter:]
    return {
        "first-quarter-mb": sum(first) / len(first),
        "last-quarter-mb": sum(last) / len(last),
        "max-mb": max(values),
        "growth-mb": sum(last) / len(last) - sum(first) / len(first),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/memory.md"))
    args = parser.parse_args()
    samples: list[dict] = []
    stop = threading.Event()
    thread = threading.Thread(target=sample, args=(stop, samples), daemon=True)
    thread.start()
    overrides = {
        "num-server-rounds": args.rounds, "model": "mlp", "local-steps": 2, "batch-size": 32,
        "eval-every": 10, "checkpoint-every": 10, "run-name": f"memory-{int(time.time())}",
        "results-dir": "/tmp/fedsynth-memory-results",
    }
    started = time.monotonic()
    try:
        run_simulation(find_app_dir(), overrides, num_supernodes=args.nodes, cpus_per_client=1.0)
        elapsed = time.monotonic() - started
    finally:  # a failed run leaves no sampling thread behind
        stop.set()
        thread.join()
    server = summarize([s["server"] for s in samples])
    clients = summarize([sum(s["clients"]) for s in samples if s["clients"]])
    lines = [
        f"# Memory over {args.rounds} rounds ({args.nodes} simulated clients, mlp, Fashion-MNIST; {elapsed:.0f} s)",
        "",
        "Command: `.venv/bin/python benchmarks/memory.py --rounds "
        f"{args.rounds} --nodes {args.nodes}`; resident memory sampled every 0.5 s.",
        "",
        "| process | first quarter MB | last quarter MB | max MB | growth MB |",
        "| --- | --- | --- | --- | --- |",
        f"| server (this process) | {server['first-quarter-mb']:.0f} | {server['last-quarter-mb']:.0f} | {server['max-mb']:.0f} | {server['growth-mb']:+.1f} |",
        f"| ClientApp actors (sum) | {clients['first-quarter-mb']:.0f} | {clients['last-quarter-mb']:.0f} | {clients['max-mb']:.0f} | {clients['growth-mb']:+.1f} |",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"server": server, "clients": clients, "samples": samples}))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
