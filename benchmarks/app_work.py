"""The app's own work per message in simulation: where a trivial round's ClientApp time goes, part by part.

    .venv/bin/python benchmarks/app_work.py [--rounds 10] [--clients 10] [--repeats 2] [--out FILE]

Runs `benchmarks/overhead.py`'s trivial round (mlp, 1 local step of batch 8, no central evaluation, `make run`'s
other keys) on the in-process grid (fedsynth/inprocess.py: Flower's ServerApp and ClientApp logic, no Ray, one
message after the other), in two arms that alternate in one run:

- **each message as in a new process**: this process's copies of the partition files are dropped before every
  message (common/data/read_cache.py `clear`), so every message reads its node's `.npz`, as every message did
  before those copies were kept, and as a deployed message in a fresh process still does;
- **copies kept** (what a Ray actor and the in-process engine now do): a node's file is read once per process.

Each part of the ClientApp is timed where `client_app/app.py` calls it, in CPU seconds of this thread (the machine
is shared; wall times are reported beside them): the partition read, the conversion of the uint8 images to
normalised tensors, the local evaluation of the received model on the node's test split, the model's build, the
records' conversion to arrays, the run config's parsing, the local update itself and the reply's uplink records;
"the rest" is the ClientApp call's time outside those parts (Flower's Message and records, node settings, the
settings' checks, the metrics). Medians over rounds 2..N of every repeat; per message = per round / clients. The
server's work per round is the round's wall time less its messages' ClientApp wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from report import write_report

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: the ClientApp's CPU time is this thread's
os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# (client_app.app's name, the part it does)
PARTS: tuple[tuple[str, str], ...] = (
    ("load_client_data", "partition read (ours: common/data/partition.py)"),
    ("as_tensors", "uint8 images -> normalised tensors (ours: common/metrics/evaluation.py)"),
    ("evaluate_model", "local evaluation of the received model on the test split (ours)"),
    ("make_model", "model build (ours: common/run/task.py; torch's init)"),
    ("from_record", "records -> arrays (Flower's `Array.numpy`: `np.load` per array)"),
    ("parse_run_config", "run config parsed and checked (ours: common/run/config.py)"),
    ("client_update", "the local update (ours: the rule; 1 step here)"),
    ("uplink_records", "the reply's model records (ours: client_app/train_reply.py)"),
)
REST = "the rest of the ClientApp call (Flower's Message and records; node settings, checks, metrics)"
ARMS = ("each message as in a new process", "copies kept")


class Clock:
    """CPU and wall seconds spent in each timed part, and in the ClientApp calls, per round."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    def timed(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.cpu[label] += time.thread_time() - cpu
                self.wall[label] += time.perf_counter() - wall

        return run


def install(clock: Clock, clear_each_message: list[bool], exchanges: list[dict[str, float]]) -> Callable[[], None]:
    """Time client_app.app's parts and the in-process grid's ClientApp calls into `clock`; each train exchange of
    the grid (one round's messages) appends its parts' CPU and wall seconds to `exchanges`. Returns what puts the
    modules back."""
    import client_app.app as client
    import fedsynth.inprocess as inprocess
    from common.data import read_cache

    originals = [(client, name, getattr(client, name)) for name, _ in PARTS]
    originals += [(inprocess, "client_app", inprocess.client_app),
                  (inprocess.InProcessGrid, "send_and_receive", inprocess.InProcessGrid.send_and_receive)]
    for name, label in PARTS:
        function = getattr(client, name)
        if name == "client_update":  # it returns the rule; the rule's run is the part
            def pick(cfg: Any, _pick: Callable[..., Any] = function, _label: str = label) -> Callable[..., Any]:
                return clock.timed(_label, _pick(cfg))
            setattr(client, name, pick)
        else:
            setattr(client, name, clock.timed(label, function))
    app = inprocess.client_app

    def call(message: Any, context: Any) -> Any:
        if clear_each_message[0]:
            read_cache.clear()
        return clock.timed("ClientApp", app)(message, context)

    inprocess.client_app = call
    send_and_receive = inprocess.InProcessGrid.send_and_receive

    def exchange(grid: Any, messages: Any, *, timeout: float | None = None) -> Any:
        messages = list(messages)
        cpu, wall = dict(clock.cpu), dict(clock.wall)
        replies = send_and_receive(grid, messages, timeout=timeout)
        if messages and messages[0].metadata.message_type.startswith("train"):
            exchanges.append({**{f"cpu:{k}": v - cpu.get(k, 0.0) for k, v in clock.cpu.items()},
                              **{f"wall:{k}": v - wall.get(k, 0.0) for k, v in clock.wall.items()}})
        return replies

    inprocess.InProcessGrid.send_and_receive = exchange

    def restore() -> None:
        for owner, name, value in originals:
            setattr(owner, name, value)

    return restore


