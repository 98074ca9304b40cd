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
(`fedsynth.study.runner`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.run.config import ConfigError, RunConfig, parse_overrides, parse_run_config
from common.run.interrupt import RunInterrupted, exit_code, install_handlers, restore_handlers, signal_name
from common.run.interrupt import stopped_at as interrupt_state
from common.run.results import (
    HELD_LOCK_ENV, LOCK_FILE, default_run_name, lock_run_folder, plan_run_folder, read_metrics, reserve_run_folder,
    results_root,
)
from server_app.outcome import STATUS_FAILED_ROUNDS, STATUS_OK
from fedsynth.app_config import ENGINES, app_defaults
from fedsynth.study.cli import add_study_parser, study_command


def find_app_dir(start: Path | None = None) -> Path:
    """The Flower app directory: the nearest folder with a pyproject.toml declaring [tool.flwr.app]."""
    candidates = [start] if start else [Path.cwd(), Path(__file__).resolve().parent.parent]
    for origin in candidates:
        for folder in [origin, *origin.parents]:
            pyproject = folder / "pyproject.toml"
            if pyproject.is_file() and "[tool.flwr.app]" in pyproject.read_text():
                return folder
    raise SystemExit("fedsynth: no Flower app found (a pyproject.toml with [tool.flwr.app]); use --app-dir")


# Exit codes of `fedsynth run` and `fedsynth compare` (docs/reliability.md).
EXIT_OK = 0             # every round aggregated, final model finite, results written
EXIT_FAILED = 1         # the run failed: no usable model (never aggregated, non-finite), or an error mid-run
EXIT_BAD_INPUT = 2      # refused before the run: config, data, results folder (in use, would be overwritten), checkpoint
EXIT_FAILED_ROUNDS = 3  # completed and results written, but some rounds had fewer than min-nodes usable replies


def prepare_run_config(app_dir: Path, overrides: dict[str, Any]) -> tuple[dict[str, Any], RunConfig]:
    """Overrides completed so that the results folder is known before the run starts.

    Without a run-name, a new folder is reserved under a unique name (a suffix when
    another run took the same timestamp).
    """
    from server_app.registry import SERVER_STRATEGIES

    fused = {**app_defaults(app_dir), **overrides}
    cfg = parse_run_config(fused, SERVER_STRATEGIES)
    root = results_root(cfg.results_dir)
    prepared = dict(overrides)
    prepared["results-dir"] = str(root)
    prepared["run-name"] = cfg.run_name or reserve_run_folder(root, default_run_name(cfg)).name
    return prepared, cfg


def check_resources(num_supernodes: int, cpus_per_client: float, gpus_per_client: float,
                    on_cluster: bool = False) -> None:
    """The simulation's resource options, refused before Ray starts (where a bad one gave a 48-line traceback).

    On a Ray cluster the GPUs are the cluster's, checked by `fedsynth.ray_cluster.check_cluster`, not this host's.
    """
    import math

    if num_supernodes < 1:
        raise ConfigError(f"--num-supernodes {num_supernodes}: at least 1 SuperNode is needed")
    if not (math.isfinite(cpus_per_client) and cpus_per_client > 0):
        raise ConfigError(f"--cpus-per-client {cpus_per_client:g}: a number of CPUs > 0 (fractions allowed), "
                          "e.g. --cpus-per-client 1")
    if not (math.isfinite(gpus_per_client) and gpus_per_client >= 0):
        raise ConfigError(f"--gpus-per-client {gpus_per_client:g}: a number of GPUs >= 0")
    if gpus_per_client > 0 and not on_cluster:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--gpus-per-client {gpus_per_client:g} but this machine has no CUDA GPU that torch "
                              "can use; leave --gpus-per-client at 0 to run on CPUs")


