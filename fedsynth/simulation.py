"""Running the app in Flower's simulation engine from Python, as `flwr run .` does, or in this process.

`run_simulation` fuses the app's pyproject config with the overrides (as
`flwr run` does), checks what needs no engine first (`preflight`: data, node
count, CPUs, the results folder and its lock, a resume's checkpoint), and runs
the ServerApp and the ClientApps in Flower's Ray simulation engine
(`backend_config`; on a Ray cluster with `fedsynth.ray_backend`) or, with the
`inprocess` engine, in this process (`fedsynth.inprocess`). The `fedsynth`
command (`fedsynth.cli`), the study tool and the benchmarks all run through it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.run.config import ConfigError, RunConfig, parse_run_config
from common.run.results import (
    HELD_LOCK_ENV, LOCK_FILE, default_run_name, lock_run_folder, plan_run_folder, reserve_run_folder, results_root,
)
from fedsynth.app_config import app_defaults

def find_app_dir(start: Path | None = None) -> Path:
    """The Flower app directory: the nearest folder with a pyproject.toml declaring [tool.flwr.app]."""
    candidates = [start] if start else [Path.cwd(), Path(__file__).resolve().parent.parent]
    for origin in candidates:
        for folder in [origin, *origin.parents]:
            pyproject = folder / "pyproject.toml"
            if pyproject.is_file() and "[tool.flwr.app]" in pyproject.read_text():
                return folder
    if start:  # the folder the user named: say which, rather than ask for the option they gave
        raise SystemExit(f"fedsynth: --app-dir {start}: no Flower app there or in a folder above it (a "
                         "pyproject.toml with [tool.flwr.app])")
    raise SystemExit("fedsynth: no Flower app found (a pyproject.toml with [tool.flwr.app]); use --app-dir")


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
