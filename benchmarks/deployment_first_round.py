"""A run's first round on a loopback deployment: the warm server started by the first task or with the SuperExec.

    python benchmarks/deployment_first_round.py [--repeats 3] [--wait 15] [--out FILE]

With warm ClientApp processes (`deploy/warm-clientapp` first on the SuperNode's `PATH`), each SuperNode's
warm server used to be started by its first ClientApp task, which ran cold (a new `flwr-clientapp` process
importing torch and Flower) while the server imported the same modules beside it. The `flower-superexec`
launcher in that folder now starts the server when the SuperNode starts its SuperExec, so the first task of
the first run is forked too. This measures both on fresh loopback federations (SuperLink + 2 SuperNodes,
`fedsynth.loopback`), the variants alternating, each repeat started `--wait` seconds after its nodes (a
federation whose nodes are up before the run is submitted, as in a deployment):

- "started by the first task": Flower's own `flower-superexec` ahead of the launcher on `PATH`, so only the
  `flwr-clientapp` shim is used (the behaviour before);
- "started with the SuperExec": the launcher's folder first on `PATH`, as deploy/supernode.sh sets it.

Reported per variant (medians over the repeats): the wall time of `flwr run` for a 2-round run (`make run`'s
config otherwise: the ServerApp's start, the handshake message, both rounds), each round's `round-time`, and
how many tasks ran cold (the shim's "no warm server" log line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.deployment_vs_simulation import host_environment, rounds_of  # noqa: E402
from fedsynth.loopback import BIN, WARM_CLIENTAPP_DIR, LoopbackFederation, app_copy  # noqa: E402

NODES = 2
VARIANTS = ("started by the first task", "started with the SuperExec")


def one_run(work: Path, app: Path, with_superexec: bool, wait: float) -> dict:
    """A fresh federation, `wait` s for its nodes, then a 2-round run: wall, round times, cold tasks."""
    work.mkdir()
    results = work / "results"
    config = " ".join(["num-server-rounds=2", f'cache-dir="{work / "cache"}"', f'results-dir="{results}"',
                       'run-name="run"', "node-wait-timeout=600.0", "checkpoint-every=0"])
    path = f"{WARM_CLIENTAPP_DIR}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}"
    if not with_superexec:  # Flower's own flower-superexec is found before the launcher's
        plain = work / "plain-superexec"
        plain.mkdir()
        (plain / "flower-superexec").symlink_to(BIN / "flower-superexec")
        path = f"{plain}{os.pathsep}{path}"
    with host_environment(), LoopbackFederation(work, num_nodes=NODES, node_config=f"supernodes-per-host={NODES}",
                                                extra_env={"PATH": path}, warm_clientapp=False) as federation:
        time.sleep(wait)
        start = time.monotonic()
        run = federation.run(app, config, timeout=1800)
        wall = time.monotonic() - start
        if not (results / "run" / "summary.json").is_file():
            raise SystemExit(run.stdout[-3000:] + run.stderr[-3000:] + federation.log_tails())
        logs = "".join(f.read_text(errors="replace") for f in federation.logs.glob("supernode-*.log"))
    rounds = rounds_of(results / "run")
    return {"wall": wall, "round-times": [r["round-time"] for r in rounds], "cold-tasks": logs.count("no warm server")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wait", type=float, default=15.0, help="seconds between the nodes' start and the run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/deployment-first-round.md")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    measured: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        app = app_copy(REPO_ROOT, Path(tmp) / "app")
        for repeat in range(args.repeats):
            for index, name in enumerate(VARIANTS):
                result = one_run(Path(tmp) / f"{repeat}-{index}", app, with_superexec=index == 1, wait=args.wait)
                measured[name].append(result)
                print(name, json.dumps(result), flush=True)
    median = {name: {"wall": statistics.median(r["wall"] for r in runs),
                     "round-1": statistics.median(r["round-times"][0] for r in runs),
                     "round-2": statistics.median(r["round-times"][1] for r in runs)} for name, runs in measured.items()}
    lines = [
        f"# A run's first rounds: the warm server started by the first task or with the SuperExec "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after)", "",
        f"Command: `python benchmarks/deployment_first_round.py --repeats {args.repeats} --wait {args.wait:g}`: "
        f"fresh loopback federations ({NODES} SuperNodes, `supernodes-per-host={NODES}`, no OMP_NUM_THREADS, no "
        f"PYTHONDONTWRITEBYTECODE), a 2-round run of `make run`'s config submitted {args.wait:g} s after the nodes "
        "started; the variants alternate.", "",
        "| warm server | `flwr run` wall (s), each repeat | median wall (s) | round 1 (s), median | round 2 (s), median "
        "| tasks run cold, each repeat |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in measured.items():
        walls = ", ".join(f"{r['wall']:.1f}" for r in runs)
        cold = ", ".join(str(r["cold-tasks"]) for r in runs)
        lines.append(f"| {name} | {walls} | {median[name]['wall']:.1f} | {median[name]['round-1']:.1f} | "
                     f"{median[name]['round-2']:.1f} | {cold} |")
    before, after = (median[name] for name in VARIANTS)
    lines += ["", f"Started with the SuperExec / by the first task: `flwr run` wall **{after['wall'] / before['wall']:.2f}x**, "
              f"round 1 {after['round-1'] / before['round-1']:.2f}x, round 2 {after['round-2'] / before['round-2']:.2f}x.",
              "", "A node's first ClientApp task is the run's handshake message, before round 1: that is the task "
              "which ran cold when the first task started the server, so the difference shows in the run's wall "
              "time, not in the rounds' `round-time` (which vary by a few seconds from run to run on this machine)."]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
