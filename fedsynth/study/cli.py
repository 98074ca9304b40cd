"""The `fedsynth study` subcommand: its options, and turning a study into runs, a report and an exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsynth.app_config import ENGINES, app_defaults


def add_study_parser(sub: Any) -> None:
    """`fedsynth study FILE.toml [options]`."""
    cmd = sub.add_parser("study", help="tune, run on report seeds and test a paper's claims (docs/studies.md)",
                         description="Run a study file: tuning on validation scores and tuning seeds, every arm on the "
                                     "report seeds, paired 95 % CIs and a verdict per claim. Resumable: finished runs "
                                     "are read from the ledger and never run again.")
    cmd.add_argument("file", type=Path, help="the study file (TOML), e.g. studies/fedsynsam-cpu.toml")
    cmd.add_argument("--out", type=Path, default=None,
                     help="ledger and report folder (default <results-dir>/studies/<name>); give "
                          "benchmarks/results/studies/<name> to continue a committed study (one keyed by today's "
                          "run keys; an older ledger is refused, and only --report-only reads it); a folder "
                          "holding another study's ledger is refused")
    cmd.add_argument("--runs-dir", type=Path, default=None, help="the runs' folders (default <results-dir>/studies/<name>/runs)")
    cmd.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    cmd.add_argument("--cpus-per-client", type=float, default=None, help="CPUs per ClientApp (default: the study file's)")
    cmd.add_argument("--gpus-per-client", type=float, default=None,
                     help="GPUs per ClientApp, fractional for several per GPU (default: the study file's)")
    cmd.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                     help="run each run's ClientApps on this Ray cluster, one run at a time (checked at start; "
                          "docs/scale.md). Several hosts share a study through one --out folder instead")
    cmd.add_argument("--engine", choices=ENGINES, default="simulation",
                     help="each run in Flower's simulation engine (default), or its nodes in the run's own process "
                          "without Ray: the same results, faster for many small nodes (docs/studies.md)")
    cmd.add_argument("--arms", type=_names, default=None,
                     help="run only these arms (comma-separated; claims between them are reported); the whole study later skips them")
    cmd.add_argument("--variants", type=_names, default=None, help="run only these variants (comma-separated)")
    cmd.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (the rest on the next call)")
    cmd.add_argument("--retry-failed", action="store_true", help="run again the runs the ledger records as failed")
    cmd.add_argument("--report-only", action="store_true", help="remake the report from the ledger; run nothing")
    cmd.add_argument("--dry-run", action="store_true", help="list the runs and how many are finished; run nothing")
    cmd.add_argument("--reuse", type=Path, action="append", default=[], metavar="LEDGER",
                     help="take the runs another study's ledger finished with the same effective run config instead "
                          "of running them (repeatable; they are scored again by this study's rules; runs of the same "
                          "settings under another effective config are refused by key)")
    cmd.add_argument("--app-dir", type=Path, default=None, help="the Flower app (default: found from cwd)")


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("a comma-separated list of names")
    return names


def run_config_check(app_dir: Path) -> Callable[[dict[str, Any]], None]:
    """A check for `load_study`: a run config is valid when the app (its defaults, then the overrides) accepts it."""
    from common.run.config import ConfigError, parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    defaults = app_defaults(app_dir)

    def check(overrides: dict[str, Any]) -> None:
        try:
            parse_run_config({**defaults, **overrides}, SERVER_STRATEGIES)
        except ConfigError as err:
            raise ValueError(str(err)) from None

    return check


def _unchecked_note(study: Any, ledger: Any) -> None:
    """On stderr, what the report could not check: an old key version, entries whose run folders are elsewhere."""
    from fedsynth.study.checks import check_run_folders
    from fedsynth.study.plan import keyed_for

    read_as = keyed_for(study, ledger)
    if not read_as.keyed_by_settings and read_as.key_version < study.key_version:
        print(f"fedsynth study: {ledger.path} is keyed by key version {read_as.key_version}: its entries record "
              "neither the client count nor the data's identity (docs/studies.md)", file=sys.stderr)
    note = check_run_folders(read_as, ledger).note()
    if note:
        print(f"fedsynth study: {note}", file=sys.stderr)


def study_command(args: argparse.Namespace, app_dir: Path) -> int:
    """Exit codes: 0 the study (or the part asked for) finished, 2 the study file is wrong, 1 runs failed."""
    from common.run.results import results_root
    from fedsynth.study.checks import other_study_in
    from fedsynth.study.ledger import Ledger, LedgerError
    from fedsynth.study.runner import StudyPaths, run_study, simulation_executor
    from fedsynth.study.plan import keyed_for, plan, total_runs
    from fedsynth.study.sharpness import sharpness_measurer
    from fedsynth.study.report import write_report
    from fedsynth.study.reuse import ReuseRefused, reusable, reuse_runs
    from fedsynth.study.runner import refuse_before_provenance
    from fedsynth.study.studyfile import StudyError, load_study, select

    defaults = app_defaults(app_dir)
    check = run_config_check(app_dir)
    try:
        study = select(load_study(args.file, check, defaults), args.arms, args.variants)
    except StudyError as err:
        print(f"fedsynth study: {err}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("fedsynth study: --jobs must be at least 1", file=sys.stderr)
        return 2
    if args.ray_address and args.engine == "inprocess":
        print("fedsynth study: --engine inprocess runs each run's nodes in its own process; it cannot use "
              "--ray-address", file=sys.stderr)
        return 2
    if args.ray_address and args.jobs > 1:
        print("fedsynth study: --ray-address runs one run at a time (--jobs 1): each run sizes its ClientApp actors "
              "to the whole cluster, so runs at once would wait on each other's actors; to run studies on several "
              "hosts at once, start one `fedsynth study` per host on a shared --out (docs/scale.md)", file=sys.stderr)
        return 2
    home = results_root(str(defaults.get("results-dir", "results"))) / "studies" / study.name
    paths = StudyPaths(out=(args.out or home).resolve(), runs=(args.runs_dir or home / "runs").resolve())
    try:
        ledger = Ledger(paths.ledger)
        sources = [Ledger(path) for path in args.reuse if path.exists()]
    except LedgerError as err:
        print(f"fedsynth study: {err}", file=sys.stderr)
        return 2
    for problem in ledger.malformed:  # left out: the report is made without it, and its run runs again
        print(f"fedsynth study: {paths.ledger} {problem}; that entry is ignored", file=sys.stderr)
    missing = [str(path) for path in args.reuse if not path.is_file()]
    if missing:
        print(f"fedsynth study: --reuse: no ledger at {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.dry_run:
        read_as = keyed_for(study, ledger)
        if read_as.keyed_by_settings:
            print(f"{paths.ledger} was made before provenance (no effective configs): its runs are listed by the keys "
                  "of their study settings; `fedsynth study` runs nothing on it (docs/studies.md)")
        tuning, report, chosen = plan(read_as, ledger)
        try:
            found = reusable(read_as, tuning + report, ledger, sources)
        except ReuseRefused as err:
            print(f"fedsynth study: {err}", file=sys.stderr)
            return 2
        for spec in tuning + report:
            state = "done" if spec.key in ledger else "reused" if spec.key in found else "to run"
            print(f"{spec.phase:6} {spec.cell:30} seed {spec.seed:<4} {spec.grid_point or ''} [{state}]")
        pending = len(study.cells()) * len(study.report_seeds) - len(report)
        print(f"{total_runs(study)} runs in all; {pending} report runs wait for tuning")
        return 0
    other = other_study_in(study, ledger, paths.out)
    if other is not None:  # its report would be overwritten, its ledger mixed with this study's runs
        print(f"fedsynth study: {other}", file=sys.stderr)
        return 2
    try:
        if sources or not args.report_only:
            refuse_before_provenance(study, ledger)
        if sources:
            print(f"reused {reuse_runs(study, ledger, sources)} finished run(s) from "
                  f"{', '.join(map(str, args.reuse))}")
    except (StudyError, ReuseRefused) as err:
        print(f"fedsynth study: {err}", file=sys.stderr)
        return 2
    if args.report_only:
        write_report(study, ledger, paths.out)
        print(f"report: {paths.out / 'report.md'}")
        _unchecked_note(study, ledger)
        return 0
    if args.ray_address:
        from fedsynth.ray_cluster import ClusterError, check_cluster

        try:
            check_cluster(args.ray_address, study.cpus_per_client if args.cpus_per_client is None else args.cpus_per_client,
                          study.gpus_per_client if args.gpus_per_client is None else args.gpus_per_client)
        except ClusterError as err:
            print(f"fedsynth study: {err}", file=sys.stderr)
            return 2
    executor = simulation_executor(app_dir, study, args.jobs, args.gpus_per_client, args.cpus_per_client,
                                   args.ray_address, args.engine)
    measurer = sharpness_measurer(app_dir, study.sharpness_examples, max(1, (os.cpu_count() or 1) // args.jobs))
    from common.run.interrupt import RunInterrupted, exit_code, restore_handlers, signal_name
    from fedsynth.workers import forward_signals

    handlers = forward_signals()  # SIGINT/SIGTERM reach every worker; the study starts no new run
    try:
        ledger = run_study(study, paths, executor, args.jobs, args.max_runs, args.retry_failed, measurer=measurer,
                           reuse=sources)
    except (StudyError, ReuseRefused) as err:
        print(f"fedsynth study: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:
        print(f"fedsynth study: interrupted by {signal_name(err.signum)}; the stopped runs kept their checkpoints and "
              "resume on the next call of the same command", file=sys.stderr)
        return exit_code(err.signum)
    finally:
        restore_handlers(handlers)
    failed = [e for e in ledger.entries.values() if e.get("exit-code") != 0]
    if failed:
        print(f"fedsynth study: {len(failed)} run(s) exited non-zero (see runs.csv and {paths.runs / 'logs'})",
              file=sys.stderr)
        return 1
    return 0