def one_run(rounds: int, clients: int, exchanges: list[dict[str, float]], tag: str) -> list[dict[str, float]]:
    """A trivial in-process run; per round after the first: its wall time and its parts' CPU and wall seconds."""
    from fedsynth.app_config import app_defaults
    from fedsynth.inprocess import InProcessGrid, run_federation
    from fedsynth.simulation import find_app_dir

    raw = {**app_defaults(find_app_dir()), "num-server-rounds": rounds, "model": "mlp", "local-steps": 1,
           "batch-size": 8, "central-eval": False, "checkpoint-every": 0, "save-model": False,
           "results-dir": "/tmp/fedsynth-app-work", "run-name": f"{tag}-{time.time_ns()}"}
    exchanges.clear()
    run_federation(raw, InProcessGrid(clients, raw))
    folder = Path(raw["results-dir"]) / raw["run-name"]
    times = [r["round-time"] for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
             if r["round"] >= 1]
    if len(times) != len(exchanges):
        raise SystemExit(f"{len(times)} rounds in metrics.jsonl but {len(exchanges)} train exchanges")
    return [{"round-time": t, **parts} for t, parts in zip(times, exchanges)][1:]


def median_of(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(row.get(key, 0.0) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm, alternating")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "app-work.md")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    clock, clear_each_message, exchanges = Clock(), [True], []
    restore = install(clock, clear_each_message, exchanges)
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    try:
        for repeat in range(args.repeats):
            for arm in ARMS:
                clear_each_message[0] = arm == ARMS[0]
                rows[arm] += one_run(args.rounds, args.clients, exchanges, f"arm{ARMS.index(arm)}-{repeat}")
    finally:
        restore()
    load_after = os.getloadavg()[0]
    per_message = {arm: {label: 1000 * median_of(rows[arm], f"cpu:{label}") / args.clients
                         for _, label in PARTS} for arm in ARMS}
    totals = {arm: 1000 * median_of(rows[arm], "cpu:ClientApp") / args.clients for arm in ARMS}
    walls = {arm: 1000 * median_of(rows[arm], "wall:ClientApp") / args.clients for arm in ARMS}
    for arm in ARMS:
        per_message[arm][REST] = max(totals[arm] - sum(per_message[arm].values()), 0.0)
    round_time = {arm: median_of(rows[arm], "round-time") for arm in ARMS}
    server = {arm: statistics.median(r["round-time"] - r.get("wall:ClientApp", 0.0) for r in rows[arm]) for arm in ARMS}
    old, new = ARMS
    lines = [
        f"# The app's own work per message in simulation ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"load average {load_before:.1f} before, {load_after:.1f} after)",
        "",
        f"Command: `.venv/bin/python benchmarks/app_work.py --rounds {args.rounds} --clients {args.clients} "
        f"--repeats {args.repeats}`: overhead.py's trivial round (mlp, 1 local step of batch 8, no central "
        f"evaluation) on the in-process grid, {args.clients} clients, the two arms alternating in this run; "
        "CPU ms of the ClientApp's thread per message, medians over rounds 2..N of every repeat.",
        "",
        f"| part (whose code) | {old} (ms/message) | {new} (ms/message) | ratio |",
        "| --- | --- | --- | --- |",
    ]
    for label in [label for _, label in PARTS] + [REST]:
        a, b = per_message[old][label], per_message[new][label]
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {b / a:.2f} |" if a > 0 else f"| {label} | {a:.2f} | {b:.2f} | |")
    lines += [
        f"| **the ClientApp's work per message, CPU** | **{totals[old]:.2f}** | **{totals[new]:.2f}** | "
        f"**{totals[new] / totals[old]:.2f}** |",
        f"| the ClientApp's work per message, wall | {walls[old]:.2f} | {walls[new]:.2f} | "
        f"{walls[new] / walls[old]:.2f} |",
        f"| the server's work per round, wall (ms; round less its ClientApp calls) | {1000 * server[old]:.0f} | "
        f"{1000 * server[new]:.0f} | {server[new] / server[old]:.2f} |",
        f"| the trivial round in process, wall (s) | {round_time[old]:.3f} | {round_time[new]:.3f} | "
        f"{round_time[new] / round_time[old]:.2f} |",
        "",
        f"Target: the app's own work at most 10 ms per message: {totals[new]:.1f} ms CPU "
        f"({'met' if totals[new] <= 10 else 'not met'}).",
    ]
    write_report(args.out, lines, rows)


if __name__ == "__main__":
    main()
