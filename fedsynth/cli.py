"""The `fedsynth` command: run the app in Flower's simulation engine, or compare algorithms.

`fedsynth data fetch` downloads a dataset with torchvision (fedsynth/data.py);
`--gpus-per-client` gives each simulated ClientApp a fraction of a GPU through
Ray (with `device = "auto"`, the app then uses CUDA); `--ray-address` runs the
ClientApps on the nodes of an existing Ray cluster (docs/scale.md).

`fedsynth run` does what `flwr run .` does in simulation (the same app, the same
fused run config, the same results) but in this process, and its exit code says
how the run ended (EXIT_* below; `flwr run --stream` exits 0 even when it fails). `fedsynth compare`
runs several algorithms on the same split and seed and writes one markdown
table and one plot; `fedsynth study FILE.toml` tests a paper's claims
(`fedsynth.study.runner`); `fedsynth status RESULTS_DIR` says how a run ended
(`fedsynth.status`); `fedsynth monitor RESULTS_DIR` serves a live page and Prometheus
metrics of the runs there (`fedsynth.monitor`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common.run.config import ConfigError, parse_overrides, parse_run_config
from common.run.interrupt import RunInterrupted, exit_code, install_handlers, restore_handlers, signal_name
from common.run.interrupt import stopped_at as interrupt_state
from common.run.results import read_metrics, results_root
from server_app.outcome import STATUS_FAILED_ROUNDS, STATUS_OK
from fedsynth.app_config import ENGINES, app_defaults
from fedsynth.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_FAILED_ROUNDS, EXIT_OK
from fedsynth.simulation import check_resources, find_app_dir, run_simulation
from fedsynth.study.cli import add_study_parser, study_command






def add_ray_address_option(parser: argparse.ArgumentParser) -> None:
    """`--ray-address`: run the ClientApps on an existing Ray cluster (shared by run, compare and study)."""
    parser.add_argument(
        "--ray-address", default=None, metavar="HOST:PORT",
        help="join this Ray cluster (`ray start --head` prints it) and place the ClientApps on its nodes; "
             "checked at start for the CPUs/GPUs asked per ClientApp (docs/scale.md). Default: a Ray of this process",
    )



def add_engine_option(parser: argparse.ArgumentParser) -> None:
    """`--engine`: Flower's simulation engine (Ray), or the in-process grid (shared by run, compare and study)."""
    parser.add_argument(
        "--engine", choices=ENGINES, default="simulation",
        help="simulation: Flower's simulation engine, ClientApps as Ray actors (default); inprocess: the same "
             "ServerApp and ClientApp code in this process, the nodes one after another, no Ray: the same "
             "results; with one run per core, 0.53x the time per round of 100 small nodes (docs/studies.md)",
    )


def add_gpus_option(parser: argparse.ArgumentParser) -> None:
    """`--gpus-per-client`: Ray's fractional GPUs per simulated ClientApp (shared by run, compare and study)."""
    parser.add_argument(
        "--gpus-per-client", type=_gpu_fraction, default=0.0, metavar="G",
        help="GPUs reserved per ClientApp; a fraction shares one GPU, e.g. 0.25 runs 4 ClientApps per GPU "
             "(default 0: CPU only; needs device = \"auto\" or \"cuda\" in the run config to train on it)",
    )


def _gpu_fraction(text: str) -> float:
    value = float(text)
    if not (value >= 0 and (value <= 1 or value.is_integer())):
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction in [0, 1] or a whole number of GPUs")
    return value


