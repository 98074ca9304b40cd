"""What the SuperNodes' pulls cost the SuperLink: requests per second from 10 and 100 nodes, idle and in lockstep
rounds, with Flower's waits and with deploy/supernode-waits.py's adaptive ones, in one run.

    .venv/bin/python benchmarks/superlink_request_rate.py [--nodes 10,100] [--idle 30] [--rounds 5] [--work 1.0]
                                                          [--out benchmarks/results/superlink-request-rate.md]

A real `flower-superlink` (insecure, in-memory state) runs on 127.0.0.1. The SuperNodes are stand-ins: threads of
this process, each with Flower's own Fleet HTTP connection (`flwr.supernode.fleet_http_connection`: the node's
registration and activation, its heartbeats, its `PullMessages` requests), because 100 real SuperNodes (each a
process with its SuperExec) do not fit a 2-core machine. Each stand-in pulls as Flower 1.42's loop does (`flower`:
the next pull 3 s after an empty one, at once after a message) or as deploy/supernode-waits.py makes it (`adaptive`:
its `Backoff`, reset by a message). No run is submitted, so every pull the SuperLink answers is empty: the rounds'
messages are emulated. In a lockstep round the driver posts one message per node at once; a node takes its message
with the first pull that starts after it was posted (the delay is its pickup latency), trains for `--work` to 1.5
`--work` seconds, and is done; the next round starts `SERVER_STEP` s after the last node is done. The requests of
a message itself (the pull that brings it, its objects, the confirmation, the reply and its objects: the same
number under both policies) are not sent and not counted; the pulls counted are the ones the waits change.

Reported per policy and node count: pulls per second (all nodes together) idle (from when every node waits 3 s
after an empty pull: the adaptive ramp's end) and during the rounds, pulls per node and round, the pickup latency, and the SuperLink's CPU seconds per
second (its process's utime + stime) in each phase; with a linear scaling to 1,000 nodes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from fedsynth.loopback import BIN, free_ports, wait_for_port  # noqa: E402

SETTLE = 120.0  # s at most for every node to reach its idle wait (the adaptive ramp: 0.05 s x1.5 up to 3 s)
SERVER_STEP = 0.3  # s between a round's last reply and the next round's messages
FLOWER_WAIT = 3.0  # Flower 1.42's sleep after an empty pull (flwr/supernode/start_client_internal.py)


def launcher():  # type: ignore[no-untyped-def]
    """deploy/supernode-waits.py as a module (its `Backoff`)."""
    spec = importlib.util.spec_from_file_location("supernode_waits", REPO_ROOT / "deploy" / "supernode-waits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Node:
    """One stand-in SuperNode: its pulls' start times, its messages' pickup latencies."""

    policy: str
    pulls: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    posted: float | None = None  # the time its current message was posted, until it takes it
    done: threading.Event = field(default_factory=threading.Event)
    settled: threading.Event = field(default_factory=threading.Event)  # its wait after an empty pull is 3 s


def run_node(node: Node, address: str, stop: threading.Event, ready: threading.Barrier, work: float,
             rng: random.Random) -> None:
    """Flower's connection and the policy's pull loop, until `stop`."""
    from flwr.supernode.fleet_http_connection import http_request_response

    backoff = launcher().Backoff() if node.policy == "adaptive" else None
    with http_request_response(address, insecure=True) as connection:
        receive = connection[1]
        ready.wait()
        while not stop.is_set():
            started = time.monotonic()
            receive()  # one PullMessages request (empty: no run is submitted)
            node.pulls.append(started)
            if node.posted is not None and node.posted <= started:  # this pull brings the node's message
                node.latencies.append(started - node.posted)
                node.posted = None
                stop.wait(work * (1 + 0.5 * rng.random()))  # the ClientApp's work, then the reply
                node.done.set()
                if backoff is not None:
                    backoff.reset()
                continue  # Flower's loop pulls again right after pushing a reply
            wait = FLOWER_WAIT if backoff is None else backoff.next_wait()
            if wait >= FLOWER_WAIT:
                node.settled.set()
            stop.wait(wait)


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pulls_between(nodes: list[Node], start: float, end: float) -> int:
    return sum(1 for node in nodes for t in node.pulls if start <= t < end)


def measure(policy: str, count: int, superlink: subprocess.Popen, address: str, idle: float, rounds: int,
            work: float) -> dict[str, float]:
    """One policy with `count` nodes: the idle phase, then `rounds` lockstep rounds."""
    nodes = [Node(policy) for _ in range(count)]
    stop, ready = threading.Event(), threading.Barrier(count + 1)
    threads = [threading.Thread(target=run_node, args=(node, address, stop, ready, work, random.Random(i)),
                                daemon=True) for i, node in enumerate(nodes)]
    for thread in threads:
        thread.start()
    ready.wait()
    settle_by = time.monotonic() + SETTLE
    for node in nodes:  # the idle phase starts once every node waits Flower's 3 s after an empty pull
        node.settled.wait(max(settle_by - time.monotonic(), 0))
    idle_start, idle_cpu = time.monotonic(), cpu_seconds(superlink.pid)
    time.sleep(idle)
    idle_end, idle_cpu = time.monotonic(), cpu_seconds(superlink.pid) - idle_cpu
    busy_cpu = cpu_seconds(superlink.pid)
    for _ in range(rounds):
        posted = time.monotonic()
        for node in nodes:
            node.done.clear()
            node.posted = posted
        for node in nodes:
            node.done.wait()
        time.sleep(SERVER_STEP)
    busy_end, busy_cpu = time.monotonic(), cpu_seconds(superlink.pid) - busy_cpu
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    latencies = [latency for node in nodes for latency in node.latencies]
    busy_pulls = pulls_between(nodes, idle_end, busy_end)
    return {
        "idle-rps": pulls_between(nodes, idle_start, idle_end) / (idle_end - idle_start),
        "idle-cpu": idle_cpu / (idle_end - idle_start),
        "busy-rps": busy_pulls / (busy_end - idle_end),
        "busy-cpu": busy_cpu / (busy_end - idle_end),
        "pulls-per-node-round": busy_pulls / (count * rounds),
        "round-s": (busy_end - idle_end) / rounds,
        "latency-median": statistics.median(latencies),
        "latency-max": max(latencies),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10,100", help="comma-separated node counts")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle phase")
    parser.add_argument("--rounds", type=int, default=5, help="lockstep rounds")
    parser.add_argument("--work", type=float, default=1.0, help="a node's training: WORK to 1.5 WORK seconds")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/superlink-request-rate.md")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.nodes.split(",") if n]
    load_before = os.getloadavg()[0]
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "FLWR_HOME": tmp, "FLWR_LOG_LEVEL": "WARNING", "FLWR_TELEMETRY_ENABLED": "0",
               "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # its own executor: flower-superexec
        with open(Path(tmp) / "superlink.log", "w") as log:
            superlink = subprocess.Popen([str(BIN / "flower-superlink"), "--insecure", "--port", str(port),
                                          "--disable-runtime-dependency-installation"],  # state in memory
                                         env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
            try:
                wait_for_port(port, 60)
                for count in counts:
                    for policy in ("flower", "adaptive"):
                        results[(policy, count)] = measure(policy, count, superlink, address, args.idle, args.rounds,
                                                           args.work)
                        print(policy, count, results[(policy, count)], flush=True)
            finally:
                superlink.terminate()
                superlink.wait(timeout=60)
    text = report(results, args, load_before)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


def report(results: dict[tuple[str, int], dict[str, float]], args: argparse.Namespace, load_before: float) -> str:
    lines = [
        f"# SuperLink requests from idle and busy SuperNodes: Flower's waits and the adaptive ones "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after)", "",
        f"Command: `.venv/bin/python benchmarks/superlink_request_rate.py --nodes {args.nodes} --idle {args.idle:g} "
        f"--rounds {args.rounds} --work {args.work:g}`. A real `flower-superlink` on 127.0.0.1; stand-in SuperNodes "
        "(threads with Flower's own Fleet HTTP connection: registration, heartbeats, PullMessages), because 100 real "
        "SuperNodes do not fit 2 cores; the rounds' messages emulated (the pulls counted are the empty ones, the "
        "requests the waits change; a message's own requests are the same under both and not counted). "
        f"Idle: {args.idle:g} s, from when every node waits 3 s after an empty pull (the adaptive ramp's end). "
        "At 100 nodes the stand-ins' own process (100 threads beside the SuperLink on this machine) slows every "
        f"request, which lowers both policies' rates and lengthens the pickups. Lockstep: {args.rounds} rounds, each node training "
        f"{args.work:g}-{1.5 * args.work:g} s, {SERVER_STEP:g} s server step.", "",
        "| nodes | waits | idle pulls/s | idle SuperLink CPU s/s | busy pulls/s | busy SuperLink CPU s/s "
        "| pulls per node and round | message pickup latency, median / max (s) | round (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (policy, count), r in sorted(results.items(), key=lambda item: (item[0][1], item[0][0] != "flower")):
        lines.append(f"| {count} | {policy} | {r['idle-rps']:.2f} | {r['idle-cpu']:.3f} | {r['busy-rps']:.2f} | "
                     f"{r['busy-cpu']:.3f} | {r['pulls-per-node-round']:.1f} | {r['latency-median']:.2f} / "
                     f"{r['latency-max']:.2f} | {r['round-s']:.2f} |")
    lines += ["", "Per node and scaled linearly to 1,000 nodes (each pull is one small request; the SuperLink's work "
              "per request is what the CPU columns measure):", ""]
    for (policy, count), r in sorted(results.items(), key=lambda item: (item[0][1], item[0][0] != "flower")):
        lines.append(f"- {policy}, from {count} nodes: idle {r['idle-rps'] / count:.3f} pulls/s a node "
                     f"(1,000 nodes: {1000 * r['idle-rps'] / count:.0f}/s, about "
                     f"{1000 * r['idle-cpu'] / count:.2f} SuperLink CPU s/s), busy {r['busy-rps'] / count:.3f} "
                     f"a node (1,000 nodes: {1000 * r['busy-rps'] / count:.0f}/s, about "
                     f"{1000 * r['busy-cpu'] / count:.2f} CPU s/s)")
    for count in sorted({c for _, c in results}):
        flower, adaptive = results.get(("flower", count)), results.get(("adaptive", count))
        if flower and adaptive:
            lines.append(f"- {count} nodes, adaptive / Flower: idle pulls {adaptive['idle-rps'] / flower['idle-rps']:.2f}x, "
                         f"busy pulls {adaptive['busy-rps'] / flower['busy-rps']:.2f}x, median pickup "
                         f"{adaptive['latency-median']:.2f} s against {flower['latency-median']:.2f} s")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
