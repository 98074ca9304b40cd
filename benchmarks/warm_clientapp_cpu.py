"""CPU seconds a ClientApp task spends importing before the app's work: cold process vs forked warm child.

    PYTHONPATH=. .venv/bin/python benchmarks/warm_clientapp_cpu.py [--repeats 3]

Cold: a new Python process importing what a `flwr-clientapp` task imports before it trains
(`flwr.supernode.cli` and `client_app.app`). Warm: a child forked from a process that ran the warm
server's preload (fedsynth/warm_clientapp/server.py, `PRELOAD`), importing `client_app.app` (the app
is never preloaded). CPU seconds (user + sys, from the kernel's accounting) rather than wall time,
because they hardly change with the machine's load; wall times are printed too.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
COLD_IMPORTS = "import flwr.supernode.cli, client_app.app"


def cold(repeats: int) -> list[tuple[float, float]]:
    """(CPU s, wall s) of each fresh process importing `COLD_IMPORTS`."""
    runs = []
    for _ in range(repeats):
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run([sys.executable, "-c", COLD_IMPORTS], cwd=REPO_ROOT, check=True)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall))
    return runs


def warm(repeats: int) -> list[tuple[float, float]]:
    """(CPU s, wall s) of each child forked after the warm server's preload, importing the app."""
    sys.path.insert(0, str(REPO_ROOT / "fedsynth" / "warm_clientapp"))
    import server  # noqa: PLC0415 - run by path, as the shim runs it

    server.preload(server.PRELOAD.split(","))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            import client_app.app  # noqa: F401, PLC0415

            os._exit(0)
        _, _, usage = os.wait4(pid, 0)
        runs.append((usage.ru_utime + usage.ru_stime, time.perf_counter() - start))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    cold_runs, warm_runs = cold(args.repeats), warm(args.repeats)
    for name, runs in (("cold process", cold_runs), ("warm forked child", warm_runs)):
        print(f"{name}: CPU s median {statistics.median(c for c, _ in runs):.2f} "
              f"({', '.join(f'{c:.2f}' for c, _ in runs)}); wall s {', '.join(f'{w:.2f}' for _, w in runs)}")
    print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
