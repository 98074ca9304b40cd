"""A Flower deployment on loopback: one SuperLink and N SuperNodes as local processes.

The deployment engine is what real federations run (every ClientApp message
in a new `flwr-clientapp` process, node state carried only by
`Context.state`), so tests and benchmarks that must see its behaviour start
one here: insecure, on 127.0.0.1 only, with its own `FLWR_HOME`, a connection
named `loopback`, free ports, logs in the working folder, and runtime
dependency installation off (Flower would otherwise reinstall torch into a
fresh environment). Every process runs in its own session so that stopping it
also stops the `flower-superexec` children it starts; leaving the `with` block
stops them all.

By default (`warm_clientapp=True`) `deploy/warm-clientapp` comes first on the SuperNodes' `PATH`: their
ClientApp tasks are forked from a warm server (fedsynth/warm_clientapp), as `deploy/supernode.sh` and the
compose services run them. `warm_clientapp=False` starts every task as a new `flwr-clientapp` process, Flower's
own way (the benchmarks compare the two). The SuperNodes run under `deploy/supernode-waits.py` (Flower's
SuperNode with adaptive waits, as `deploy/supernode.sh` and the compose services run it); `adaptive_waits=False`
(or FEDSYNTH_ADAPTIVE_WAITS=0 in the environment, when the argument is not given) gives them Flower's own waits.

`app_copy` gives `flwr run` the app as it ships (pyproject.toml and its
packages): in a checkout that holds the `.venv`, `flwr build` walks the whole
virtualenv before excluding it, which took 29 s per run on a loaded 2-core
machine against 7 s for the copy.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import TracebackType

BIN = Path(sys.executable).parent
WARM_CLIENTAPP_DIR = Path(__file__).resolve().parent.parent / "deploy" / "warm-clientapp"
SUPERNODE_WAITS = Path(__file__).resolve().parent.parent / "deploy" / "supernode-waits.py"
CONNECTION = "loopback"


def app_copy(app_dir: Path, target: Path) -> Path:
    """`target`: the Flower app of `app_dir` as `flwr run` ships it (pyproject.toml, README.md, its packages)."""
    app_dir, target = Path(app_dir), Path(target)
    target.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(app_dir / name, target / name)
    for package in app_packages(app_dir):
        shutil.copytree(app_dir / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def app_packages(app_dir: Path) -> list[str]:
    """The app's top-level packages: pyproject.toml's `[tool.setuptools.packages.find] include` without the `*`."""
    find = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return [pattern.rstrip("*") for pattern in find["include"] if "." not in pattern.rstrip("*")]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that are free now."""
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_for_port(port: int, timeout: float) -> None:
    """Return once something accepts connections on 127.0.0.1:`port`; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


def stop_process_groups(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each process's group, then SIGKILL what is still running after 15 s."""
    for proc in processes:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in processes:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


