"""The deployment files: compose files, the scripts in deploy/ and what they hand to Flower.

Fast checks (seconds, no Docker engine, no network): docker-compose.yml and its GPU and N-node
variants are valid compose files (`docker-compose config`), every Flower flag in them and in
the commands our scripts build is one that the installed Flower 1.42 accepts (its `--help`) and
not a deprecated one, certificates made by deploy/pki.sh let a TLS client in only when it trusts
our CA and dials a name in the subjectAltName, insecure mode is only reached by asking for it, and
the image installs exactly the dependencies of pyproject.toml.
"""

from __future__ import annotations

import os
import re
import shutil
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import textwrap
import time
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests import supernode_standin

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent
FLOWER_COMMANDS = ("flower-superlink", "flower-supernode", "flower-superexec")


@cache
def accepted_flags(command: str) -> dict[str, str]:
    """Long options of an installed Flower command -> their help text, from `--help`."""
    out = subprocess.run([str(VENV_BIN / command), "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    options = out.split("\noptions:", 1)[1]
    flags: dict[str, str] = {}
    current = None
    for line in options.splitlines():
        match = re.match(r"^  (?:-\w, )?(--[\w-]+)", line)
        if match:
            current = match.group(1)
            flags[current] = line
        elif current:
            flags[current] += " " + line.strip()
    return flags


def rejected_flags(command: str, argv: list[str]) -> list[str]:
    """Flags of argv that `command` does not accept, or accepts only as deprecated."""
    flags = accepted_flags(command)
    bad = []
    for arg in argv:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        if name not in flags:
            bad.append(f"{name} (unknown)")
        elif "deprecated" in flags[name].lower():
            bad.append(f"{name} (deprecated)")
    return bad


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def flower_commands(compose: dict) -> dict[str, list[str]]:
    """service -> command, for the services that run a Flower command."""
    return {name: service["command"] for name, service in compose["services"].items()
            if service.get("command") and service["command"][0] in FLOWER_COMMANDS}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the compose files and deploy scripts, with keys for three nodes (no data)."""
    root = tmp_path_factory.mktemp("compose")
    for name in ("docker-compose.yml", "docker-compose.gpu.yml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("certs", "data", "compose.nodes.yml"))
    for i in range(3):
        subprocess.run([str(root / "deploy" / "pki.sh"), "node-key", str(root / "deploy" / "certs"), f"node-{i}"],
                       check=True, capture_output=True)
    subprocess.run([str(root / "deploy" / "compose-nodes.sh"), "3"], check=True, capture_output=True)
    return root


COMPOSE_VARIANTS = {
    "two nodes": ["docker-compose.yml"],
    "gpu": ["docker-compose.yml", "docker-compose.gpu.yml"],
    "three nodes": ["docker-compose.yml", "deploy/compose.nodes.yml"],
}


@pytest.mark.parametrize("variant", sorted(COMPOSE_VARIANTS))
def test_compose_file_is_valid(scratch: Path, variant: str) -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither docker-compose nor `docker compose` is installed (.ci/run installs docker-compose)")
    files = [arg for name in COMPOSE_VARIANTS[variant] for arg in ("-f", name)]
    result = subprocess.run([*command, *files, "config"], cwd=scratch, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COMPOSE_PROJECT_NAME": "fedsynth"})
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)
    services = merged["services"]
    supernodes = sorted(name for name in services if name.startswith("supernode-"))
    expected = {"two nodes": 2, "gpu": 2, "three nodes": 3}[variant]
    assert len(supernodes) == expected
    for i in range(expected):
        node = services[f"supernode-{i}"]["command"]
        config = node[node.index("--node-config") + 1]
        assert f"partition-id={i} num-partitions={expected} " in config
        assert f"supernodes-per-host={expected}" in config  # torch threads: the host's cores shared out
        assert f"supernode-{i}:9094" in services[f"clientapp-{i}"]["command"]
        # Each node has its own data volume and its own cache volume.
        mounts = [str(v["target"] if isinstance(v, dict) else v.split(":")[1]) for v in services[f"clientapp-{i}"]["volumes"]]
        assert "/data" in mounts and "/cache" in mounts
    if variant == "gpu":
        for i in range(2):
            devices = services[f"clientapp-{i}"]["deploy"]["resources"]["reservations"]["devices"]
            assert devices[0]["capabilities"] == ["gpu"]


@pytest.mark.parametrize("variant", sorted(COMPOSE_VARIANTS))
def test_compose_uses_only_accepted_flower_flags_with_tls(scratch: Path, variant: str) -> None:
    services: dict[str, dict] = {}
    for name in COMPOSE_VARIANTS[variant]:
        for service, spec in yaml.safe_load((scratch / name).read_text())["services"].items():
            services.setdefault(service, {}).update(spec)
    commands = flower_commands({"services": services})
    assert {"superlink", "serverapp", "supernode-0", "clientapp-0"} <= set(commands)
    for service, argv in commands.items():
        assert rejected_flags(argv[0], argv[1:]) == [], service
        assert "--insecure" not in argv, f"{service} runs without TLS"
    link = commands["superlink"]
    # its state file waits 60 s for SQLite's lock, not Flower's 5 s (docs/deployment.md, large models)
    assert services["superlink"]["entrypoint"] == ["/app/deploy/superlink-state.py", "--busy-timeout-ms", "60000",
                                                   "--"]
    assert "--database" in link and (DEPLOY / "superlink-state.py").stat().st_mode & 0o111
    assert {"--enable-supernode-auth", "--ssl-certfile", "--disable-runtime-dependency-installation"} <= set(link)
    for service, argv in commands.items():
        if argv[0] == "flower-supernode":
            assert {"--root-certificates", "--auth-supernode-private-key", "--ssl-certfile"} <= set(argv)
            # restarted by Docker after a crash, and retried while the SuperLink holds its old session
            assert services[service]["restart"] == "unless-stopped", service
            # retry-activation.sh runs Flower's SuperNode under the adaptive waits' launcher (deploy/supernode-waits.py)
            assert services[service]["entrypoint"] == ["/app/deploy/retry-activation.sh", "--"], service
            assert (DEPLOY / "retry-activation.sh").stat().st_mode & 0o111
            assert (DEPLOY / "supernode-waits.py").stat().st_mode & 0o111
        if argv[0] == "flower-superexec":
            assert "--root-certificates" in argv and "--allow-runtime-dependency-installation" not in argv


def test_image_installs_exactly_the_pinned_dependencies() -> None:
    pinned = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [line.strip() for line in (DEPLOY / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert listed == pinned, "deploy/requirements.txt must repeat [project].dependencies of pyproject.toml"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "pip install -r /tmp/requirements.txt" in dockerfile
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in dockerfile
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", "deploy/certs", "results"} <= set(ignored)


# ----- the scripts: what they start, with a stand-in for the Flower command that records argv


def record_argv(bin_dir: Path, command: str) -> Path:
    """Put a `command` on PATH that writes its arguments (NUL-separated) to a file and exits 0."""
    bin_dir.mkdir(exist_ok=True)
    out = bin_dir / f"{command}.argv"
    script = bin_dir / command
    script.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > '{out}'\n")
    script.chmod(0o755)
    return out


def run_script(script: str, args: list[str], bin_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(DEPLOY / script), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    certs = tmp_path_factory.mktemp("pki")
    for args in (["ca"], ["server", "superlink", "DNS:superlink", "DNS:localhost", "IP:127.0.0.1"],
                 ["server", "supernode-0", "DNS:supernode-0"], ["node-key", "node-0"], ["secret", "node-0"]):
        subprocess.run([str(DEPLOY / "pki.sh"), args[0], str(certs), *args[1:]], check=True, capture_output=True)
    return certs


def test_superlink_script_starts_tls_and_node_auth_by_default(tmp_path: Path, pki: Path) -> None:
    out = record_argv(tmp_path / "bin", "flower-superlink")
    # A state file: Flower's SuperLink runs under deploy/superlink-state.py, with a 60 s SQLite busy timeout.
    launcher = record_argv(tmp_path / "bin", "python3")  # the stand-in flower-superlink's shebang is /bin/sh
    result = run_script("superlink.sh", ["--certs", str(pki), "--database", str(tmp_path / "s.db")], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    argv = launcher.read_text().split("\0")[:-1]
    assert argv[:7] == [str(DEPLOY / "superlink-state.py"), "--busy-timeout-ms", "60000", "--busy-limit", "60", "--",
                        "flower-superlink"]
    assert argv[argv.index("--database") + 1] == str(tmp_path / "s.db")
    assert rejected_flags("flower-superlink", argv[7:]) == []
    # Flower's own wait (5 s) runs flower-superlink itself
    result = run_script("superlink.sh", ["--certs", str(pki), "--database", str(tmp_path / "s.db"),
                                         "--busy-timeout", "5"], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    argv = out.read_text().split("\0")[:-1]
    assert rejected_flags("flower-superlink", argv) == []
    assert "--insecure" not in argv
    assert {"--enable-supernode-auth", "--disable-runtime-dependency-installation"} <= set(argv)
    assert argv[argv.index("--ssl-certfile") + 1] == str(pki / "superlink.crt")

    # process isolation with a SuperExec secret, as in docker-compose.yml
    run_script("superlink.sh", ["--certs", str(pki), "--isolation", "process",
                                "--superexec-secret", str(pki / "node-0.secret")], tmp_path / "bin")
    argv = out.read_text().split("\0")[:-1]
    assert rejected_flags("flower-superlink", argv) == []
    assert argv[argv.index("--isolation") + 1] == "process"


def test_superlink_script_is_insecure_only_when_asked(tmp_path: Path, pki: Path) -> None:
    out = record_argv(tmp_path / "bin", "flower-superlink")
    refused = run_script("superlink.sh", [], tmp_path / "bin")
    assert refused.returncode == 2 and "--certs DIR is required" in refused.stderr
    assert not out.exists()
    # A certificate that does not name 127.0.0.1 would leave the SuperLink's own executor outside.
    subprocess.run([str(DEPLOY / "pki.sh"), "server", str(pki), "remote-only", "IP:10.0.0.7"], check=True,
                   capture_output=True)
    refused = run_script("superlink.sh", ["--certs", str(pki), "--name", "remote-only"], tmp_path / "bin")
    assert refused.returncode == 2 and "127.0.0.1" in refused.stderr
    insecure = run_script("superlink.sh", ["--insecure"], tmp_path / "bin")
    assert insecure.returncode == 0 and "WARNING" in insecure.stderr
    argv = out.read_text().split("\0")[:-1]
    assert "--insecure" in argv and "--enable-supernode-auth" not in argv
    assert rejected_flags("flower-superlink", argv) == []


def test_supernode_script_puts_partition_data_and_device_into_node_config(tmp_path: Path, pki: Path) -> None:
    from flwr.common.config import parse_config_args

    out = record_argv(tmp_path / "bin", "flower-supernode")
    result = run_script("supernode.sh", [
        "--superlink", "link.example:8000", "--ca", str(pki / "ca.crt"), "--key", str(pki / "node-0"),
        "--partition-id", "3", "--num-partitions", "4", "--data-dir", "/srv/data", "--device", "cuda:1",
        "--isolation", "process", "--host", "0.0.0.0", "--runtime-certs", str(pki), "--runtime-name",
        "supernode-0", "--superexec-secret", str(pki / "node-0.secret"),
    ], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    argv = out.read_text().split("\0")[:-1]
    assert rejected_flags("flower-supernode", argv) == []
    assert "--insecure" not in argv
    assert argv[argv.index("--root-certificates") + 1] == str(pki / "ca.crt")
    assert argv[argv.index("--auth-supernode-private-key") + 1] == str(pki / "node-0")
    assert argv[argv.index("--ssl-certfile") + 1] == str(pki / "supernode-0.crt")
    node_config = parse_config_args([argv[argv.index("--node-config") + 1]])
    cores = len(os.sched_getaffinity(0))
    assert node_config == {"partition-id": 3, "num-partitions": 4, "data-dir": "/srv/data", "device": "cuda:1",
                           "torch-threads": cores}


@pytest.mark.parametrize("args, threads", [
    (["--supernodes-per-host", "2"], max(1, len(os.sched_getaffinity(0)) // 2)),
    (["--supernodes-per-host", "1000"], 1),
    (["--supernodes-per-host", "2", "--torch-threads", "3"], 3),
])
def test_supernode_script_sets_torch_threads_per_node_on_the_host(tmp_path: Path, args: list[str], threads: int) -> None:
    from flwr.common.config import parse_config_args

    out = record_argv(tmp_path / "bin", "flower-supernode")
    result = run_script("supernode.sh", ["--superlink", "127.0.0.1:8000", "--insecure", "--partition-id", "0",
                                         "--num-partitions", "1", *args], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    argv = out.read_text().split("\0")[:-1]
    assert parse_config_args([argv[argv.index("--node-config") + 1]])["torch-threads"] == threads


def test_superlink_script_creates_the_database_directory_or_says_which_it_cannot(tmp_path: Path) -> None:
    record_argv(tmp_path / "bin", "flower-superlink")
    record_argv(tmp_path / "bin", "python3")  # a state file: deploy/superlink-state.py runs Flower (stand-ins both)
    database = tmp_path / "new" / "deeper" / "state.db"
    result = run_script("superlink.sh", ["--insecure", "--database", str(database)], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    assert database.parent.is_dir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused = run_script("superlink.sh", ["--insecure", "--database", str(blocker / "state.db")], tmp_path / "bin")
    lines = [line for line in refused.stderr.splitlines() if "WARNING" not in line]
    assert refused.returncode == 2 and len(lines) == 1 and str(blocker) in lines[0], refused.stderr


@pytest.mark.parametrize("args, message", [
    (["--partition-id", "0", "--num-partitions", "2"], "--ca must name"),
    (["--partition-id", "2", "--num-partitions", "2", "--ca", "x"], "must be below"),
    (["--partition-id", "a", "--num-partitions", "2"], "must be integers"),
    (["--partition-id", "0", "--num-partitions", "2", "--data-dir", "/a b", "--insecure"], "spaces or quotes"),
    (["--partition-id", "0", "--num-partitions", "2", "--supernodes-per-host", "0", "--insecure"], "positive integer"),
])
def test_supernode_script_refuses_bad_or_insecure_setups(tmp_path: Path, args: list[str], message: str) -> None:
    out = record_argv(tmp_path / "bin", "flower-supernode")
    result = run_script("supernode.sh", ["--superlink", "127.0.0.1:8000", *args], tmp_path / "bin")
    assert result.returncode == 2 and message in result.stderr
    assert not out.exists()


def test_connection_script_writes_a_connection_flwr_reads(tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.cli.flower_config import read_superlink_connection

    home = tmp_path / "flwr-home"
    monkeypatch.setenv("FLWR_HOME", str(home))
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    script = str(DEPLOY / "connection.sh")
    subprocess.run([script, "fed", "10.0.0.5:8000", str(pki / "ca.crt")], check=True, capture_output=True)
    subprocess.run([script, "lab", "127.0.0.1:9000", "--insecure"], check=True, capture_output=True)
    subprocess.run([script, "fed", "link.example:8000", str(pki / "ca.crt")], check=True, capture_output=True)
    fed = read_superlink_connection("fed")
    assert fed.address == "link.example:8000" and fed.root_certificates == str(pki / "ca.crt")
    assert not fed.insecure
    assert read_superlink_connection("lab").insecure
    # flwr's own default connection (simulation) is kept
    assert read_superlink_connection("local").address == ":local:"
    assert (home / "config.toml").read_text().count("[superlink.fed]") == 1


# ----- certificates: a TLS client gets in only with our CA and an address the certificate names


def tls_handshake(certs: Path, server_name: str, cafile: str | None) -> str:
    """Serve superlink.crt on loopback and connect as `server_name`; 'ok' or the client's error."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs / "superlink.crt", certs / "superlink.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cafile=cafile)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_name):
                return "ok"
    except ssl.SSLCertVerificationError as err:
        return err.verify_message
    finally:
        thread.join(timeout=10)
        listener.close()


def test_superlink_certificate_admits_only_our_ca_and_its_names(pki: Path) -> None:
    import certifi

    assert tls_handshake(pki, "superlink", str(pki / "ca.crt")) == "ok"
    assert tls_handshake(pki, "127.0.0.1", str(pki / "ca.crt")) == "ok"
    assert "mismatch" in tls_handshake(pki, "other-host", str(pki / "ca.crt"))
    assert "local issuer" in tls_handshake(pki, "superlink", certifi.where())


def test_pki_keys_are_private_and_node_keys_are_ecdsa_384(pki: Path) -> None:
    for key in ("ca.key", "superlink.key", "node-0", "node-0.secret"):
        assert (pki / key).stat().st_mode & 0o077 == 0, f"{key} is readable by others"
    public = (pki / "node-0.pub").read_text().split()
    assert public[0] == "ecdsa-sha2-nistp384"
    rerun = subprocess.run([str(DEPLOY / "pki.sh"), "ca", str(pki)], capture_output=True, text=True, check=True)
    assert "keeping existing" in rerun.stdout
    bad = subprocess.run([str(DEPLOY / "pki.sh"), "server", str(pki), "x", "superlink"], capture_output=True, text=True)
    assert bad.returncode == 2 and "bad SAN" in bad.stderr


# ----- deploy/retry-activation.sh: a SuperNode restarted while the SuperLink still holds its session


def flaky_supernode(bin_dir: Path, refusals: int, final: str = "sys.exit(0)\n") -> Path:
    """A stand-in `flower-supernode` refused like Flower refuses a held session `refusals` times (Flower's exit
    record), then running `final` (Python)."""
    return supernode_standin.write(bin_dir, f"if CALL <= {refusals}:\n" + textwrap.indent(supernode_standin.REFUSED, "    ")
                                   + final)


def retry(bin_dir: Path, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(DEPLOY / "retry-activation.sh"), *options, "--", "flower-supernode", "--x"],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_refused_activation_is_retried_with_a_line_saying_why(tmp_path: Path) -> None:
    calls = flaky_supernode(tmp_path / "bin", refusals=2)
    result = retry(tmp_path / "bin", "--retry-every", "1", "--activation-wait", "30")
    assert result.returncode == 0, result.stderr
    assert len(calls.read_text().splitlines()) == 3
    lines = [line for line in result.stderr.splitlines() if line.startswith("retry-activation.sh: ")]
    assert len(lines) == 2 and all("may still hold this node's previous session" in line for line in lines), lines
    assert "Failed to activate SuperNode." in result.stdout  # the node's own output still shows, where it wrote it
    assert all("(Flower's exit code 305)" in line for line in lines), lines


def test_a_refusal_that_outlasts_any_held_session_gives_up_with_exit_78(tmp_path: Path) -> None:
    calls = flaky_supernode(tmp_path / "bin", refusals=1000)
    start = time.monotonic()
    result = retry(tmp_path / "bin", "--retry-every", "1", "--activation-wait", "2")
    assert result.returncode == 78, result.stderr
    assert time.monotonic() - start < 20
    assert 2 <= len(calls.read_text().splitlines()) <= 5
    assert "its key is not registered (deploy/register-supernodes.sh)" in result.stderr.splitlines()[-1]


def test_other_failures_pass_through_at_once(tmp_path: Path) -> None:
    calls = flaky_supernode(tmp_path / "bin", refusals=0,
                            final="print('CERTIFICATE_VERIFY_FAILED', file=sys.stderr)\nsys.exit(1)\n")
    result = retry(tmp_path / "bin", "--retry-every", "1")
    assert result.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in result.stderr
    assert len(calls.read_text().splitlines()) == 1 and "retry-activation.sh" not in result.stderr


def test_sigterm_reaches_the_supernode(tmp_path: Path) -> None:
    flaky_supernode(tmp_path / "bin", refusals=0,
                    final=f"def stop(*_):\n    open({str(tmp_path / 'stopped')!r}, 'w').write('stopped')\n"
                          "    sys.exit(0)\nsignal.signal(signal.SIGTERM, stop)\n"
                          f"open({str(tmp_path / 'ready')!r}, 'w').close()\ntime.sleep(60)\n")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([str(DEPLOY / "retry-activation.sh"), "--", "flower-supernode"], env=env)
    # once the node has started (under deploy/supernode-waits.py it imports Flower first, as a real SuperNode does)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert (tmp_path / "stopped").read_text().strip() == "stopped"


def superlink_state_launcher():  # type: ignore[no-untyped-def]
    """deploy/superlink-state.py as a module (its name has a dash)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("superlink_state", DEPLOY / "superlink-state.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    return launcher


def test_a_busy_state_database_is_answered_with_a_retryable_503_and_other_errors_as_flower_does(tmp_path) -> None:
    """A real "database is locked" from Flower's own SQL store (another connection holds the write lock, the busy
    timeout is 0.1 s) reaches the client as 503 + Retry-After, which Flower's SuperNode retries; any other error is
    Flower's 500. Before, the busy state was a 500, on which a SuperNode gives up (issue 54)."""
    import sqlite3

    import flwr.superlink.main as superlink_main
    import flwr.supercore.sql_mixin as sql_mixin
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from flwr.supercore.error import http_error_translator
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore
    from flwr.supercore.retry import http_retry
    from sqlalchemy import text
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware

    launcher = superlink_state_launcher()
    before_pragmas, before_translator = sql_mixin.SQLITE_PRAGMAS, superlink_main.http_error_translator
    try:
        launcher.set_busy_timeout(100)
        store = SqlObjectStore(str(tmp_path / "state.db"))
        store.initialize()
        holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # as another request's long write does

        app = FastAPI(middleware=[Middleware(BaseHTTPMiddleware,
                                             dispatch=launcher.busy_state_answers_503(http_error_translator))])

        @app.post("/v1/fleet/push-object")
        def push_object() -> dict:
            with store.session() as session:
                session.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            return {}

        @app.post("/v1/fleet/pull-messages")
        def pull_messages() -> dict:
            raise ValueError("something else")

        client = TestClient(app, raise_server_exceptions=False)
        busy = client.post("/v1/fleet/push-object")
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
        assert client.post("/v1/fleet/pull-messages").status_code == 500  # Flower's own answer
        holder.execute("ROLLBACK")
        assert client.post("/v1/fleet/push-object").status_code == 200  # the lock is free: the retry succeeds
        assert 503 in http_retry._RETRYABLE_STATUS_CODES and 500 not in http_retry._RETRYABLE_STATUS_CODES
        # the launcher puts it where Flower's SuperLink builds its middleware
        launcher.answer_busy_state_with_503()
        dispatches = [m.kwargs.get("dispatch") for m in superlink_main._get_middleware()]
        assert any(d is not None and d.__qualname__.startswith("busy_state_answers_503") for d in dispatches)
    finally:
        sql_mixin.SQLITE_PRAGMAS, superlink_main.http_error_translator = before_pragmas, before_translator


def locked_state_app(tmp_path: Path, launcher, streak):  # type: ignore[no-untyped-def]
    """A FastAPI app behind the launcher's middleware, on Flower's own SQL store with a 0.1 s busy timeout: a write
    endpoint, a read endpoint, and one that raises text-only look-alikes of the busy error."""
    import sqlite3

    from fastapi import FastAPI
    from flwr.supercore.error import http_error_translator
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore
    from sqlalchemy import text
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware

    launcher.set_busy_timeout(100)
    store = SqlObjectStore(str(tmp_path / "state.db"))
    store.initialize()
    app = FastAPI(middleware=[Middleware(BaseHTTPMiddleware,
                                         dispatch=launcher.busy_state_answers_503(http_error_translator, streak))])

    @app.post("/v1/fleet/push-object")
    def push_object() -> dict:
        with store.session() as session:
            session.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            session.execute(text("INSERT INTO t VALUES (1)"))
        return {}

    @app.post("/v1/fleet/pull-object")
    def pull_object() -> dict:
        with store.session() as session:
            session.execute(text("SELECT 1"))
        return {}

    @app.post("/v1/fleet/look-alike/{kind}")
    def look_alike(kind: str) -> dict:
        if kind == "text":
            raise ValueError("database is locked")
        raise sqlite3.OperationalError("database is locked")  # made by hand: no SQLite result code

    return app


def test_a_database_locked_longer_than_the_bound_ends_in_an_operator_readable_error_within_it(tmp_path, capfd) -> None:
    """503s while the lock is young; once the database has answered busy for --busy-limit seconds with no write
    through, one error naming the database and Flower's own 500, so the nodes' retries end. A read that succeeds
    meanwhile (SQLite lets readers through) does not reset the bound; a write that succeeds does."""
    import sqlite3

    import flwr.supercore.sql_mixin as sql_mixin
    from fastapi.testclient import TestClient
    from sqlalchemy import Engine, event

    launcher = superlink_state_launcher()
    before = sql_mixin.SQLITE_PRAGMAS
    streak = launcher.BusyStreak(1.5, str(tmp_path / "state.db"))
    listener = launcher.note_writes(streak)
    try:
        client = TestClient(locked_state_app(tmp_path, launcher, streak), raise_server_exceptions=False)
        assert client.post("/v1/fleet/push-object").status_code == 200
        holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # a lock that is not released within the bound
        started = time.monotonic()
        statuses = []
        while time.monotonic() - started < 5 and 500 not in statuses:
            statuses.append(client.post("/v1/fleet/push-object").status_code)
            assert client.post("/v1/fleet/pull-object").status_code in (200, 503)
            time.sleep(0.1)
        took = time.monotonic() - started
        assert statuses[0] == 503 and statuses[-1] == 500 and set(statuses) == {503, 500}, statuses
        assert 1.5 <= took < 1.5 + 1.5, took  # the bound, plus one busy wait and the loop's own steps
        errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("superlink-state.py: ERROR")]
        assert len(errors) == 1 and f"the state database {tmp_path / 'state.db'} has been locked for" in errors[0]
        assert "longer than --busy-limit 1.5 s" in errors[0] and "answering as Flower does (HTTP 500)" in errors[0]
        assert client.post("/v1/fleet/push-object").status_code == 500  # still Flower's, no second error line
        assert "superlink-state.py: ERROR" not in capfd.readouterr().err
        holder.execute("ROLLBACK")
        assert client.post("/v1/fleet/push-object").status_code == 200  # a write through: the spell is over
        holder.execute("BEGIN EXCLUSIVE")
        assert client.post("/v1/fleet/push-object").status_code == 503  # a new spell starts with 503s again
        holder.execute("ROLLBACK")
        # only SQLite's own busy error is answered 503: look-alikes by text are Flower's 500
        assert client.post("/v1/fleet/look-alike/text").status_code == 500
        assert client.post("/v1/fleet/look-alike/hand-made").status_code == 500
    finally:
        event.remove(Engine, "after_cursor_execute", listener)
        sql_mixin.SQLITE_PRAGMAS = before