def preflight(cfg: RunConfig, folder: Path, num_supernodes: int, cpus_per_client: float,
              gpus_per_client: float = 0.0, on_cluster: bool = False) -> Any:
    """The checks that need no simulation engine, so that bad input fails in seconds, not after its start-up.

    The dataset's files, the node count against min-nodes, the CPUs asked for, the
    results folder (taken and locked here: a second run on it is refused at once;
    one holding another run is refused unless resume or overwrite) and, for a
    resume, the checkpoint against this config. Returns the folder's lock, held
    for the run (the ServerApp in this process sees it through HELD_LOCK_ENV).
    On a Ray cluster the CPUs are the cluster's, checked by `fedsynth.ray_cluster`,
    not this machine's.
    """
    from common.data.datasets import check_dataset_present
    from common.records import model_weights
    from common.run.task import make_model
    from server_app.checkpoint import load_checkpoint

    check_resources(num_supernodes, cpus_per_client, gpus_per_client)
    if num_supernodes < cfg.min_nodes:
        raise ConfigError(f"--num-supernodes {num_supernodes} is below run config key 'min-nodes' = {cfg.min_nodes}; "
                          "no round could count")
    cpus = os.cpu_count() or 1
    if cpus_per_client > cpus and not on_cluster:
        raise ConfigError(f"--cpus-per-client {cpus_per_client:g} is more than the {cpus} CPUs of this machine: no "
                          f"ClientApp could start; use at most {cpus}")
    if cfg.partition != "node":  # the nodes' own folders are checked by each node at the handshake
        check_dataset_present(cfg.dataset, cfg.data_dir)
    lock = lock_run_folder(folder)
    try:
        if plan_run_folder(folder, cfg.resume, cfg.overwrite):
            load_checkpoint(folder, cfg, model_weights(make_model(cfg)))
    except BaseException:
        lock.close()
        raise
    os.environ[HELD_LOCK_ENV] = f"{os.getpid()}:{folder / LOCK_FILE}"
    return lock


def backend_config(cpus_per_client: float, gpus_per_client: float = 0.0, ray_address: str | None = None,
                   placement_file: Path | None = None) -> dict[str, Any]:
    """Flower's Ray backend config: each ClientApp's CPUs and (fractional) GPUs, and the cluster to join if any.

    `address` reaches `ray.init` through Flower's `init_args`; the placement file
    is read by `fedsynth.ray_backend.ClusterRayBackend` (Flower's backend ignores it).
    """
    config: dict[str, Any] = {
        "client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
        "init_args": {"logging_level": "ERROR", "log_to_driver": True},
    }
    if ray_address:
        config["init_args"]["address"] = ray_address
    if placement_file is not None:
        from fedsynth.ray_backend import PLACEMENT_KEY

        config[PLACEMENT_KEY] = str(placement_file)
    return config


PLACEMENT_FILE = "ray-placement.jsonl"  # on a Ray cluster: which node ran each partition (fedsynth.ray_backend)


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


def run_simulation(app_dir: Path, overrides: dict[str, Any], num_supernodes: int, cpus_per_client: float,
                   gpus_per_client: float = 0.0, ray_address: str | None = None, engine: str = "simulation") -> Path:
    """Run the app in Flower's simulation engine in this process; returns the results folder.

    Uses the same entry Flower's own simulation runtime uses for `flwr run`, with
    the run's override config, so ServerApp and ClientApps see the fused config.
    Any exception of the ServerApp is re-raised here. The checks that need no
    engine run first (`preflight`), so bad input fails in seconds. With a
    `ray_address`, the cluster is checked first (`fedsynth.ray_cluster`) and the
    engine runs `fedsynth.ray_backend.ClusterRayBackend` on it. With `engine =
    "inprocess"` the same fused config runs on `fedsynth.inprocess.InProcessGrid`.
    """
    if engine == "inprocess" and ray_address:
        raise ConfigError("--engine inprocess runs every node in this process; it cannot use --ray-address")
    prepared, cfg = prepare_run_config(app_dir, overrides)
    folder = Path(prepared["results-dir"]) / prepared["run-name"]
    if ray_address:
        from fedsynth.ray_cluster import check_cluster

        check_cluster(ray_address, cpus_per_client, gpus_per_client)
    lock = preflight(cfg, folder, num_supernodes, cpus_per_client, gpus_per_client, on_cluster=bool(ray_address))
    try:
        if engine == "inprocess":
            _run_in_process(app_dir, prepared, num_supernodes)
        else:
            _simulate(app_dir, prepared, num_supernodes, cpus_per_client, gpus_per_client, ray_address,
                      folder / PLACEMENT_FILE if ray_address else None)
    finally:
        lock.close()
        os.environ.pop(HELD_LOCK_ENV, None)
    if not (folder / "summary.json").is_file():
        raise RuntimeError(f"the run ended without writing {folder / 'summary.json'}")
    return folder


