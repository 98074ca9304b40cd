"""Deployment overhead: what one ClientApp message costs in Flower's deployment engine, against `import torch`.

    .venv/bin/python benchmarks/deployment.py [--rounds 8] [--poll-interval S] [--out FILE]

In the deployment engine every ClientApp message runs in a new
`flwr-clientapp` process, so each message pays a Python start-up with torch
before any work; `python -c 'import torch'` is the floor of that design. One
run of this script measures, on this machine:

- the floor: wall time of `python -c 'import torch'` (median of 5);
- the message process's imports: what `flwr-clientapp` imports (`flwr.supernode.cli`) plus this
  app's ClientApp module (median of 5): the part of a message's cost the app controls;
- a loopback deployment (`fedsynth.loopback`: SuperLink + 2 SuperNodes, the
  apps started per message by the SuperNodes' `flower-superexec`) running
  trivial FedAvg rounds on Fashion-MNIST (mlp, one local step, no central evaluation): each
  round is one train message per node, handled in parallel, so the round's
  wall time minus the server's own work is the time of one message from the
  server's view: process start, imports, gRPC pulls and pushes, and Flower's
  polling: an idle SuperNode asks the SuperLink for work every 3 s, its
  SuperExec looks for new tasks every `FLWR_SUPEREXEC_TASK_POLL_INTERVAL`
  (1 s by default; `--poll-interval` sets it), and the SuperNode checks for
  the reply every 0.5 s (flwr 1.41 and 1.42, `supernode/start_client_internal.py`);
- the lifetime of every `flwr-clientapp` process (sampled from /proc), which
  splits a message into the process's own time and the waits around it;

and reports each as a ratio to the floor (issue 9's target for the message's
own overhead: within 1.5x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from fedsynth.loopback import LoopbackFederation  # noqa: E402


def command_time(code: str, repeats: int) -> float:
    """Median wall time of `python -c code` in a fresh process, run from the repository root."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class ClientAppWatcher(threading.Thread):
    """Samples /proc every `period` s and records how long each `flwr-clientapp` process lived.

    A message's time as the server sees it is the process's lifetime (start-up,
    imports, the app's work, the reply push) plus the time Flower's components
    spend before starting it and after it exits (their polling); the lifetimes
    split the two apart.
    """

    def __init__(self, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.seen: dict[int, list[float]] = {}  # pid -> [first seen, last seen]
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now = time.monotonic()
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    cmdline = Path(entry.path, "cmdline").read_bytes()
                except OSError:
                    continue
                # a cold task, or a warm task's shim (which lives as long as its task); not the warm server
                if (b"flwr-clientapp" in cmdline and b"flower-superexec" not in cmdline
                        and b"warm_clientapp/server.py" not in cmdline):
                    self.seen.setdefault(int(entry.name), [now, now])[1] = now
            time.sleep(self.period)

    def lifetimes(self) -> list[float]:
        return [last - first for first, last in self.seen.values()]


SHORT_PULL_SLEEP = """\
# benchmarks/deployment.py: measure what Flower's hard-coded 3 s sleep after an empty pull costs, by
# making it 0.1 s in flower-supernode processes only (a measurement, never a deployment setting)
import sys, time
if sys.argv and sys.argv[0].endswith("flower-supernode"):
    _sleep = time.sleep
    time.sleep = lambda seconds: _sleep(0.1 if seconds == 3 else seconds)
"""


def deployment_rounds(rounds: int, poll_interval: float | None, workdir: Path, warm: bool = False,
                      short_pull_sleep: bool = False, entry: str | None = None) -> tuple[list[dict], list[float]]:
    """Per-round metrics of a trivial FedAvg run on a loopback SuperLink with 2 SuperNodes, and the
    lifetimes of its ClientApp processes (cold, or `warm` ClientApp processes, whose tasks run `entry`
    when given; `short_pull_sleep`: the SuperNodes' 3 s sleep after an empty pull made 0.1 s, through a
    sitecustomize)."""
    results = workdir / "results"
    config = " ".join([
        'model="mlp"', f"num-server-rounds={rounds}", "local-steps=1", "batch-size=8", "central-eval=false",
        "checkpoint-every=0", "save-model=false", f'cache-dir="{workdir / "cache"}"',
        f'results-dir="{results}"', 'run-name="run"', "node-wait-timeout=120.0",
    ])
    extra = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(poll_interval)} if poll_interval else {}
    if entry:
        extra["FEDSYNTH_WARM_CLIENTAPP_ENTRY"] = entry
    if short_pull_sleep:
        (workdir / "site").mkdir()
        (workdir / "site" / "sitecustomize.py").write_text(SHORT_PULL_SLEEP)
        extra["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir / "site"), os.environ.get("PYTHONPATH")) if p)
    watcher = ClientAppWatcher()
    with LoopbackFederation(workdir, num_nodes=2, extra_env=extra, warm_clientapp=warm) as federation:
        watcher.start()
        run = federation.run(REPO_ROOT, config, timeout=900)
        watcher.done.set()
        metrics = results / "run" / "metrics.jsonl"
        if not metrics.is_file():
            raise SystemExit(run.stdout[-3000:] + run.stderr[-3000:] + federation.log_tails())
    watcher.join()
    rounds_metrics = [json.loads(line) for line in metrics.read_text().splitlines() if json.loads(line)["round"] >= 1]
    return rounds_metrics, watcher.lifetimes()


VARIANTS = {  # name -> deployment_rounds keyword arguments
    "cold (a new `flwr-clientapp` process per message)": {},
    "warm, each task running Flower's `flwr-clientapp` function as is (the launcher before `task.py`)":
        {"warm": True, "entry": "flwr.supernode.cli:flwr_clientapp"},
    "warm (`deploy/warm-clientapp`: forked from a warm server, an installed FAB not extracted again)": {"warm": True},
    "warm, SuperNode pull sleep 3 s -> 0.1 s (measurement only)": {"warm": True, "short_pull_sleep": True},
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--poll-interval", type=float, default=None,
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes (Flower's default: 1 s)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/deployment.md")
    args = parser.parse_args(argv)
    # This machine sets PYTHONDONTWRITEBYTECODE for every process; a SuperNode host or the image does not,
    # and with it every task would compile the app's ~80 modules again (0.5 s of a warm task's life here).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    load_before = os.getloadavg()[0]
    floor = command_time("import torch", args.repeats)
    imports = command_time("from flwr.supernode.cli import flwr_clientapp; import client_app.app", args.repeats)
    measured = {}
    for name, options in VARIANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            rounds, lifetimes = deployment_rounds(args.rounds, args.poll_interval, Path(tmp), **options)
        # the first round also pays the nodes' first contact, the partition cache build and (warm) the
        # warm server's start; lifetimes in start order: skip the handshake's and the first round's
        steady = rounds[1:]
        message = statistics.median(r["round-time"] - r["server-time"] for r in steady)
        process = statistics.median(lifetimes[4:] or lifetimes) if lifetimes else float("nan")
        measured[name] = (rounds, lifetimes, message, process)
    poll = f"{args.poll_interval:g} s" if args.poll_interval else "Flower's default (1 s)"
    lines = [
        f"# Deployment overhead per ClientApp message ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} at the end)",
        "",
        f"Command: `.venv/bin/python benchmarks/deployment.py --rounds {args.rounds}"
        + (f" --poll-interval {args.poll_interval:g}" if args.poll_interval else "") + "`; "
        f"loopback SuperLink + 2 SuperNodes, trivial FedAvg rounds (mlp, 1 local step), SuperExec task poll "
        f"interval {poll}; the deployments one after another in this run; no PYTHONDONTWRITEBYTECODE (a "
        "SuperNode host or the image does not set it; this machine does), so an app's modules compile once.",
        "",
        f"- `python -c 'import torch'` (the floor, median of {args.repeats}): {floor:.2f} s",
        f"- a cold ClientApp process's imports: `flwr-clientapp`'s and `client_app.app` (median of {args.repeats}): "
        f"{imports:.2f} s ({imports / floor:.2f}x the floor)",
        "",
        f"| ClientApp processes | one message (median of rounds 2-{args.rounds}: round time - server time) (s) | "
        f"a task process's life (median after round 1, sampled every 50 ms) (s) | outside the process (s) | "
        "process life / floor |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, (_, _, message, process) in measured.items():
        lines.append(f"| {name} | {message:.2f} | {process:.2f} | {message - process:.2f} | {process / floor:.2f} |")
    lines += [
        "",
        "A task process's life: from its start to its exit (for a warm task, its `flwr-clientapp` shim, which "
        "lives as long as the forked task). Outside the process: Flower's components between the server's push "
        "and the reply's arrival; most of it is one fixed wait: after pushing a reply a SuperNode pulls again, "
        "finds nothing (the server is still collecting the round) and sleeps 3 s (`time.sleep(3)`, hard-coded "
        "in flwr 1.42's `start_client_internal.py`), so in lockstep rounds the next message waits out that "
        "sleep; the third row makes that sleep 0.1 s to show its cost.",
        "",
    ]
    for name, (rounds, lifetimes, _, _) in measured.items():
        lines += [f"- {name}: round times (s) {', '.join(format(r['round-time'], '.2f') for r in rounds)}; "
                  f"task process lives (s) {', '.join(format(t, '.2f') for t in lifetimes)}"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