def test_the_superlink_state_launcher_refuses_a_bad_busy_limit() -> None:
    for value in ("0", "-1", "nan", "1e9"):
        done = subprocess.run([sys.executable, str(DEPLOY / "superlink-state.py"), "--busy-timeout-ms", "100",
                               "--busy-limit", value, "--", "flower-superlink", "--version"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and "--busy-limit must be" in done.stderr, (value, done.stderr)


def test_the_superlink_state_launcher_sets_the_busy_timeout_of_flowers_sqlite_connections(tmp_path: Path) -> None:
    import flwr.supercore.sql_mixin as sql_mixin
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore
    from sqlalchemy import text

    launcher = superlink_state_launcher()
    before = sql_mixin.SQLITE_PRAGMAS
    try:
        launcher.set_busy_timeout(60000)
        store = SqlObjectStore(str(tmp_path / "state.db"))
        store.initialize()
        with store.session() as session:
            assert session.execute(text("PRAGMA busy_timeout")).scalar() == 60000
            assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"  # Flower's other pragmas stay
    finally:
        sql_mixin.SQLITE_PRAGMAS = before
    # run as deploy/superlink.sh runs it: Flower's own entry point gets the arguments after `--`
    done = subprocess.run([sys.executable, str(DEPLOY / "superlink-state.py"), "--busy-timeout-ms", "60000", "--",
                           "flower-superlink", "--version"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("Flower version: "), done.stdout + done.stderr


def stalled_supernode(bin_dir: Path, first_start: str, starts: int = 1, alive: int = 8) -> Path:
    """A stand-in `flower-supernode` that, on its first `starts` starts, runs `first_start` (Python: Flower's record,
    or what a ClientApp prints) and then lives on doing nothing for `alive` seconds (as Flower does after an unretried
    HTTP error: node deactivated, process alive); started again after that, it exits 0."""
    return supernode_standin.write(bin_dir, f"if CALL <= {starts}:\n    print('INFO :      SuperNode ID: 5')\n"
                                   + textwrap.indent(first_start, "    ")
                                   + f"    print(LINE, flush=True)\n    time.sleep({alive})\n"  # alive; ends by itself
                                   + "sys.exit(0)\n")


# Flower 1.42's own console line (tests/test_supernode_watchdog.py sees it from a real SuperNode), with its colours
LEFT_OFFLINE_LINE = ("\x1b[91mERROR \x1b[0m:     Server error '500 Internal Server Error' for url "
                     "'https://127.0.0.1:9092/v1/fleet/pull-messages'")
FLOWER_LEFT_IT_OFFLINE = f"LINE = {LEFT_OFFLINE_LINE!r}\n" + supernode_standin.left_offline()
AN_APP_PRINTS_IT = f"LINE = {LEFT_OFFLINE_LINE!r}\nprint(LINE, file=sys.stderr)\n"  # no record: only output


def test_watchdog_restarts_a_supernode_that_flower_left_offline_while_its_process_lives(tmp_path: Path) -> None:
    calls = stalled_supernode(tmp_path / "bin", FLOWER_LEFT_IT_OFFLINE, alive=30)
    start = time.monotonic()
    result = retry(tmp_path / "bin", "--retry-every", "1", "--stop-grace", "2")
    took = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert len(calls.read_text().splitlines()) == 2  # stopped and started again
    # after the grace (and two starts, each importing Flower under deploy/supernode-waits.py), not after the
    # stand-in's 30 s: the watchdog stopped it
    assert 2 <= took < 20, took
    assert ("retry-activation.sh: the SuperLink answered this SuperNode with an error Flower does not retry, and "
            "Flower deactivated the node but left its process running (Flower's record: HTTP 500 for "
            "/v1/fleet/pull-messages; it would stay offline); stopped it, starting it again in 1 s (restart 1 of at "
            "most 10 in a row)") in result.stderr
    assert LEFT_OFFLINE_LINE in result.stdout


def test_a_clientapp_printing_flowers_500_line_does_not_restart_its_node(tmp_path: Path) -> None:
    """Flower passes a ClientApp's output through to the node's: a line there is not one of Flower's records."""
    calls = stalled_supernode(tmp_path / "bin", AN_APP_PRINTS_IT + "print('Failed to activate SuperNode.')\n")
    result = retry(tmp_path / "bin", "--retry-every", "1", "--stop-grace", "1")
    assert result.returncode == 0 and len(calls.read_text().splitlines()) == 1, result.stderr
    assert LEFT_OFFLINE_LINE in result.stderr and "retry-activation.sh" not in result.stderr


def test_watchdog_restarts_back_off_and_end_in_exit_75_for_the_supervisor(tmp_path: Path) -> None:
    calls = stalled_supernode(tmp_path / "bin", FLOWER_LEFT_IT_OFFLINE, starts=100)
    start = time.monotonic()
    result = retry(tmp_path / "bin", "--retry-every", "1", "--stop-grace", "0", "--max-restarts", "3",
                   "--max-backoff", "3")
    took = time.monotonic() - start
    assert result.returncode == 75, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("retry-activation.sh: ")]
    delays = [int(re.search(r"starting it again in (\d+) s", line).group(1)) for line in lines[:-1]]
    assert delays == [1, 2, 3] and len(calls.read_text().splitlines()) == 4, lines
    assert [f"restart {n} of at most 3 in a row" in line for n, line in enumerate(lines[:-1], 1)] == [True] * 3
    assert "after 3 restarts in a row" in lines[-1] and "giving up with exit 75" in lines[-1], lines[-1]
    assert 6 <= took < 20, took


WATCHDOG_RECORDS_OF_FLOWER = textwrap.dedent("""
    import importlib.util, logging, sys
    import httpx
    from flwr.supercore import log
    from flwr.supercore.exit import ExitCode, flwr_exit

    spec = importlib.util.spec_from_file_location("supernode_records", sys.argv[1])
    records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(records)
    logging.getLogger("flwr").addHandler(records.WatchdogRecords(int(sys.argv[2])))

    def http_error(url):
        request = httpx.Request("POST", url)
        return httpx.HTTPStatusError("Server error", request=request, response=httpx.Response(500, request=request))

    log(logging.ERROR, http_error("https://h:1/v1/fleet/pull-messages"))  # as flwr/supernode/fleet_http_connection
    log(logging.ERROR, "Failed to send message %s: %s", "1a2b", http_error("https://h:1/v1/fleet/push-object"))
    log(logging.INFO, http_error("https://h:1/v1/fleet/pull-messages"))
    log(logging.ERROR, http_error("https://h:1/v1/control/list-runs"))
    log(logging.ERROR, "Server error '500 Internal Server Error' for url 'https://h:1/v1/fleet/pull-messages'")
    log(logging.ERROR, "Exit Code: 305 (but no refusal)")
    flwr_exit(ExitCode.SUPERNODE_CONNECTION_ERROR,
              "Failed to initialize the connection to the SuperLink.\\n[code: 3] Failed to activate SuperNode.")
""")


def test_the_watchdogs_records_are_flowers_own_log_records() -> None:
    """deploy/supernode-records.py's handler on Flower's logger, fed by Flower's own functions as the SuperNode
    calls them: the HTTP error that ended the connection and a refused activation's exit make a record; a
    handled error, a lower level, another request and plain text do not."""
    read_end, write_end = os.pipe()
    done = subprocess.run([sys.executable, "-c", WATCHDOG_RECORDS_OF_FLOWER, str(DEPLOY / "supernode-records.py"),
                           str(write_end)], pass_fds=[write_end], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"})
    os.close(write_end)
    assert done.returncode == 1 and "Failed to activate SuperNode" in done.stderr, done.stderr
    with os.fdopen(read_end) as lines:
        assert lines.read().splitlines() == ["deactivated 500 /v1/fleet/pull-messages", "refused 305"]


def test_a_process_the_node_starts_cannot_write_the_watchdogs_records(tmp_path: Path) -> None:
    """A ClientApp is a child of the node: it does not hold the records' descriptor, even when asked to keep fds."""
    forged = "import os; os.write(3, b'deactivated 500 /v1/fleet/pull-messages' + bytes([10]))"
    calls = stalled_supernode(tmp_path / "bin", "LINE = 'a task ran'\nimport subprocess\n"
                              f"task = subprocess.run([sys.executable, '-c', {forged!r}], close_fds=False, "
                              "capture_output=True, text=True)\n"
                              "print('task:', task.returncode, task.stderr.splitlines()[-1:])\n")
    result = retry(tmp_path / "bin", "--retry-every", "1", "--stop-grace", "0")
    assert result.returncode == 0 and len(calls.read_text().splitlines()) == 1, result.stderr
    assert "task: 1 ['OSError: [Errno 9] Bad file descriptor']" in result.stdout, result.stdout
    assert "retry-activation.sh" not in result.stderr


def test_a_supervisor_stopping_the_script_within_the_watchdogs_grace_is_not_answered_by_a_restart(
        tmp_path: Path) -> None:
    calls = stalled_supernode(tmp_path / "bin", FLOWER_LEFT_IT_OFFLINE)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([str(DEPLOY / "retry-activation.sh"), "--stop-grace", "5", "--", "flower-supernode"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not calls.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # the line is out; the grace runs
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=20)
    assert len(calls.read_text().splitlines()) == 1, stderr  # not started again
    assert "starting it again" not in stderr and LEFT_OFFLINE_LINE in stdout


def test_watchdog_leaves_a_supernode_alone_after_an_error_flower_handles(tmp_path: Path) -> None:
    # a failed push is logged and the node goes on pulling: nothing to restart
    calls = stalled_supernode(tmp_path / "bin", "LINE = 'a handled error'\n"
                                                "FLOWER.error('Failed to send message %s: %s', '1a2b', \"Server error "
                                                "'500 Internal Server Error' for url "
                                                "'https://127.0.0.1:9092/v1/fleet/push-object'\")\n")
    result = retry(tmp_path / "bin", "--retry-every", "1")
    assert result.returncode == 0 and len(calls.read_text().splitlines()) == 1
    assert "retry-activation.sh" not in result.stderr


def test_supernode_script_runs_flower_under_the_activation_retry(tmp_path: Path) -> None:
    calls = flaky_supernode(tmp_path / "bin", refusals=1)
    result = run_script("supernode.sh", ["--superlink", "127.0.0.1:8000", "--insecure", "--partition-id", "0",
                                         "--num-partitions", "1", "--activation-wait", "30", "--",
                                         "--max-retries", "1"], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    assert len(calls.read_text().splitlines()) == 2 and "retrying in 2 s" in result.stderr


def flaky_flwr(bin_dir: Path, unavailable: int) -> Path:
    """A stand-in `flwr` whose first `unavailable` calls answer as Flower's CLI does before the SuperLink serves."""
    bin_dir.mkdir(exist_ok=True)
    calls = bin_dir / "flwr.calls"
    script = bin_dir / "flwr"
    script.write_text(
        "#!/bin/bash\n"
        f"echo \"$*\" >> '{calls}'\n"
        f"if [ $(wc -l < '{calls}') -le {unavailable} ]; then\n"
        "  echo 'Connection to the SuperLink is unavailable. Please check your network'; exit 1\n"
        "fi\n"
        "echo registered\n"
    )
    script.chmod(0o755)
    return calls


def test_registering_waits_for_a_superlink_that_does_not_answer_yet(tmp_path: Path) -> None:
    """The walk-through starts the SuperLink and registers at once; on a loaded host its port opens before it
    serves (a CI run lost the 45 MB deployment test so): the script tries again, saying so once."""
    (tmp_path / "a.pub").write_text("key")
    calls = flaky_flwr(tmp_path / "bin", unavailable=2)
    result = run_script("register-supernodes.sh", ["fed", str(tmp_path / "a.pub")], tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    assert len(calls.read_text().splitlines()) == 3
    assert result.stderr.count("does not answer yet") == 1 and "registered a" in result.stdout


def test_registering_gives_up_naming_the_connection_when_the_superlink_never_answers(tmp_path: Path) -> None:
    (tmp_path / "a.pub").write_text("key")
    flaky_flwr(tmp_path / "bin", unavailable=99)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "REGISTER_WAIT_S": "3"}
    result = subprocess.run([str(DEPLOY / "register-supernodes.sh"), "fed", str(tmp_path / "a.pub")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"register-supernodes.sh: registering {tmp_path / 'a.pub'} with 'fed' failed"


def test_one_switch_turns_the_adaptive_waits_off_in_every_compose_process() -> None:
    """FEDSYNTH_ADAPTIVE_WAITS reaches the SuperNodes (their launcher's waits) and the ServerApp's process (its
    retry of a reply's objects, server_app/reply_pulls.py): `FEDSYNTH_ADAPTIVE_WAITS=0 docker compose up` runs
    Flower's own waits everywhere, not only on the nodes."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    switched = {name for name, spec in services.items()
                if (spec.get("environment") or {}).get("FEDSYNTH_ADAPTIVE_WAITS") == "${FEDSYNTH_ADAPTIVE_WAITS:-1}"}
    assert "serverapp" in switched and {name for name in services if name.startswith("supernode-")} <= switched