def _simulate(app_dir: Path, prepared: dict[str, Any], num_supernodes: int, cpus_per_client: float,
              gpus_per_client: float, ray_address: str | None = None, placement_file: Path | None = None) -> None:
    """Flower's simulation runtime on the prepared run config (the ServerApp's exceptions re-raised)."""
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir
    from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
    from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    run_id = generate_rand_int_from_bytes(RUN_ID_NUM_BYTES)
    run = Run.create_empty(run_id=run_id)
    run.override_config = prepared
    run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    context = Context(
        run_id=run_id, node_id=0, node_config={}, state=RecordDict(),
        run_config=get_fused_config_from_dir(app_dir, prepared),
    )
    components = _components(app_dir)
    with _pythonpath_restored(), _cluster_backend(bool(ray_address)), _sigterm_handler_kept():
        _run_simulation(
            num_supernodes=num_supernodes,
            exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
            client_app_attr=components["clientapp"],
            server_app_attr=components["serverapp"],
            backend_name="ray",
            backend_config=backend_config(cpus_per_client, gpus_per_client, ray_address, placement_file),
            server_app_context=context,
            app_dir=str(app_dir),
            run=run,
            is_app=True,
        )


def _run_in_process(app_dir: Path, prepared: dict[str, Any], num_supernodes: int) -> None:
    """The prepared run on the in-process grid: one Context per node, as the simulation engine makes them.

    Why a second engine: a study runs one run per core, and in the simulation engine each run's Ray
    starts as many ClientApp actors as the host has cores, plus Ray's own processes. With two runs on
    two cores, a round of 100 small nodes took 8.96 s there and 4.79 s here (0.53x), with the same
    metrics and model (tests/test_simulation.py; benchmarks/results/inprocess-engine.md). Nodes train
    one after another, so it suits runs whose nodes would share a few cores anyway, and hosts without Ray.
    """
    from flwr.common.config import get_fused_config_from_dir

    from fedsynth.inprocess import InProcessGrid, run_federation

    run_config = get_fused_config_from_dir(app_dir, prepared)
    run_federation(dict(run_config), InProcessGrid(num_supernodes, dict(run_config), keep_sent=False))


def _cluster_backend(on_cluster: bool) -> contextlib.AbstractContextManager[None]:
    """On a Ray cluster, the engine's backend is `ClusterRayBackend` (lost nodes, placement); else Flower's own."""
    if not on_cluster:
        return contextlib.nullcontext()
    from fedsynth.ray_backend import installed

    return installed()


@contextlib.contextmanager
def _pythonpath_restored() -> Iterator[None]:
    """Give this process back the PYTHONPATH it had before Flower's Ray backend started.

    `RayBackend.init_ray` writes the driver's whole `sys.path` (the venv's
    site-packages and its interpreter's stdlib) into `os.environ["PYTHONPATH"]` and
    leaves it there. Every later subprocess of this process then inherits it, and a
    system tool run by another interpreter (Debian's `/usr/bin/docker-compose`)
    imports the venv's packages and crashes.
    """
    before = os.environ.get("PYTHONPATH")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@contextlib.contextmanager
def _sigterm_handler_kept() -> Iterator[None]:
    """Keep this process's SIGTERM handler while Flower starts Ray in it.

    `ray.init` in a driver's main thread replaces the SIGTERM handler with one that
    calls `sys.exit` wherever the main thread is; under Flower's engine loop that
    ended the process with SIGABRT (exit 134), no summary and no message (issue 34).
    While the CLI's handler (common/run/interrupt.py) is installed, Ray's registration
    is skipped, so SIGTERM stops the run as SIGINT does.
    """
    import signal

    from ray._private import utils as ray_utils

    ours = signal.getsignal(signal.SIGTERM)
    original = ray_utils.set_sigterm_handler
    if callable(ours) and getattr(ours, "__module__", "") == "common.run.interrupt":
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


def _components(app_dir: Path) -> dict[str, str]:
    import tomllib

    with open(app_dir / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["tool"]["flwr"]["app"]["components"]


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
    (folder / "comparison.md").write_text("\n".join(lines) + "\n")


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
    return parser


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
