"""A federation across hosts, set up only with the scripts in deploy/: TLS and SuperNode auth on.

Each "host" is a network namespace that the test creates: the SuperLink's namespace is joined to
every other host's namespace by its own veth pair with test-only addresses (10.231.<i>.1/30 on the
SuperLink's side, .2 on the host's). No namespace has a link to the machine's own network, so no
traffic can leave the machine; the namespaces are deleted in a finally block. Hosts: the operator
(the `flwr` CLI), two SuperNodes, and an intruder that tries to join (a) with a key nobody
registered and (b) without the federation's CA certificate. A 2-round FedAvg run then has to
finish with the usual results folder.

Where namespaces cannot be created (not root, no `ip`), the same processes run on loopback, and
the test says so in its output.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedsynth.loopback import app_copy

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
SUBNET = "10.231"  # test-only addresses, configured inside the namespaces only
LINK_PORT = 8000


@dataclass
class Host:
    """A machine of the federation: a network namespace, or this machine's loopback."""

    name: str
    netns: str | None
    superlink: str  # host:port this host dials to reach the SuperLink
    address: str  # this host's own address, as the SuperLink sees it

    def wrap(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)


@dataclass
class Network:
    """The SuperLink's host plus one host per name, in namespaces when this machine allows it."""

    names: list[str]
    link: Host = field(init=False)
    hosts: dict[str, Host] = field(init=False, default_factory=dict)
    namespaces: list[str] = field(init=False, default_factory=list)
    fallback_reason: str = field(init=False, default="")

    def __enter__(self) -> "Network":
        try:
            self._create_namespaces()
        except (OSError, subprocess.CalledProcessError) as err:
            self._delete_namespaces()
            self.fallback_reason = _explain(err)
            self._use_loopback()
        return self

    def __exit__(self, *exc: object) -> None:
        self._delete_namespaces()

    @property
    def isolated(self) -> bool:
        return not self.fallback_reason

    def superlink_sans(self) -> list[str]:
        """subjectAltName entries: every address the SuperLink is dialled at.

        That includes 127.0.0.1, where the SuperLink's own executor (subprocess isolation) dials it.
        """
        dialled = {h.superlink.rsplit(":", 1)[0] for h in self.hosts.values()} | {"127.0.0.1"}
        return sorted(f"IP:{address}" for address in dialled)

    def _create_namespaces(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("not root: creating network namespaces needs CAP_NET_ADMIN")
        if shutil.which("ip") is None:
            raise FileNotFoundError("the `ip` command (iproute2) is not installed")
        tag = f"fs7-{os.getpid()}"
        link_ns = f"{tag}-link"
        self._ip("netns", "add", link_ns)
        self.namespaces.append(link_ns)
        self._ip("-n", link_ns, "link", "set", "lo", "up")
        self.link = Host("link", link_ns, f"127.0.0.1:{LINK_PORT}", "127.0.0.1")
        for index, name in enumerate(self.names, start=1):
            ns = f"{tag}-{name}"
            self._ip("netns", "add", ns)
            self.namespaces.append(ns)
            # One veth pair per host, created directly inside the two namespaces.
            self._ip("link", "add", "name", f"veth{index}", "netns", link_ns, "type", "veth",
                     "peer", "name", "veth0", "netns", ns)
            self._ip("-n", link_ns, "addr", "add", f"{SUBNET}.{index}.1/30", "dev", f"veth{index}")
            self._ip("-n", ns, "addr", "add", f"{SUBNET}.{index}.2/30", "dev", "veth0")
            for namespace, device in ((link_ns, f"veth{index}"), (ns, "veth0"), (ns, "lo")):
                self._ip("-n", namespace, "link", "set", device, "up")
            self.hosts[name] = Host(name, ns, f"{SUBNET}.{index}.1:{LINK_PORT}", f"{SUBNET}.{index}.2")

    def _use_loopback(self) -> None:
        port = _free_port()
        self.link = Host("link", None, f"127.0.0.1:{port}", "127.0.0.1")
        self.hosts = {name: Host(name, None, f"127.0.0.1:{port}", "127.0.0.1") for name in self.names}

    def _delete_namespaces(self) -> None:
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self.namespaces.clear()

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _explain(err: BaseException) -> str:
    if isinstance(err, subprocess.CalledProcessError):
        return f"`{' '.join(err.cmd)}` failed: {(err.stderr or '').strip()}"
    return str(err)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    """Long-running processes of the test, each in its own session so that its children stop too."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[subprocess.Popen] = []

    def start(self, host: Host, argv: list[str], log: str, home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "FLWR_HOME": str(home)}
        with open(self.logs / log, "wb") as out:
            proc = subprocess.Popen(host.wrap(argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.started:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.started:
            # Flower's executors watch their parent's pid and leave with it; a leader that
            # ignored SIGTERM takes its whole group down with it.
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run(host: Host, argv: list[str], env: dict[str, str], home: Path, timeout: float = 90) -> str:
    """A short command on `host`; its output, or the test fails showing it."""
    result = subprocess.run(host.wrap(argv), env={**env, "FLWR_HOME": str(home)}, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"{path.name}: process exited ({proc.returncode}):\n{path.read_text()}"
        time.sleep(0.5)
    raise AssertionError(f"{path.name}: no '{text}' after {timeout}s:\n{path.read_text()}")


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert proc.poll() is None, f"the SuperLink exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {path} after {timeout}s:\n{log.read_text()[-4000:]}"
        time.sleep(1)


def test_tls_authenticated_federation_across_hosts(tmp_path: Path, tiny_data_dir: Path) -> None:
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` is needed by deploy/pki.sh (.ci/run installs it)")
    import certifi

    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    certs = tmp_path / "certs"
    results = tmp_path / "results"
    procs = Processes(env, logs)
    start = time.monotonic()

    def phase(text: str) -> None:
        print(f"multi-host: {time.monotonic() - start:6.1f}s {text}")

    with Network(["operator", "node0", "node1", "intruder"]) as net:
        if net.isolated:
            print(f"multi-host: {len(net.namespaces)} network namespaces, SuperLink at "
                  f"{SUBNET}.<i>.1:{LINK_PORT} on one veth pair per host")
        else:
            message = (f"network namespaces unavailable ({net.fallback_reason}); "
                       f"falling back to loopback processes")
            print(f"multi-host: {message}")
            warnings.warn(message, stacklevel=1)
        link, operator, intruder = net.link, net.hosts["operator"], net.hosts["intruder"]
        try:
            # (a) CA, SuperLink certificate naming every address it is dialled at, node keys.
            pki = str(DEPLOY / "pki.sh")
            run(link, [pki, "ca", str(certs)], env, tmp_path / "pki")
            run(link, [pki, "server", str(certs), "superlink", *net.superlink_sans()], env, tmp_path / "pki")
            for name in ("node-0", "node-1", "intruder"):
                run(link, [pki, "node-key", str(certs), name], env, tmp_path / "pki")

            # (b) SuperLink with TLS and SuperNode authentication.
            port = link.superlink.rsplit(":", 1)[1]
            superlink = procs.start(link, [str(DEPLOY / "superlink.sh"), "--certs", str(certs),
                                           "--host", "0.0.0.0", "--port", port,
                                           "--database", str(tmp_path / "state.db")],
                                    "superlink.log", tmp_path / "home-link")
            wait_for_text(logs / "superlink.log", "Application startup complete", superlink, 90)
            phase("SuperLink up (TLS, SuperNode authentication)")

            # (c) The operator registers the two SuperNodes' public keys over the network.
            home_op = tmp_path / "home-operator"
            run(operator, [str(DEPLOY / "connection.sh"), "fed", operator.superlink, str(certs / "ca.crt")],
                env, home_op)
            run(operator, [str(DEPLOY / "register-supernodes.sh"), "fed",
                           str(certs / "node-0.pub"), str(certs / "node-1.pub")], env, home_op)
            phase("node-0 and node-1 registered by the operator")

            # (d) One SuperNode per host, its partition, data and device in the node config.
            for i in (0, 1):
                host = net.hosts[f"node{i}"]
                runtime_port = "9094" if net.isolated else str(_free_port())
                procs.start(host, [str(DEPLOY / "supernode.sh"), "--superlink", host.superlink,
                                   "--ca", str(certs / "ca.crt"), "--key", str(certs / f"node-{i}"),
                                   "--partition-id", str(i), "--num-partitions", "2",
                                   "--data-dir", str(tiny_data_dir), "--cache-dir", str(tmp_path / f"cache-{i}"),
                                   "--device", "cpu", "--port", runtime_port],
                            f"node{i}.log", tmp_path / f"home-node{i}")

            # The intruder, while the run goes on: a key nobody registered, then no CA certificate.
            # (--activation-wait 0: give up at the first refusal, instead of retrying it for 90 s as a
            # restarted node's refusal is retried.)
            give_up = ["--", "--max-retries", "1", "--max-wait-time", "30"]
            unregistered = procs.start(intruder, [str(DEPLOY / "supernode.sh"), "--superlink", intruder.superlink,
                                                  "--ca", str(certs / "ca.crt"), "--key", str(certs / "intruder"),
                                                  "--partition-id", "0", "--num-partitions", "2",
                                                  "--port", str(_free_port()), "--activation-wait", "0", *give_up],
                                       "intruder-unregistered.log", tmp_path / "home-intruder-a")
            # A registered key, but trusting only the public CAs (certifi) instead of ours.
            no_ca = procs.start(intruder, [str(DEPLOY / "supernode.sh"), "--superlink", intruder.superlink,
                                           "--ca", certifi.where(), "--key", str(certs / "node-0"),
                                           "--partition-id", "0", "--num-partitions", "2",
                                           "--port", str(_free_port()), *give_up],
                                "intruder-no-ca.log", tmp_path / "home-intruder-b")

            # A 2-round FedAvg run, started by the operator.
            overrides = (f"algorithm='fedavg' num-server-rounds=2 results-dir='{results}' "
                         f"run-name='multihost' data-dir='{tiny_data_dir}' node-wait-timeout=120.0 "
                         f"round-timeout=300.0")
            started = json.loads(run(operator, ["flwr", "run", str(app_copy(REPO, tmp_path / "app")), "fed",
                                                "--format", "json", "--run-config", overrides], env, home_op))
            run_id = str(started["run-id"])
            phase(f"run {run_id} started")
            # Wait on the results folder (cheap) rather than polling `flwr ls` (a CLI start each),
            # then ask the SuperLink how the run ended. Generous limits: CI machines are shared.
            folder = results / "multihost"
            wait_for_file(folder / "summary.json", superlink, timeout=420, log=logs / "superlink.log")
            status, deadline = "", time.monotonic() + 90
            while not status.startswith("finished") and time.monotonic() < deadline:
                listing = json.loads(run(operator, ["flwr", "ls", "fed", "--run-id", run_id, "--format", "json"],
                                         env, home_op))
                status = listing["runs"][0]["status"]
            assert status == "finished:completed", (
                f"run {run_id} ended as '{status}'\n" + (logs / "superlink.log").read_text()[-4000:])
            phase("run finished:completed")

            for name in ("config.json", "metrics.jsonl", "summary.json", "model.safetensors", "accuracy.png"):
                assert (folder / name).is_file(), f"{name} missing from {folder}"
            rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            assert [r["round"] for r in rounds] == [0, 1, 2]
            assert all(r["answered"] == 2 and r["failed"] == 0 for r in rounds[1:])
            config = json.loads((folder / "config.json").read_text())
            assert config["num-server-rounds"] == 2

            # The intruder was turned away: unknown key refused, unknown CA not trusted.
            assert unregistered.wait(timeout=60) == 78  # Flower logs "Exit Code: 305"; supernode.sh gives up with 78
            assert no_ca.wait(timeout=60) != 0
            unregistered_log = (logs / "intruder-unregistered.log").read_text()
            no_ca_log = (logs / "intruder-no-ca.log").read_text()
            link_log = (logs / "superlink.log").read_text()
            assert "Failed to activate SuperNode" in unregistered_log, unregistered_log
            assert "its key is not registered (deploy/register-supernodes.sh)" in unregistered_log, unregistered_log
            assert "No SuperNode found with the given public key" in link_log
            assert "CERTIFICATE_VERIFY_FAILED" in no_ca_log, no_ca_log
            if net.isolated:
                # The nodes' requests reached the SuperLink from their own hosts' addresses.
                for name in ("operator", "node0", "node1"):
                    assert f"{net.hosts[name].address}:" in link_log, f"no request from {name}"
            phase("intruder refused twice (unregistered key, no CA certificate)")

            # A CLI that does not trust our CA: what docs/deployment.md says the operator sees.
            run(operator, [str(DEPLOY / "connection.sh"), "no-ca", operator.superlink, certifi.where()], env, home_op)
            no_ca_cli = subprocess.run(operator.wrap(["flwr", "ls", "no-ca"]), capture_output=True, text=True,
                                       timeout=120, env={**env, "FLWR_HOME": str(home_op)})
            assert no_ca_cli.returncode != 0
            assert "Connection to the SuperLink is unavailable" in no_ca_cli.stdout + no_ca_cli.stderr, (
                no_ca_cli.stdout + no_ca_cli.stderr)
            phase("a CLI without our CA: 'Connection to the SuperLink is unavailable'")
        finally:
            procs.stop_all()