def compare(app_dir: Path, algorithms: list[str], overrides: dict[str, Any], num_supernodes: int,
            cpus_per_client: float, name: str = "", gpus_per_client: float = 0.0, ray_address: str | None = None,
            engine: str = "simulation") -> Path:
    """Run each algorithm on the same split and seed; write comparison.md and comparison.png."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = {k: v for k, v in overrides.items() if k not in ("algorithm", "run-name")}
    cfg_root = results_root(str(base.get("results-dir", app_defaults(app_dir)["results-dir"])))
    from server_app.registry import SERVER_STRATEGIES

    if not algorithms:
        raise ConfigError("--algorithms names no algorithm; e.g. --algorithms fedavg,fedprox")
    check_resources(num_supernodes, cpus_per_client, gpus_per_client, on_cluster=bool(ray_address))
    defaults = app_defaults(app_dir)
    for algorithm in algorithms:  # every one checked before the first runs: a misspelt last one fails now
        try:
            parse_run_config({**defaults, **base, "algorithm": algorithm}, SERVER_STRATEGIES)
        except ConfigError as err:
            raise ConfigError(f"--algorithms: {algorithm!r}: {err}") from None
    folder = cfg_root / (name or f"compare-{stamp}")
    folder.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Path] = {}
    for algorithm in algorithms:
        run_overrides = {**base, "algorithm": algorithm, "results-dir": str(folder), "run-name": algorithm}
        runs[algorithm] = run_simulation(app_dir, run_overrides, num_supernodes, cpus_per_client, gpus_per_client,
                                         ray_address, engine)
    write_comparison(runs, folder)
    return folder


def write_comparison(runs: dict[str, Path], folder: Path) -> None:
    """One markdown table (final/best accuracy, bytes, time) and one accuracy plot for several runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        "| algorithm | final central accuracy | best central accuracy | final local accuracy | uplink MB | downlink MB | wall time s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    for algorithm, run_dir in runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())

        def fmt(key: str, scale: float = 1.0, digits: int = 4) -> str:
            value = summary.get(key)
            return f"{value / scale:.{digits}f}" if isinstance(value, (int, float)) else "-"

        lines.append(
            f"| {algorithm} | {fmt('final-central-accuracy')} | {fmt('best-central-accuracy')} | "
            f"{fmt('final-local-test-accuracy')} | {fmt('uplink-bytes', 1e6, 2)} | "
            f"{fmt('downlink-bytes', 1e6, 2)} | {fmt('wall-time', 1.0, 1)} |"
        )
        rounds = [r for r in read_metrics(run_dir / "metrics.jsonl") if "central-accuracy" in r]
        ax.plot([r["round"] for r in rounds], [r["central-accuracy"] for r in rounds], marker=".", label=algorithm)
    ax.set(xlabel="round", ylabel="central test accuracy", title="Comparison")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "comparison.png", dpi=100)
    plt.close(fig)
    from fedsynth.study.report import mixed_means_note

    means = {algorithm: _run_mean(run_dir) for algorithm, run_dir in runs.items()}
    note = mixed_means_note({name: mean for name, mean in means.items() if mean is not None})
    if note:
        lines += ["", f"**Note**: {note}."]
    (folder / "comparison.md").write_text("\n".join(lines) + "\n")


def _run_mean(run_dir: Path) -> str | None:
    """The server mean a run ran (`aggregation` in its config.json), or None when its config.json lacks it."""
    try:
        written = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = written.get("config", written) if isinstance(written, dict) else {}
    mean = config.get("aggregation") if isinstance(config, dict) else None
    return mean if isinstance(mean, str) else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsynth", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data_parser(sub)
    for name, text in (("run", "run the app in simulation"), ("compare", "run several algorithms on the same split")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=5 alpha=0.1"')
        cmd.add_argument("--num-supernodes", type=int, default=10, help="simulated clients (default 10)")
        cmd.add_argument("--cpus-per-client", type=float, default=1.0, help="CPUs reserved per ClientApp")
        add_gpus_option(cmd)
        add_ray_address_option(cmd)
        add_engine_option(cmd)
        cmd.add_argument("--app-dir", type=Path, default=None, help="the Flower app (default: found from cwd)")
        if name == "compare":
            cmd.add_argument("--algorithms", required=True, help="comma-separated, e.g. fedavg,fedprox,scaffold")
            cmd.add_argument("--name", default="", help="results folder name (default compare-<time>)")
    add_study_parser(sub)
    status = sub.add_parser("status", help="how a run ended (summary.json): its status, failed rounds, dropped "
                            "replies; the exit code says it (0 ok, 3 failed rounds, 1 failed, 4 not finished)")
    status.add_argument("results_dir", type=Path, metavar="RESULTS_DIR",
                        help="the run's results folder (printed as 'results folder: ...' when the run starts)")
    _add_monitor_parser(sub)
    return parser


def _add_monitor_parser(sub: argparse._SubParsersAction) -> None:
    """`fedsynth monitor RESULTS_DIR [--host H] [--port P] [--token T] [--tls-certfile C --tls-keyfile K]`."""
    monitor = sub.add_parser("monitor", help="a read-only live page and Prometheus /metrics of the runs and "
                             "studies in a results folder (docs/deployment.md)")
    monitor.add_argument("results_dir", type=Path, metavar="RESULTS_DIR",
                         help="a run's results folder, a folder of them (e.g. results/), or a study's --out")
    monitor.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; any "
                         "other needs --token)")
    monitor.add_argument("--port", type=int, default=8765, help="the port (default 8765; 0 picks a free one)")
    monitor.add_argument("--token", default=None, help="the token every request must carry (at least 16 "
                         "characters; default: the environment's FEDSYNTH_MONITOR_TOKEN)")
    monitor.add_argument("--tls-certfile", type=Path, default=None, help="serve HTTPS with this certificate")
    monitor.add_argument("--tls-keyfile", type=Path, default=None, help="and this private key")