class LoopbackFederation:
    """SuperLink + `num_nodes` SuperNodes (partition i of `num_nodes`) under `workdir`; use as a context manager.

    `node_configs` gives every SuperNode its whole node config instead (sites with their own data:
    `dataset-path=... name=...`, no partition ids); `num_nodes` is then its length.
    """

    def __init__(self, workdir: Path, num_nodes: int, extra_env: dict[str, str] | None = None,
                 node_config: str = "", node_configs: list[str] | None = None, warm_clientapp: bool = True,
                 adaptive_waits: bool | None = None) -> None:
        self.workdir = Path(workdir)
        self.num_nodes = len(node_configs) if node_configs is not None else num_nodes
        num_nodes = self.num_nodes
        self.node_config = node_config  # added to every node's "partition-id=i num-partitions=N"
        self.node_configs = node_configs
        self.link_port, *self.node_ports = free_ports(num_nodes + 1)
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.env = {
            **os.environ, "FLWR_HOME": str(self.flwr_home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_LOG_LEVEL": "WARNING",
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(extra_env or {}),
        }
        if warm_clientapp:
            self.env["PATH"] = f"{WARM_CLIENTAPP_DIR}{os.pathsep}{self.env['PATH']}"
        if adaptive_waits is not None:
            self.env["FEDSYNTH_ADAPTIVE_WAITS"] = "1" if adaptive_waits else "0"
        self.processes: list[subprocess.Popen] = []
        self.nodes: list[subprocess.Popen] = []  # SuperNode i is self.nodes[i]

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        handle = open(self.logs / f"{name}.log", "w")
        self.processes.append(subprocess.Popen(args, cwd=self.workdir, env=self.env, stdout=handle,
                                               stderr=subprocess.STDOUT, start_new_session=True))
        return self.processes[-1]

    def _node_command(self, node_config: str, port: int) -> list[str]:
        """A SuperNode of this federation: Flower's, under deploy/supernode-waits.py."""
        return [sys.executable, str(SUPERNODE_WAITS), "--", "flower-supernode", "--insecure", "--superlink",
                f"127.0.0.1:{self.link_port}", "--node-config", node_config, "--port", str(port)]

    def __enter__(self) -> "LoopbackFederation":
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.link_port}"\ninsecure = true\n'
        )
        try:
            self._start("superlink", [str(BIN / "flower-superlink"), "--insecure",
                                      "--database", str(self.workdir / "state.db"), "--port", str(self.link_port),
                                      "--disable-runtime-dependency-installation"])
            wait_for_port(self.link_port, 60)
            for pid, port in enumerate(self.node_ports):
                config = (self.node_configs[pid] if self.node_configs is not None else
                          f"partition-id={pid} num-partitions={self.num_nodes} {self.node_config}".strip())
                self.nodes.append(self._start(f"supernode-{pid}", self._node_command(config, port)))
        except BaseException:
            stop_process_groups(self.processes)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        stop_process_groups(self.processes)

    def run(self, app_dir: Path, run_config: str, timeout: float = 420) -> subprocess.CompletedProcess:
        """`flwr run <app_dir> loopback --stream --run-config <run_config>`, waiting for the run to end."""
        return subprocess.run([str(BIN / "flwr"), "run", ".", CONNECTION, "--stream", "--run-config", run_config],
                              cwd=app_dir, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_run(self, app_dir: Path, run_config: str) -> subprocess.Popen:
        """`run` without waiting: the `flwr run` process, its output piped (text)."""
        return subprocess.Popen([str(BIN / "flwr"), "run", ".", CONNECTION, "--stream", "--run-config", run_config],
                                cwd=app_dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def submit(self, app_dir: Path, run_config: str) -> int:
        """`flwr run <app_dir> loopback --format json`: start a run without streaming it; returns its run id."""
        import json

        result = subprocess.run([str(BIN / "flwr"), "run", ".", CONNECTION, "--format", "json", "--run-config",
                                 run_config], cwd=app_dir, env=self.env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"flwr run failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}")
        return int(json.loads(result.stdout)["run-id"])

    def status(self, run_id: int) -> str:
        """The SuperLink's status of a run (`flwr ls --run-id`), e.g. "running" or "finished:completed"."""
        import json

        result = subprocess.run([str(BIN / "flwr"), "ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
                                cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"flwr ls failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}")
        return str(json.loads(result.stdout)["runs"][0]["status"])

    def wait_until_finished(self, run_id: int, timeout: float, summary: Path | None = None) -> str:
        """Poll `status` until the run has finished (every 2 s); returns the final status, TimeoutError after `timeout`.

        With `summary` (the run's summary.json, written as it ends), wait for that file first: a stat
        every 0.5 s instead of a `flwr ls` process every 2 s, which costs a second or two of CPU each
        and took that from the run on a 2-core machine. The wait ends early if the status is already
        "finished" (a run that failed before it wrote anything) -- checked every 20 s.
        """
        deadline = time.monotonic() + timeout
        status = ""
        if summary is not None:
            next_check = time.monotonic() + 20
            while not Path(summary).is_file() and time.monotonic() < deadline:
                if time.monotonic() >= next_check:
                    if self.status(run_id).startswith("finished"):
                        break
                    next_check = time.monotonic() + 20
                time.sleep(0.5)
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            time.sleep(2)
        raise TimeoutError(f"run {run_id} not finished after {timeout:.0f}s (status {status!r})")

    def add_node(self, node_config: str) -> int:
        """Start one more SuperNode with `node_config` (a node joining the running federation); returns its index."""
        (port,) = free_ports(1)
        self.node_ports.append(port)
        self.nodes.append(self._start(f"supernode-{len(self.nodes)}", self._node_command(node_config, port)))
        return len(self.nodes) - 1

    def kill_node(self, partition_id: int) -> None:
        """SIGKILL SuperNode `partition_id` and the ClientApp it runs (its process group), as a crash would."""
        node = self.nodes[partition_id]
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=15)

    def log_tails(self, chars: int = 1500) -> str:
        """The end of every process's log, for an assertion message."""
        return "".join(f"\n--- {f.name}\n{f.read_text()[-chars:]}" for f in sorted(self.logs.iterdir()))
