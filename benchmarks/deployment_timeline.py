"""Where a deployed round's time goes: a timeline of one message's path through Flower's components.

    .venv/bin/python benchmarks/deployment_timeline.py [--rounds 4] [--cold | --adaptive] [--out FILE]

Runs `make run`'s config (pyproject.toml defaults) on a loopback deployment of 2 SuperNodes
(`fedsynth.loopback`, warm ClientApp processes unless `--cold`; Flower's own SuperNode waits, or with `--adaptive`
deploy/supernode-waits.py's, deploy/supernode.sh's default) with a `sitecustomize` on every process's
`PYTHONPATH` that writes a timestamp when these Flower 1.42 functions return (it changes nothing else):

- the ServerApp's `HttpGrid.push_messages` and `HttpGrid.pull_messages` (those that return a reply);
- the SuperNode's `_pull_and_store_message` (those that return a message) and `_push_messages`
  (`flwr/supernode/start_client_internal.py`);
- the ClientApp task's `flwr_clientapp`, `pull_task_input`, `ClientApp.__call__` and `push_message`.

For every round after the first and every node it reports, along the path of that node's message:

    server push -> node pulls -> task gets its input -> the ClientApp's work -> task ends
      -> node pushes the reply -> server has pulled every reply -> server's next push

The waits between them are Flower's: a SuperNode sleeps 3 s after an empty pull, pulls an object that is not
there yet again after 1 s, then 2 s, ... (`PULL_INITIAL_BACKOFF`, `flwr/supercore/constant.py`), and looks
for a task's reply every 0.5 s; the ServerApp pulls a reply's objects with the same backoff. Medians over
rounds 2..N and nodes; the steps overlap between the two nodes, so they do not add up to the round exactly.
With `--adaptive` the SuperNode's waits are the launcher's (after an empty pull 0.05 s, x1.5 each, up to 3 s; an
object's first retry after 0.05 s; the reply pushed once stored). The report ends with the final model's sha256:
the arms run the same messages, so it is the same in all three (a difference is a bug).
This machine's PYTHONDONTWRITEBYTECODE is dropped, as in benchmarks/deployment.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.deployment_vs_simulation import host_environment  # noqa: E402
from fedsynth.loopback import LoopbackFederation  # noqa: E402

NODES = 2

TRACER = r'''
import functools, importlib.abc, importlib.util, os, sys, time

TRACE = os.environ["DEPLOYMENT_TIMELINE_TRACE"]
WRAP = {
    "flwr.superlink.grid.http_grid": ["HttpGrid.push_messages", "HttpGrid.pull_messages"],
    "flwr.supernode.start_client_internal": ["_pull_and_store_message", "_push_messages"],
    "flwr.supernode.cli": ["flwr_clientapp"],
    "flwr.supernode.runtime.run_clientapp": ["pull_task_input", "push_message"],
    "flwr.clientapp.client_app": ["ClientApp.__call__"],
}


def who():
    """'server', or the node's Runtime API port (a SuperNode's --port, a task's --runtime-api-address)."""
    argv = sys.argv
    if "serverapp" in os.path.basename(argv[0]):
        return "server"
    for flag in ("--port", "--runtime-api-address"):
        if flag in argv:
            return argv[argv.index(flag) + 1].rsplit(":", 1)[-1]
    return "server"


def traced(function, name):
    @functools.wraps(function)
    def call(*args, **kwargs):
        start, result = time.time(), "exited"  # flwr_clientapp ends by sys.exit
        try:
            result = function(*args, **kwargs)
            if name == "HttpGrid.pull_messages":
                result = list(result)
            return result
        finally:
            if not (result is None and name == "_pull_and_store_message" or result == []):  # an empty pull
                with open(TRACE, "a") as out:
                    out.write(f"{who()} {name} {start:.4f} {time.time():.4f}\n")
    return call


