"""Warm ClientApp processes (fedsynth/warm_clientapp): every task ends as it would without the launcher.

The launcher is exercised as a SuperNode uses it: `deploy/warm-clientapp/flwr-clientapp` first on `PATH`,
started per task. The task is a fake `flwr-clientapp` (a small module, `fake_task`, whose behaviour the
argv picks), run both cold (the real command) and warm (through the shim) and compared. The warm server
preloads a marker module instead of torch and Flower, so these tests take seconds; the real entry point
runs in tests/test_warm_clientapp_deployment.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIM_DIR = ROOT / "deploy" / "warm-clientapp"
SERVER_PY = ROOT / "fedsynth" / "warm_clientapp" / "server.py"
DEADLINE_S = 2.0  # the warm server's request deadline in these tests (FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S)
sys.path.insert(0, str(ROOT))

FAKE_TASK = textwrap.dedent('''
    import os, signal, sys, time

    def main():
        print(f"task pid={os.getpid()} warm={'fake_preload' in sys.modules} cwd={os.getcwd()} "
              f"x={os.environ.get('FAKE_X')} argv={sys.argv[1:]}", flush=True)
        mode, *rest = sys.argv[1:]
        if mode == "raise":
            raise RuntimeError("boom")
        if mode == "exit":
            sys.exit(int(rest[0]))
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "app":
            sys.path.insert(0, rest[0])
            import fake_app
            print(f"app version={fake_app.VERSION}", flush=True)
        if mode == "sleep":
            time.sleep(float(rest[0]))
            print("slept", flush=True)
        if mode == "touch":
            open(rest[0], "w").close()
        if mode == "syspath":
            import json
            print("path=" + json.dumps(sys.path), flush=True)
        if mode == "wait":
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
            print("ready", flush=True)
            time.sleep(60)
        return 0
''')


class Host:
    """A fake SuperNode host: the fake real command, the shim first on PATH, an owner process."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "lib").mkdir()
        (tmp / "lib" / "fake_task.py").write_text(FAKE_TASK)
        (tmp / "lib" / "fake_preload.py").write_text("LOADED = True\n")
        (tmp / "bin").mkdir()
        self.real = tmp / "bin" / "flwr-clientapp"
        self.real.write_text(f"#!{sys.executable}\nimport sys\nfrom fake_task import main\nsys.exit(main())\n")
        self.real.chmod(0o755)
        self.sockets = Path(tempfile.mkdtemp(prefix="wc-"))  # short: unix socket paths are limited
        self.owner = subprocess.Popen(["sleep", "300"])
        self.log = open(tmp / "server.log", "w+")  # noqa: SIM115 - the first cold task's stderr (and the server's)
        self.env = {
            **os.environ, "PATH": f"{SHIM_DIR}{os.pathsep}{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(tmp / "lib"), "FEDSYNTH_WARM_CLIENTAPP_DIR": str(self.sockets),
            "FEDSYNTH_WARM_CLIENTAPP_OWNER_PID": str(self.owner.pid),
            "FEDSYNTH_WARM_CLIENTAPP_PRELOAD": "fake_preload", "FEDSYNTH_WARM_CLIENTAPP_ENTRY": "fake_task:main",
            "FAKE_X": "seven", "FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S": str(DEADLINE_S),
        }

    def cold(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.real), *args], env=self.env, cwd=self.tmp, capture_output=True, text=True,
                              timeout=60)

    def shim(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr-clientapp", *args], env=env or self.env, cwd=self.tmp, capture_output=True,
                              text=True, timeout=60)

    def socket_files(self) -> list[Path]:
        return sorted(self.sockets.glob("*.sock"))

    def start_warm(self) -> None:
        """The first task runs cold and starts the server (its stderr: our log); wait until it listens."""
        first = subprocess.run(["flwr-clientapp", "ok"], env=self.env, cwd=self.tmp, stdout=subprocess.PIPE,
                               stderr=self.log, text=True, timeout=60)
        assert first.returncode == 0 and "warm=False" in first.stdout
        self.wait_for(lambda: self.socket_files())

    def server_pids(self) -> list[int]:
        self.log.seek(0)
        return [int(line.split("warm server ")[1].split()[0]) for line in self.log.read().splitlines()
                if " ready in " in line]

    @staticmethod
    def wait_for(condition, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def close(self) -> None:
        self.owner.kill()
        self.owner.wait()
        for pid in self.server_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def host(tmp_path):
    fake_host = Host(tmp_path)
    yield fake_host
    fake_host.close()


def task_lines(output: str) -> list[str]:
    """The task's own output: the shim's log lines and the pid (differs per process) left out."""
    return [" ".join(w for w in line.split() if not w.startswith("pid=")) for line in output.splitlines()
            if not line.startswith("fedsynth warm-clientapp:")]


def test_the_first_task_runs_cold_and_starts_the_server_the_next_run_warm(host):
    host.start_warm()
    host.log.seek(0)
    assert "no warm server" in host.log.read()  # the one log line of the fallback
    assert len(host.server_pids()) == 1
    second = host.shim("ok")
    assert second.returncode == 0, second.stderr
    assert "warm=True" in second.stdout and second.stderr == ""


@pytest.mark.parametrize("args, status", [(("ok",), 0), (("raise",), 1), (("exit", "3"), 3),
                                          (("sigkill",), -signal.SIGKILL)])
def test_a_warm_task_ends_with_the_cold_tasks_status_and_output(host, args, status):
    host.start_warm()
    cold, warm = host.cold(*args), host.shim(*args)
    assert cold.returncode == warm.returncode == status
    assert task_lines(warm.stdout) == [line.replace("warm=False", "warm=True") for line in task_lines(cold.stdout)]
    assert "warm=True" in warm.stdout  # argv, working folder and environment reached the task
    if args == ("raise",):
        assert "RuntimeError: boom" in cold.stderr and "RuntimeError: boom" in warm.stderr


def test_the_next_task_after_a_crash_is_unaffected(host):
    host.start_warm()
    assert host.shim("sigkill").returncode == -signal.SIGKILL
    assert host.shim("raise").returncode == 1
    after = host.shim("ok")
    assert after.returncode == 0 and "warm=True" in after.stdout


def test_a_signal_to_the_shim_reaches_the_task(host):
    host.start_warm()
    for command in ([str(host.real)], ["flwr-clientapp"]):
        proc = subprocess.Popen([*command, "wait"], env=host.env, cwd=host.tmp, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("task") and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 3  # the task's own SIGTERM handler ran, once


def test_a_killed_shim_takes_its_task_with_it(host):
    host.start_warm()
    proc = subprocess.Popen(["flwr-clientapp", "wait"], env=host.env, cwd=host.tmp, stdout=subprocess.PIPE, text=True)
    task_pid = int(proc.stdout.readline().split("pid=")[1].split()[0])
    assert proc.stdout.readline() == "ready\n" and task_pid != proc.pid
    proc.kill()
    proc.wait()
    host.wait_for(lambda: not alive(task_pid), timeout=10)
    after = host.shim("ok")  # the server reaped the killed task and serves the next one
    assert after.returncode == 0 and "warm=True" in after.stdout, after.stderr


def test_a_killed_server_falls_back_to_a_cold_task_and_is_started_again(host):
    host.start_warm()
    (first_server,) = host.server_pids()
    os.kill(first_server, signal.SIGKILL)
    host.wait_for(lambda: not alive(first_server))
    fallback = subprocess.run(["flwr-clientapp", "exit", "4"], env=host.env, cwd=host.tmp, stdout=subprocess.PIPE,
                              stderr=host.log, text=True, timeout=60)
    assert fallback.returncode == 4 and "warm=False" in fallback.stdout
    host.wait_for(lambda: len(host.server_pids()) == 2 and alive(host.server_pids()[1]))
    host.wait_for(lambda: host.shim("ok").stdout.count("warm=True") == 1, timeout=30)


def test_a_changed_app_and_another_app_are_imported_fresh(host, tmp_path):
    host.start_warm()
    for name, version in (("app-a", "1"), ("app-a", "2"), ("app-b", "3")):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "fake_app.py").write_text(f"VERSION = {version}\n")
        warm = host.shim("app", str(tmp_path / name))
        assert warm.returncode == 0 and "warm=True" in warm.stdout
        assert f"app version={version}" in warm.stdout


def test_a_supernode_restart_ends_the_server_and_the_new_owner_gets_a_new_one(host):
    host.start_warm()
    (first_server,) = host.server_pids()
    host.owner.kill()  # the SuperExec that owned the server is gone (SuperNode stopped)
    host.owner.wait()
    host.wait_for(lambda: not alive(first_server) and not host.socket_files())
    host.owner = subprocess.Popen(["sleep", "300"])  # the restarted SuperNode's SuperExec
    host.env["FEDSYNTH_WARM_CLIENTAPP_OWNER_PID"] = str(host.owner.pid)
    host.start_warm()
    assert len(host.server_pids()) == 2
    assert "warm=True" in host.shim("ok").stdout


def start_superexec(host: Host, **env: str) -> subprocess.Popen:
    """`flower-superexec` through the launcher (first on PATH), as a SuperNode starts it; the real one is a sleep.

    The launcher execs the real one, so the process keeps its pid: the owner that its tasks' shims name."""
    real = host.tmp / "bin" / "flower-superexec"
    real.write_text("#!/bin/sh\nexec sleep 300\n")
    real.chmod(0o755)
    environ = {k: v for k, v in host.env.items() if k != "FEDSYNTH_WARM_CLIENTAPP_OWNER_PID"}
    superexec = subprocess.Popen(["flower-superexec", "--runtime-api-address", "127.0.0.1:9094"],
                                 env={**environ, **env}, cwd=host.tmp, stderr=host.log)
    host.wait_for(lambda: is_the_real_superexec(superexec.pid))  # the launcher has done its part
    return superexec


def is_the_real_superexec(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline") as cmdline:
        return cmdline.read().split("\0")[:2] == ["sleep", "300"]


def test_the_superexec_starts_the_server_so_the_first_task_runs_warm(host):
    # a slow import: the first task comes while the server is still importing, and waits for it
    (host.tmp / "lib" / "fake_preload.py").write_text("import time\ntime.sleep(2)\nLOADED = True\n")
    superexec = start_superexec(host)
    try:
        host.env["FEDSYNTH_WARM_CLIENTAPP_OWNER_PID"] = str(superexec.pid)  # the tasks' parent, in a SuperNode
        first = host.shim("ok")
        assert first.returncode == 0 and "warm=True" in first.stdout and first.stderr == "", first.stderr
        assert len(host.server_pids()) == 1
        host.log.seek(0)
        assert "no warm server" not in host.log.read()
    finally:
        superexec.kill()
        superexec.wait()
    (server,) = host.server_pids()
    host.wait_for(lambda: not alive(server) and not host.socket_files())  # it ends with its SuperExec


def test_a_task_does_not_wait_for_a_server_that_died_while_starting(host):
    (host.tmp / "lib" / "fake_preload.py").write_text("import time\ntime.sleep(1)\nraise ImportError('no')\n")
    superexec = start_superexec(host)
    try:
        host.env["FEDSYNTH_WARM_CLIENTAPP_OWNER_PID"] = str(superexec.pid)
        start = time.monotonic()
        first = host.shim("exit", "6")
        assert first.returncode == 6 and "warm=False" in first.stdout and "no warm server" in first.stderr
        assert time.monotonic() - start < 40, "waited for a server that had died"
    finally:
        superexec.kill()
        superexec.wait()


def test_off_switch_runs_the_real_command_and_starts_no_server(host):
    superexec = start_superexec(host, FEDSYNTH_WARM_CLIENTAPP="0")  # it becomes the real one ...
    time.sleep(0.5)
    assert host.server_pids() == [] and not list(host.sockets.glob("*.lock"))  # ... and starts no server
    superexec.kill()
    superexec.wait()
    off = host.shim("exit", "5", env={**host.env, "FEDSYNTH_WARM_CLIENTAPP": "0"})
    assert off.returncode == 5 and "warm=False" in off.stdout and off.stderr == ""
    time.sleep(0.5)
    assert host.socket_files() == []


def test_the_default_preload_initialises_no_cuda_and_imports_no_app_module():
    code = ("import sys; sys.path.insert(0, 'fedsynth/warm_clientapp'); import server; "
            "server.preload(server.PRELOAD.split(',')); import torch; "
            "print(torch.cuda.is_initialized(), sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('common', 'client_app', 'server_app', 'fedsynth')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["False", "[]"], result.stderr


def fake_supernode(bin_dir: Path) -> Path:
    """A `flower-supernode` on PATH that writes the PATH it was started with and exits 0."""
    bin_dir.mkdir()
    out = bin_dir / "path.txt"
    (bin_dir / "flower-supernode").write_text(f"#!/bin/sh\nprintf '%s' \"$PATH\" > '{out}'\n")
    (bin_dir / "flower-supernode").chmod(0o755)
    return out


@pytest.mark.parametrize("switch, warm", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_supernode_script_puts_the_launcher_first_on_path_unless_switched_off(tmp_path, switch, warm):
    out = fake_supernode(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != "FEDSYNTH_WARM_CLIENTAPP"}
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    if switch is not None:
        env["FEDSYNTH_WARM_CLIENTAPP"] = switch
    result = subprocess.run([str(ROOT / "deploy" / "supernode.sh"), "--superlink", "127.0.0.1:8000", "--insecure",
                             "--partition-id", "0", "--num-partitions", "1"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    first = out.read_text().split(os.pathsep)[0]
    assert (Path(first).resolve() == SHIM_DIR.resolve()) is warm
    assert ("warm ClientApp processes on" in result.stdout) is warm


def test_compose_clientapp_executors_run_warm_by_default_with_a_switch(tmp_path):
    import yaml

    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "ENV PATH=/app/deploy/warm-clientapp:$PATH" in dockerfile  # the image's flwr-clientapp is the shim
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    executors = [s for name, s in services.items() if name.startswith("clientapp-")]
    assert len(executors) == 2
    for service in executors:
        assert service["command"][0] == "flower-superexec"
        assert service["environment"]["FEDSYNTH_WARM_CLIENTAPP"] == "${FEDSYNTH_WARM_CLIENTAPP:-1}"
    script = (ROOT / "deploy" / "compose-nodes.sh").read_text()
    assert script.count("FEDSYNTH_WARM_CLIENTAPP: \\${FEDSYNTH_WARM_CLIENTAPP:-1}") == 1


# ----- a hostile neighbour: each case against the real server, with a normal task running beside it

def normal_task(host: Host, seconds: float = 1.0, running: bool = True) -> tuple[subprocess.Popen, float, str]:
    """A warm task that sleeps `seconds` and exits 0, through the shim; with `running`, returned once it runs."""
    started = time.monotonic()
    proc = subprocess.Popen(["flwr-clientapp", "sleep", str(seconds)], env=host.env, cwd=host.tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, started, proc.stdout.readline() if running else ""


def finishes_normally(task: tuple[subprocess.Popen, float, str], seconds: float = 1.0) -> None:
    """The normal task ended as it would alone: warm, status 0, its output, and not held up by its neighbour."""
    proc, started, first = task
    stdout, stderr = proc.communicate(timeout=60)
    stdout = first + stdout
    took = time.monotonic() - started
    assert proc.returncode == 0 and "warm=True" in stdout and "slept" in stdout and stderr == "", (stdout, stderr)
    # the old server, reading one request at a time, held it 10 s (its per-recv timeout) or until the neighbour left;
    # the slack is for a loaded host
    assert took < seconds + 2 * DEADLINE_S, f"the normal task took {took:.1f} s"


def raw_connection(host: Host) -> socket.socket:
    (path,) = host.socket_files()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def send_header(sock: socket.socket, size: int) -> None:
    """A request's start as the shim sends it: the 4-byte length with three fds alongside."""
    devnull = os.open(os.devnull, os.O_RDWR)
    socket.send_fds(sock, [struct.pack("!I", size)], [devnull, devnull, devnull])
    os.close(devnull)


def answer(sock: socket.socket, timeout: float = DEADLINE_S + 10) -> str:
    """What the server says before it closes the connection."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        # a peer still sending (a trickler) when the server closed: the answer arrived before the reset
        if not data:
            raise
    sock.close()
    return data.decode()


def still_serves(host: Host) -> None:
    after = host.shim("ok")
    assert after.returncode == 0 and "warm=True" in after.stdout, after.stderr
    assert len(host.server_pids()) == 1 and alive(host.server_pids()[0])


def test_json_nested_past_the_recursion_limit_ends_that_connection_only(host):
    host.start_warm()
    task = normal_task(host)
    sock = raw_connection(host)
    payload = b"[" * 100_000 + b"]" * 100_000
    send_header(sock, len(payload))
    sock.sendall(payload)
    assert answer(sock).startswith("error request JSON is nested deeper than Python's recursion limit")
    finishes_normally(task)
    still_serves(host)


def test_an_oversized_length_is_refused_before_anything_is_read(host):
    host.start_warm()
    task = normal_task(host)
    for size in (40_000_000, 2**32 - 1):  # 40 MB took the old server 29 s to read; 4 GiB is the field's most
        sock = raw_connection(host)
        send_header(sock, size)
        started = time.monotonic()
        assert answer(sock) == f"error request of {size} bytes is over the cap of {4 * 1024 * 1024} bytes\n"
        assert time.monotonic() - started < 1.5
    finishes_normally(task)
    still_serves(host)


def test_a_trickling_client_holds_up_nobody_and_is_cut_at_the_request_deadline(host):
    host.start_warm()
    sock = raw_connection(host)
    send_header(sock, 1000)

    def trickle() -> None:
        try:
            for _ in range(40):
                sock.send(b" ")
                time.sleep(0.25)
        except OSError:
            pass  # the server closed it

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    started = time.monotonic()
    finishes_normally(normal_task(host, 0.2, running=False), 0.2)  # the old server read one request at a time: this waited
    reply = answer(sock)
    assert reply.startswith("error the request not complete by the request deadline"), reply
    assert time.monotonic() - started < DEADLINE_S + 2
    still_serves(host)


def test_a_client_that_sends_nothing_holds_up_nobody(host):
    host.start_warm()
    silent = raw_connection(host)
    started = time.monotonic()
    finishes_normally(normal_task(host, 0.2, running=False), 0.2)
    assert answer(silent) == f"error no request within the request deadline ({DEADLINE_S:g} s)\n"
    assert DEADLINE_S - 0.5 < time.monotonic() - started < DEADLINE_S + 2
    still_serves(host)


MALFORMED = [
    (b'{"argv": "x", "env": {}, "cwd": "/"}', "argv is not a non-empty list of strings"),
    (b'{"argv": ["a"], "env": {"A": 1}, "cwd": "/"}', "env is not an object of strings"),
    (b'[1, 2]', "not an object of argv, env and cwd"),
    (b'\xff\xfe', "request is not JSON"),
]


def test_a_malformed_request_is_refused_naming_what_is_wrong(host):
    host.start_warm()
    task = normal_task(host)
    for payload, reason in MALFORMED:
        sock = raw_connection(host)
        send_header(sock, len(payload))
        sock.sendall(payload)
        assert reason in answer(sock), payload
    finishes_normally(task)
    still_serves(host)


def as_user(uid: int, action) -> int:
    """Run `action` in a forked child with the user id `uid`; the child's exit status (0: it returned)."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            action()
            status = 0
        except BaseException:  # noqa: BLE001 - shown in the test's output
            traceback.print_exc()
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to be made")
NOBODY = 65534


@needs_root
def test_another_users_connection_is_refused_by_the_server(host):
    host.start_warm()
    task = normal_task(host)
    (path,) = host.socket_files()
    os.chmod(host.sockets, 0o711)  # as if the folder were open to others: the server's own check must hold
    os.chmod(path, 0o666)
    read_end, write_end = os.pipe()
    ran = host.tmp / "intruder-task-ran"

    def intrude() -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        payload = json.dumps({"argv": ["x", "touch", str(ran)], "env": {}, "cwd": "/"}).encode()
        try:
            send_header(sock, len(payload))
            sock.sendall(payload)
            reply = answer(sock)
        except (BrokenPipeError, ConnectionResetError):  # refused before its request was read: closed unread
            reply = "reset"
        os.write(write_end, reply.encode())

    try:
        assert as_user(NOBODY, intrude) == 0
    finally:
        os.chmod(host.sockets, 0o700)
        os.chmod(path, 0o600)
    os.close(write_end)
    with os.fdopen(read_end) as reply:
        assert reply.read() in ("reset", f"error runs as uid {NOBODY}, not as this SuperNode's uid {os.getuid()}\n")
    assert not ran.exists()
    host.log.seek(0)
    assert f"runs as uid {NOBODY}" in host.log.read()
    finishes_normally(task)
    still_serves(host)


def impostor(path: Path, uid: int | None = None) -> tuple[threading.Thread, list[bytes]]:
    """A listener that takes `path`'s place (bound beside it, renamed over it) and records what it is sent."""
    temporary = path.with_name("impostor")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(temporary))
    if uid is not None:  # the peer credentials are the listening process's: listen as that user
        pid = os.fork()
        if pid == 0:
            os.setuid(uid)
            listener.listen(1)
            listener.settimeout(30)
            try:
                conn, _ = listener.accept()
                conn.settimeout(5)
                conn.recv(4096)
            finally:
                os._exit(0)
        time.sleep(0.3)  # it listens
    else:
        listener.listen(1)
    os.rename(temporary, path)
    received: list[bytes] = []

    def serve() -> None:
        if uid is not None:
            return
        listener.settimeout(30)
        conn, _ = listener.accept()
        conn.settimeout(5)
        data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
        received.append(data)
        received.extend(str(fd).encode() for fd in fds)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, received


@pytest.mark.parametrize("other_user", [False, pytest.param(True, marks=needs_root)])
def test_a_task_is_never_handed_to_an_impostor_socket(host, other_user):
    host.start_warm()
    task = normal_task(host)
    (path,) = host.socket_files()
    thread, received = impostor(path, NOBODY if other_user else None)
    cold = host.shim("exit", "4")
    assert cold.returncode == 4 and "warm=False" in cold.stdout  # the task ran, cold, with its own status
    reason = f"runs as uid {NOBODY}" if other_user else "is not the warm server that holds its lock"
    assert reason in cold.stderr and f"{path}" in cold.stderr and "running" in cold.stderr, cold.stderr
    thread.join(10)
    assert received in ([], [b""])  # no argv, no environment, no fds
    finishes_normally(task)


def test_a_symlinked_socket_folder_is_refused_and_the_task_runs_cold(host, tmp_path):
    host.start_warm()
    task = normal_task(host)
    target = Path(tempfile.mkdtemp(prefix="wt-"))
    link = Path(tempfile.mkdtemp(prefix="wl-")) / "s"
    link.symlink_to(target)
    env = {**host.env, "FEDSYNTH_WARM_CLIENTAPP_DIR": str(link)}
    cold = host.shim("exit", "3", env=env)
    assert cold.returncode == 3 and "warm=False" in cold.stdout
    assert f"the warm ClientApp folder {link} is a symbolic link" in cold.stderr, cold.stderr
    time.sleep(0.5)
    assert list(target.iterdir()) == []  # no server was started there
    finishes_normally(task)


def direct_server(host: Host, socket_path: str, owner: int | None = None) -> subprocess.CompletedProcess:
    """server.py started as the shim starts it, preloading a module that leaves a marker when imported."""
    (host.tmp / "lib" / "marker_preload.py").write_text(
        f"open({str(host.tmp / 'imported')!r}, 'w').close()\n")
    env = {**host.env, "FEDSYNTH_WARM_CLIENTAPP_PRELOAD": "marker_preload"}
    return subprocess.run([sys.executable, str(SERVER_PY), "--socket", socket_path, "--owner-pid",
                           str(owner or host.owner.pid), "--real", str(host.real)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_socket_path_too_long_for_unix_sockets_is_refused_at_start_naming_the_folder(host):
    host.start_warm()
    task = normal_task(host)
    folder = Path(tempfile.mkdtemp(prefix="wlong-")) / ("d" * 90)
    folder.mkdir(mode=0o700)
    cold = host.shim("exit", "5", env={**host.env, "FEDSYNTH_WARM_CLIENTAPP_DIR": str(folder)})
    assert cold.returncode == 5 and "warm=False" in cold.stdout
    assert f"the warm ClientApp folder {folder} is too long for a unix socket" in cold.stderr, cold.stderr
    assert list(folder.iterdir()) == []
    started = direct_server(host, str(folder / "0123456789abcdef.sock"))
    assert started.returncode == 2 and f"{folder}" in started.stderr and "too long" in started.stderr
    assert "Traceback" not in started.stderr
    assert not (host.tmp / "imported").exists()  # refused before importing anything
    finishes_normally(task)


def test_the_server_refuses_a_symlinked_folder_before_importing_anything(host):
    host.start_warm()
    task = normal_task(host)
    target = Path(tempfile.mkdtemp(prefix="wt-"))
    link = Path(tempfile.mkdtemp(prefix="wl-")) / "s"
    link.symlink_to(target)
    started = direct_server(host, str(link / "0123456789abcdef.sock"))
    assert started.returncode == 2 and f"{link} is a symbolic link" in started.stderr, started.stderr
    assert not (host.tmp / "imported").exists() and list(target.iterdir()) == []
    finishes_normally(task)


def test_a_server_whose_owner_is_gone_at_start_ends_without_a_traceback(host):
    host.start_warm()
    task = normal_task(host)
    gone = subprocess.Popen(["true"])
    gone.wait()
    folder = Path(tempfile.mkdtemp(prefix="wg-"))
    started = direct_server(host, str(folder / "0123456789abcdef.sock"), owner=gone.pid)
    assert started.returncode == 0 and started.stderr == "" and started.stdout == ""
    assert not (host.tmp / "imported").exists() and not list(folder.glob("*.sock"))
    finishes_normally(task)


def test_a_flood_of_silent_connections_is_cut_off_and_tasks_still_run(host):
    host.start_warm()
    task = normal_task(host)
    flood = [raw_connection(host) for _ in range(64)]  # each read on its own thread until the deadline
    time.sleep(0.3)
    extra = raw_connection(host)
    assert answer(extra, timeout=5) == ""  # refused at once: closed
    during = host.shim("exit", "7")  # refused too while the flood lasts: it runs cold, with its own status
    assert during.returncode == 7 and "running" in during.stderr, during.stderr
    host.log.seek(0)
    assert "refused a connection: 64 connections are sending their requests already" in host.log.read()
    for sock in flood:
        sock.close()
    finishes_normally(task)
    host.wait_for(lambda: host.shim("ok").stdout.count("warm=True") == 1, timeout=DEADLINE_S + 10)


def test_a_warm_tasks_sys_path_is_a_cold_tasks(host, tmp_path):
    host.start_warm()  # the server's own PYTHONPATH: lib
    (tmp_path / "extra").mkdir()
    env = {**host.env, "PYTHONPATH": os.pathsep.join([str(tmp_path / "extra"), "", str(host.tmp / "lib"),
                                                      "relative-entry"])}
    paths = []
    for run in (lambda: subprocess.run([str(host.real), "syspath"], env=env, cwd=host.tmp, capture_output=True,
                                       text=True, timeout=60),
                lambda: host.shim("syspath", env=env)):
        result = run()
        assert result.returncode == 0, result.stderr
        paths.append(json.loads(result.stdout.split("path=", 1)[1].splitlines()[0]))
    cold, warm = paths
    assert str(tmp_path / "extra") in cold and warm == cold, "\n".join(map(str, (cold, warm)))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_client_that_sends_more_after_its_request_costs_the_server_nothing(host):
    host.start_warm()
    (server,) = host.server_pids()
    task = normal_task(host)
    sock = raw_connection(host)
    payload = json.dumps({"argv": [str(host.real), "sleep", "1.5"], "env": host.env, "cwd": str(host.tmp)}).encode()
    send_header(sock, len(payload))
    sock.sendall(payload + b"junk" * 1000)
    before = cpu_seconds(server)
    for _ in range(10):
        sock.sendall(b"more junk")
        time.sleep(0.1)
    assert cpu_seconds(server) - before < 0.5  # read and dropped, not a loop woken for ever by unread bytes
    reply = answer(sock)
    assert reply.startswith("pid ") and reply.endswith("exit 0\n"), reply
    finishes_normally(task)
