"""What importing fedsynth's strategies costs beside importing Flower's ServerApp API (issue 52, deliver 8).

A Flower developer's ServerApp starts with `import flwr.serverapp`; one that uses fedsynth's strategies adds
`import fedsynth.strategies`, and builds one. Each statement below runs in a fresh interpreter (as a ServerApp
process does), and for each this measures

- `import s`: the statement's own wall time, timed inside the interpreter (`time.perf_counter` around it);
- `process s`: the whole interpreter's wall time, start-up and exit included, timed from outside;
- `max RSS MiB`: the interpreter's peak resident memory (`os.wait4`'s `ru_maxrss`, per child);
- `torch`: whether the statement left torch in `sys.modules`.

Statements: `pass` (the bare interpreter, for scale), `import flwr.serverapp`, `import fedsynth.strategies`,
`from fedsynth.strategies import FedAvg; FedAvg()` and, for context, `import torch`. Every repeat runs each
statement once, in turn, so that a change in the machine's load falls on all of them alike, after one turn
that is not counted (it writes the bytecode caches of a freshly exported tree); the table gives medians over
the repeats and each median's ratio to `import flwr.serverapp`'s.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/import_cost.py [--repeats 7] [--before DIR] [--out FILE]

`--before DIR` adds fedsynth's two statements run on another checkout's modules (e.g. an older commit exported
with `git archive`), in the same turns, so a change is measured under the same load as the rest. About a minute
per repeat on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STATEMENTS = {
    "bare interpreter": "pass",
    "import flwr.serverapp": "import flwr.serverapp",
    "import fedsynth.strategies": "import fedsynth.strategies",
    "FedAvg() built": "from fedsynth.strategies import FedAvg; FedAvg()",
    "import torch": "import torch",
}
REFERENCE = "import flwr.serverapp"
FEDSYNTH_STATEMENTS = ("import fedsynth.strategies", "FedAvg() built")  # the rows `--before` repeats

CHILD = """
import json, sys, time
start = time.perf_counter()
{statement}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "torch": "torch" in sys.modules}}))
"""


def measure(statement: str, root: Path) -> dict[str, float | bool]:
    """One fresh interpreter running `statement`: its import time, process time, peak RSS and whether torch loaded."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(statement=statement)], cwd=root, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    process_seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{statement!r} failed with exit code {child.returncode}")
    result = json.loads(output.strip().splitlines()[-1])
    return {"import": result["seconds"], "process": process_seconds, "rss": usage.ru_maxrss / 1024,  # KiB -> MiB
            "torch": result["torch"]}


def table(samples: dict[tuple[str, str], list[dict[str, float | bool]]]) -> list[str]:
    """Markdown rows: medians, and their ratios to `import flwr.serverapp`'s."""
    medians = {name: {key: statistics.median(float(s[key]) for s in runs) for key in ("import", "process", "rss")}
               for name, runs in samples.items()}
    ref = medians[(REFERENCE, "")]
    rows = ["| statement | modules | import s | x flwr | process s | x flwr | max RSS MiB | x flwr | torch loaded |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for (name, tree), m in medians.items():
        torch_loaded = sorted({bool(s["torch"]) for s in samples[(name, tree)]})
        rows.append(f"| `{STATEMENTS[name]}` | {tree or 'this checkout'} | {m['import']:.2f} | {m['import'] / ref['import']:.2f} | "
                    f"{m['process']:.2f} | {m['process'] / ref['process']:.2f} | {m['rss']:.0f} | "
                    f"{m['rss'] / ref['rss']:.2f} | {'/'.join(map(str, torch_loaded))} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh interpreters per statement")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout whose fedsynth statements are measured too, in the same turns")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (and every sample) here")
    args = parser.parse_args()
    cases = [(name, "", ROOT) for name in STATEMENTS]
    if args.before is not None:
        cases += [(name, args.before.resolve().name, args.before.resolve()) for name in FEDSYNTH_STATEMENTS]
    samples: dict[tuple[str, str], list[dict[str, float | bool]]] = {(name, tree): [] for name, tree, _ in cases}
    for root in dict.fromkeys(root for _, _, root in cases):  # not counted: writes a tree's bytecode caches
        measure("import fedsynth.strategies; import torch", root)
    load_before = os.getloadavg()
    for repeat in range(args.repeats):
        for name, tree, root in cases:
            samples[(name, tree)].append(measure(STATEMENTS[name], root))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    lines = [f"Medians of {args.repeats} fresh interpreters per statement, run in turn; this checkout: {ROOT}; "
             f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
             f"{load_after[0]:.1f} after.", "", *table(samples), "",
             "Every sample (import s, process s, max RSS MiB):", ""]
    for (name, tree), runs in samples.items():
        lines.append(f"- `{STATEMENTS[name]}`{f' ({tree})' if tree else ''}: " + ", ".join(
            f"({s['import']:.2f}, {s['process']:.2f}, {s['rss']:.0f})" for s in runs))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