class Tracer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WRAP:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for dotted in WRAP[name]:
                owner_name, _, attribute = dotted.rpartition(".")
                owner = getattr(module, owner_name) if owner_name else module
                setattr(owner, attribute, traced(getattr(owner, attribute), dotted))

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Tracer())
'''

STEPS = [  # (label, from event, to event); an event is (who, function, "start" | "end")
    ("server pushes the round's messages", ("server", "HttpGrid.push_messages", "start"),
     ("server", "HttpGrid.push_messages", "end")),
    ("the node's next pull begins (Flower's 3 s sleep after an empty pull)", ("server", "HttpGrid.push_messages", "start"),
     ("node", "_pull_and_store_message", "start")),
    ("the node pulls the message and its objects", ("node", "_pull_and_store_message", "start"),
     ("node", "_pull_and_store_message", "end")),
    ("the task has its input (SuperExec start, the task's pull)", ("node", "_pull_and_store_message", "end"),
     ("node", "pull_task_input", "end")),
    ("the task loads the app", ("node", "pull_task_input", "end"), ("node", "ClientApp.__call__", "start")),
    ("the ClientApp's work (evaluate, train)", ("node", "ClientApp.__call__", "start"),
     ("node", "ClientApp.__call__", "end")),
    ("the task hands the reply to its node and ends", ("node", "ClientApp.__call__", "end"),
     ("node", "flwr_clientapp", "end")),
    ("the node notices the reply and pushes it", ("node", "flwr_clientapp", "end"), ("node", "_push_messages", "end")),
    ("the server has pulled every reply", ("last node", "_push_messages", "end"),
     ("server", "HttpGrid.pull_messages", "end")),
    ("the server's own work until its next push", ("server", "HttpGrid.pull_messages", "end"),
     ("server", "next push", "start")),
]


def read_trace(path: Path) -> list[tuple[str, str, float, float]]:
    return [(who, name, float(start), float(end)) for who, name, start, end in
            (line.split() for line in path.read_text().splitlines())]


def round_windows(events: list[tuple[str, str, float, float]]) -> list[tuple[float, float]]:
    """(start, end) of every round: from one push of the server to its next."""
    pushes = sorted(start for who, name, start, _ in events if name == "HttpGrid.push_messages")
    return list(zip(pushes, pushes[1:]))


def step_times(events: list[tuple[str, str, float, float]]) -> dict[str, list[float]]:
    """Every step's durations over the rounds after the first (the first includes the warm-up) and nodes."""
    nodes = sorted({who for who, *_ in events if who != "server"})
    durations: dict[str, list[float]] = {label: [] for label, *_ in STEPS}
    for begin, end in round_windows(events)[1:]:
        def at(who: str, name: str, edge: str) -> float | None:
            if name == "next push":
                return end
            times = [(s if edge == "start" else e) for w, n, s, e in events
                     if w == who and n == name and begin <= s < end]
            return (max if name == "HttpGrid.pull_messages" else min)(times) if times else None

        last_push = max((t for node in nodes if (t := at(node, "_push_messages", "end")) is not None), default=None)
        for label, source, target in STEPS:
            per_node = "node" in (source[0], target[0])
            for node in (nodes if per_node else ["server"]):
                def resolve(event: tuple[str, str, str]) -> float | None:
                    who, name, edge = event
                    if who == "last node":
                        return last_push
                    return at(node if who == "node" else who, name, edge)

                a, b = resolve(source), resolve(target)
                if a is not None and b is not None:
                    durations[label].append(b - a)
    return durations


def task_overheads(events: list[tuple[str, str, float, float]]) -> list[float]:
    """Every task's life (`flwr_clientapp`, start to exit) less its ClientApp's work, after the first round."""
    windows = round_windows(events)[1:]
    first = windows[0][0] if windows else float("inf")
    lives = sorted((s, e - s, who) for who, name, s, e in events if name == "flwr_clientapp" and s >= first)
    calls = sorted((s, e - s, who) for who, name, s, e in events if name == "ClientApp.__call__" and s >= first)
    overheads = []
    for start, life, who in lives:
        work = next((d for s, d, w in calls if w == who and s >= start), None)
        if work is not None:
            overheads.append(life - work)
    return overheads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cold", action="store_true", help="every task a new flwr-clientapp process")
    parser.add_argument("--adaptive", action="store_true",
                        help="the SuperNodes' adaptive waits (deploy/supernode-waits.py) instead of Flower's")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/deployment-timeline.md")
    args = parser.parse_args(argv)
    if args.cold and args.adaptive:
        parser.error("--adaptive is an arm of the warm deployment: give --cold or --adaptive")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "site").mkdir()
        (work / "site" / "sitecustomize.py").write_text(TRACER)
        trace = work / "trace.txt"
        results = work / "results"
        config = " ".join([f"num-server-rounds={args.rounds}", f'cache-dir="{work / "cache"}"',
                           f'results-dir="{results}"', 'run-name="run"', "node-wait-timeout=600.0"])
        extra = {"PYTHONPATH": str(work / "site"), "DEPLOYMENT_TIMELINE_TRACE": str(trace)}
        with host_environment(), LoopbackFederation(work, num_nodes=NODES, node_config=f"supernodes-per-host={NODES}",
                                                    extra_env=extra, warm_clientapp=not args.cold,
                                                    adaptive_waits=args.adaptive) as federation:
            run = federation.run(REPO_ROOT, config, timeout=1800)
            if not (results / "run" / "summary.json").is_file():
                raise SystemExit(run.stdout[-3000:] + run.stderr[-3000:] + federation.log_tails())
        model = hashlib.sha256((results / "run" / "model.safetensors").read_bytes()).hexdigest()
        rounds = [json.loads(line) for line in (results / "run" / "metrics.jsonl").read_text().splitlines()]
        events = read_trace(trace)
        durations, overheads = step_times(events), task_overheads(events)
    round_times = [r["round-time"] for r in rounds if r["round"] >= 2]
    median_round = statistics.median(round_times)
    kind = "cold (a new process per task)" if args.cold else "warm (deploy/warm-clientapp)"
    kind += ", adaptive SuperNode waits (deploy/supernode-waits.py)" if args.adaptive else ", Flower's SuperNode waits"
    lines = [
        f"# Where a deployed round's time goes ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)", "",
        f"Command: `.venv/bin/python benchmarks/deployment_timeline.py --rounds {args.rounds}"
        + (" --cold" if args.cold else "") + (" --adaptive" if args.adaptive else "") + f"`; `make run`'s config, {NODES} SuperNodes on loopback, ClientApp "
        f"processes {kind}; every step's median over rounds 2-{args.rounds} and both nodes (the nodes' steps "
        "overlap, so they do not add up to the round exactly).", "",
        f"Median round time (rounds 2-{args.rounds}): **{median_round:.2f} s** ({', '.join(f'{t:.1f}' for t in round_times)}).", "",
        "| step (Flower's waits in brackets) | median (s) | share of the median round | all (s) |",
        "| --- | --- | --- | --- |",
    ]
    for label, *_ in STEPS:
        values = durations[label]
        if values:
            median = statistics.median(values)
            lines.append(f"| {label} | {median:.2f} | {median / median_round:.0%} | "
                         f"{', '.join(f'{v:.2f}' for v in values)} |")
    lines += ["", f"A task's life beyond its ClientApp's work (from `flwr_clientapp`'s start, which comes while its node is "
              f"still pulling the message, to its exit): median **{statistics.median(overheads):.2f} s** "
              f"({', '.join(f'{v:.2f}' for v in overheads)}).", "", f"Final model (model.safetensors) sha256: `{model}`."]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
