"""A hostile probe of fedsynth's checks: a few hundred bad inputs, each judged from the docs' words alone.

Each case runs in a forked child of this process (everything is imported once, before the first fork) with its own
timeout, so a case that hangs is killed and counted, and one that crashes the interpreter cannot take the probe
with it. The families (issue 54's reliability pass):

- constructors: every public strategy class of `fedsynth.strategies` given bad values for its parameters (read with
  `inspect.signature`, so a refactor of the constructors changes the cases, not the probe);
- run-config: bad values for run-config keys (`parse_run_config`) and bad `--run-config` texts (`parse_overrides`);
- replies: hostile train and evaluate replies to a strategy's `start()` on an in-process grid (Flower's Message API);
- files: checkpoints, a study's ledger, a site's data folder and a user's model factory that are wrong;
- cli: the `fedsynth` command given bad arguments (`fedsynth.cli.main(argv)`);
- warm-server, watchdog, state-503: a site's warm ClientApp server, its SuperNode's watchdog and the SuperLink's
  busy state database, each with a hostile neighbour (`hostile_probe_site.py`);
- imports: `algorithm` / `model` import paths outside the packages a site permits, modules that end the process on
  import, malformed allow-lists, on the server and on a node (benchmarks/hostile_probe_imports.py);
- message values: train messages to fedsynth's ClientApp whose config holds a bad value for a setting it reads.

Each outcome is one of: handled (refused or recorded with a message naming the part at fault, or the documented
behaviour), silently wrong (accepted or run on to a wrong, NaN or garbage result without a word, outside a documented
opt-in), unclear (refused, but the message names no part at fault or comes from deep inside) and hang (the timeout).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/hostile_probe.py --out /tmp/hostile-probe.md --json /tmp/probe.json

benchmarks/results/hostile-probe.md sets such a run beside one on the code before issue 54's fixes.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

HANDLED, WRONG, UNCLEAR, HANG = "handled", "silently wrong", "unclear", "hang"
OUTCOMES = (HANDLED, WRONG, UNCLEAR, HANG)
Verdict = tuple[str, str]


@dataclass
class Case:
    family: str
    name: str
    run: Callable[[], Verdict]
    timeout: float = 30.0


def refused_naming(call: Callable[[], object], names: tuple[str, ...], accepted_ok: bool = False) -> Verdict:
    """Judge a call that should refuse its input with a message naming one of `names` (the part at fault).

    Accepted: silently wrong (or handled when `accepted_ok`, the documented behaviour). Refused naming the part:
    handled. Refused otherwise (another part, or a raw error from deep inside): unclear.
    """
    try:
        value = call()
    except SystemExit as stop:
        return (UNCLEAR, f"SystemExit({stop.code}) without a message") if stop.code in (None, 0) else \
            (HANDLED, f"exit {stop.code}")
    except Exception as err:  # noqa: BLE001 - every refusal is judged by its message
        text = f"{type(err).__name__}: {err}"
        if any(name.lower() in str(err).lower() for name in names):
            return HANDLED, text
        return UNCLEAR, f"{text} (names none of {', '.join(repr(n) for n in names)})"
    if accepted_ok:
        return HANDLED, f"accepted (documented): {value!r}"[:300]
    return WRONG, f"accepted without a word: {value!r}"[:300]


def run_isolated(case: Case) -> tuple[str, str, float]:
    """Run `case` in a forked child, its output silenced; (outcome, detail, seconds). Past its timeout: a hang."""
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: run the case, send its verdict, leave without cleanup
        os.close(read_end)
        os.setsid()
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        try:
            outcome, detail = case.run()
        except BaseException as err:  # noqa: BLE001 - a case the probe itself did not foresee: unclear, shown
            outcome, detail = UNCLEAR, f"escaped the case: {type(err).__name__}: {err}"
        os.write(write_end, json.dumps([outcome, " ".join(str(detail).split())[:500]]).encode())
        os._exit(0)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = started + case.timeout
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([read_end], [], [], max(left, 0))
        if not ready:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # the child has not made its own process group yet (a loaded machine)
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            return HANG, f"no verdict within {case.timeout:.0f} s", time.monotonic() - started
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return UNCLEAR, f"the case died without a verdict (wait status {status})", time.monotonic() - started
    outcome, detail = json.loads(b"".join(chunks))
    return outcome, detail, time.monotonic() - started


def all_cases(work: Path) -> list[Case]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import hostile_probe_config
    import hostile_probe_files
    import hostile_probe_imports
    import hostile_probe_replies
    import hostile_probe_site

    return (hostile_probe_config.constructor_cases() + hostile_probe_config.run_config_cases()
            + hostile_probe_replies.reply_cases() + hostile_probe_files.file_cases(work)
            + hostile_probe_config.cli_cases(work) + hostile_probe_site.site_cases(work)
            + hostile_probe_imports.import_cases(work) + hostile_probe_imports.message_cases(work))


def report(results: list[tuple[Case, str, str, float]], seconds: float, before: str = "") -> str:
    families = list(dict.fromkeys(case.family for case, *_ in results))
    total = Counter(outcome for _, outcome, _, _ in results)
    lines = ["# Hostile probe", "",
             "`benchmarks/hostile_probe.py`: each case a bad input judged from the docs' words (README.md,",
             "docs/library.md, docs/configuration.md, docs/own-data.md, docs/deployment.md, docs/reliability.md);",
             "each run in a forked child with its own timeout. Reproduce (about "
             f"{seconds / 60:.0f} min on one core):",
             "",
             "    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/hostile_probe.py --out /tmp/hostile-probe.md",
             "", f"{len(results)} cases: {total[HANDLED]} handled, {total[WRONG]} silently wrong, "
                 f"{total[UNCLEAR]} unclear, {total[HANG]} hangs.", ""]
    if before:
        lines += [before, ""]
    lines += ["| family | cases | handled | silently wrong | unclear | hangs |",
              "| --- | --- | --- | --- | --- | --- |"]
    for family in families:
        counts = Counter(outcome for case, outcome, _, _ in results if case.family == family)
        lines.append(f"| {family} | {sum(counts.values())} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    lines.append(f"| all | {len(results)} | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    lines += ["", "## Every case not handled", "", "| family | case | outcome | what happened |",
              "| --- | --- | --- | --- |"]
    for case, outcome, detail, _ in results:
        if outcome != HANDLED:
            cell = detail.replace("|", "\\|")
            lines.append(f"| {case.family} | `{case.name}` | {outcome} | {cell} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    parser.add_argument("--json", type=Path, default=None, help="write every case's outcome here")
    parser.add_argument("--only", default="", help="run only the cases whose family or name holds this text")
    parser.add_argument("--before", default="", help="a line for the report, e.g. the counts before the fixes")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-probe-") as folder:
        work = Path(folder)
        os.environ["FEDSYNTH_HOME"] = str(work / "home")
        os.environ["FLWR_HOME"] = str(work / "flwr-home")
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")
        os.environ["FEDSYNTH_ALLOWED_IMPORTS"] = "probe_factories"  # the probe's model factories (docs/own-data.md)
        cases = [c for c in all_cases(work) if args.only in c.family or args.only in c.name]
        results = []
        for number, case in enumerate(cases, 1):
            outcome, detail, seconds = run_isolated(case)
            results.append((case, outcome, detail, seconds))
            mark = "" if outcome == HANDLED else f"  <-- {outcome}: {detail[:160]}"
            print(f"[{number}/{len(cases)}] {case.family}: {case.name} ({seconds:.1f} s){mark}", flush=True)
    seconds = time.monotonic() - started
    text = report(results, seconds, args.before)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps([{"family": c.family, "case": c.name, "outcome": o, "detail": d,
                                          "seconds": round(s, 2)} for c, o, d, s in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