def _monitor(args: argparse.Namespace) -> int:
    from fedsynth.monitor.server import TOKEN_ENV, MonitorError, make_server

    try:
        server = make_server(args.results_dir, args.host, args.port, args.token or os.environ.get(TOKEN_ENV) or None,
                             args.tls_certfile, args.tls_keyfile)
    except MonitorError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"fedsynth monitor: {server.monitor.root} on {server.url} (Prometheus: {server.url}metrics); Ctrl-C stops",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK


def _add_data_parser(sub: argparse._SubParsersAction) -> None:
    """`fedsynth data fetch DATASET [DIR]`."""
    data = sub.add_parser("data", help="fetch datasets").add_subparsers(dest="data_command", required=True)
    fetch = data.add_parser("fetch", help="download a dataset with torchvision (checksummed) into DIR")
    fetch.add_argument("dataset", choices=("mnist", "fashion-mnist", "cifar10", "cifar100"))
    fetch.add_argument("dir", nargs="?", default="", help="data directory (default ~/.cache/fedsynth/data, "
                       "where an empty data-dir looks)")


def _fetch(dataset: str, folder: str) -> int:
    from fedsynth.data import FetchError, fetch_dataset

    try:
        data = fetch_dataset(dataset, folder)
    except FetchError as err:
        print(f"fedsynth: {err}", file=sys.stderr)
        return 1
    where = folder or "the default data directory"
    print(f"{dataset}: {len(data.y_train)} training and {len(data.y_test)} test images in {where}; "
          f"run with dataset = \"{dataset}\"" + (f' data-dir = "{folder}"' if folder else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fedsynth` console script."""
    args = _parser().parse_args(argv)
    if args.command == "data":
        return _fetch(args.dataset, args.dir)
    if args.command == "monitor":
        return _monitor(args)
    if args.command == "status":
        from fedsynth.status import run_status

        code, lines = run_status(args.results_dir)
        print("\n".join(lines), file=sys.stderr if code == EXIT_BAD_INPUT else sys.stdout)
        return code
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Ray's C++ failure-signal handler takes SIGTERM over and aborts the process (exit 134, no summary); without
    # it SIGTERM reaches common/run/interrupt.py's handler (crash stack dumps of Ray's own processes are lost)
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    app_dir = find_app_dir(args.app_dir)
    if args.command == "study":
        return study_command(args, app_dir)
    try:
        overrides = parse_overrides(args.run_config)
        if args.command == "run":
            return run_command(app_dir, overrides, args.num_supernodes, args.cpus_per_client, args.gpus_per_client,
                               args.ray_address, args.engine)
        else:
            algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
            handlers = install_handlers()  # Ctrl-C stops the current run cleanly, as in `fedsynth run`
            try:
                folder = compare(app_dir, algorithms, overrides, args.num_supernodes, args.cpus_per_client,
                                 args.name, args.gpus_per_client, args.ray_address, args.engine)
            finally:
                restore_handlers(handlers)
            print((folder / "comparison.md").read_text())
            statuses = {}
            for algorithm in algorithms:
                summary = json.loads((folder / algorithm / "summary.json").read_text())
                statuses.setdefault(str(summary.get("status", STATUS_OK)), f"{algorithm}: {summary.get('status-reason', '')}")
        print(f"results: {folder}")
    except BaseException as err:  # noqa: BLE001 - the CLI's job is to turn any failure into an exit code
        interrupted = _interrupted(err)
        if interrupted is not None:  # compare: the run under way stopped cleanly; the others did not start
            print(f"fedsynth: compare interrupted by {signal_name(interrupted.signum)}"
                  + (f"; the run in {interrupted.folder} resumes with resume = true" if interrupted.folder else ""),
                  file=sys.stderr)
            return exit_code(interrupted.signum)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        return _report_failure(err)
    if STATUS_FAILED_ROUNDS in statuses:
        print(f"fedsynth: completed with failed rounds: {statuses[STATUS_FAILED_ROUNDS]}", file=sys.stderr)
        return EXIT_FAILED_ROUNDS
    return EXIT_OK


def run_command(app_dir: Path, overrides: dict[str, Any], num_supernodes: int, cpus_per_client: float,
                gpus_per_client: float = 0.0, ray_address: str | None = None, engine: str = "simulation") -> int:
    """`fedsynth run`: one run in simulation, its summary printed, and the exit code of how it ended (EXIT_*).

    SIGINT and SIGTERM stop the run at its next reply poll (common/run/interrupt.py): summary.json says
    `interrupted`, the checkpoint is kept, the resume command is printed, and the exit code is 130 or 143.
    """
    def report_at_forced_exit(signum: int) -> None:
        where = interrupt_state()
        error = RunInterrupted(signum)
        error.folder, error.last_round = where.get("folder"), where.get("last-round")
        _report_interrupt(error, overrides, num_supernodes, cpus_per_client, gpus_per_client, engine)

    on_main_thread = threading.current_thread() is threading.main_thread()
    handlers = install_handlers(report_at_forced_exit) if on_main_thread else {}
    try:
        folder = run_simulation(app_dir, overrides, num_supernodes, cpus_per_client, gpus_per_client, ray_address,
                                engine)
        summary = json.loads((folder / "summary.json").read_text())
        print(json.dumps(summary, indent=2))
        print(f"results: {folder}")
    except BaseException as err:  # noqa: BLE001 - the CLI's job is to turn any failure into an exit code
        interrupted = _interrupted(err)
        if interrupted is not None:
            return _report_interrupt(interrupted, overrides, num_supernodes, cpus_per_client, gpus_per_client,
                                     engine)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        return _report_failure(err)
    finally:
        restore_handlers(handlers)
    if summary.get("status", STATUS_OK) == STATUS_FAILED_ROUNDS:
        print(f"fedsynth: completed with failed rounds: {summary.get('status-reason', '')}", file=sys.stderr)
        return EXIT_FAILED_ROUNDS
    return EXIT_OK


_REPORTED = threading.Event()


def _interrupted(err: BaseException) -> RunInterrupted | None:
    """The RunInterrupted behind an exception (Flower may wrap the ServerApp's), or None."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, RunInterrupted):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


def resume_command(overrides: dict[str, Any], folder: Path, num_supernodes: int, cpus_per_client: float,
                   gpus_per_client: float, engine: str = "simulation") -> str:
    """The `fedsynth run` command line that continues the run in `folder` from its checkpoint."""
    kept = {k: v for k, v in overrides.items() if k not in ("run-name", "results-dir", "resume", "overwrite")}
    config = {**kept, "results-dir": str(folder.parent), "run-name": folder.name, "resume": True}
    text = " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())
    gpus = f" --gpus-per-client {gpus_per_client:g}" if gpus_per_client else ""
    engine_option = f" --engine {engine}" if engine != "simulation" else ""
    return (f"fedsynth run --num-supernodes {num_supernodes} --cpus-per-client {cpus_per_client:g}{gpus}"
            f"{engine_option} --run-config \"{text}\"")


def _report_interrupt(err: RunInterrupted, overrides: dict[str, Any], num_supernodes: int, cpus_per_client: float,
                      gpus_per_client: float, engine: str = "simulation") -> int:
    """Where the run stopped and the command that resumes it (printed once); the exit code 128 + signal."""
    if _REPORTED.is_set():
        return exit_code(err.signum)
    _REPORTED.set()
    where = f"after round {err.last_round}" if err.last_round is not None else "before its first round"
    print(f"fedsynth: interrupted by {signal_name(err.signum)} {where}", file=sys.stderr)
    if err.folder is not None:
        has_checkpoint = (err.folder / "checkpoint.safetensors").is_file()
        print(f"fedsynth: results in {err.folder}" + ("; its checkpoint is kept" if has_checkpoint else
              " (no checkpoint yet: a resume starts over)"), file=sys.stderr)
        print("fedsynth: resume with: " + resume_command(overrides, err.folder, num_supernodes, cpus_per_client,
                                                         gpus_per_client, engine), file=sys.stderr)
    return exit_code(err.signum)


def _report_failure(err: BaseException) -> int:
    """One line on stderr saying why, and the exit code of the failure (the engine wraps the ServerApp's errors)."""
    from common.data.datasets import DatasetMissingError
    from fedsynth.ray_cluster import ClusterError
    from server_app.checkpoint import CheckpointError

    root = err
    while root.__cause__ is not None and isinstance(root, RuntimeError) and type(root) is RuntimeError:
        root = root.__cause__  # Flower's "An error was encountered. Ending simulation." around the real one
    if isinstance(root, (ConfigError, CheckpointError, DatasetMissingError, ClusterError)):
        print(f"fedsynth: refused: {root}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"fedsynth: run failed: {type(root).__name__}: {root}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
