"""The `flwr-clientapp` shim: hand one ClientApp task to the warm server, or run it cold if there is none.

Run by `deploy/warm-clientapp/flwr-clientapp`, which sits first on the SuperNode's `PATH`. Stdlib only (it is
a process per task too, and must start in milliseconds). `deploy/warm-clientapp/flower-superexec` runs
`superexec_main`: the SuperNode starts its SuperExec by that name, so the warm server starts with the node,
not with its first task, and the first round's tasks are warm too. A task that comes while the server is
still importing waits for it (`STARTING_WAIT_S`) rather than import the same modules beside it. Environment:

- `FEDSYNTH_WARM_CLIENTAPP=0` (or false/no/off): run the real `flwr-clientapp` directly, no warm server.
- `FEDSYNTH_WARM_CLIENTAPP_DIR`: where the sockets live (default `$TMPDIR/fedsynth-warm-clientapp-<uid>`,
  created with mode 0700; refused if another user owns it or others may enter it).
- `FEDSYNTH_WARM_CLIENTAPP_OWNER_PID`: whose life bounds the warm server (default: this shim's parent,
  the SuperExec). Tests set it; deployments leave it alone.
- `FEDSYNTH_REAL_FLWR_CLIENTAPP`: the real command (default: the next `flwr-clientapp` on `PATH`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import time

LOG_PREFIX = "fedsynth warm-clientapp:"
COMMAND = "flwr-clientapp"
SUPEREXEC = "flower-superexec"
# How long a task waits for a warm server that holds its lock but does not listen yet (still importing torch
# and Flower: 2-3 s on an idle host, 19 s measured on a loaded 2-core one). Past it, or as soon as the starting
# server dies (its lock is released), the task runs cold.
STARTING_WAIT_S = 60.0
# How long the SuperExec launcher waits for the server it started to take its lock (an interpreter's start).
LOCK_WAIT_S = 10.0
SERVER_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")
# The signals a shim passes on to its task (the ones a SuperNode's process group or an operator sends).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
OFF_VALUES = ("0", "false", "no", "off")


def log(message: str) -> None:
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def enabled(environ: dict[str, str]) -> bool:
    """False when `FEDSYNTH_WARM_CLIENTAPP` says off."""
    return environ.get("FEDSYNTH_WARM_CLIENTAPP", "1").strip().lower() not in OFF_VALUES


def find_real_command(shim_dir: str, environ: dict[str, str], command: str = COMMAND) -> str | None:
    """The `command` that Flower would have run: the first on `PATH` that is not in `shim_dir`."""
    if command == COMMAND and environ.get("FEDSYNTH_REAL_FLWR_CLIENTAPP"):
        return environ["FEDSYNTH_REAL_FLWR_CLIENTAPP"]
    own = os.path.realpath(shim_dir)
    for entry in environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(entry or ".", command)
        if os.path.realpath(entry or ".") != own and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def interpreter_of(script: str) -> list[str]:
    """The command line that runs Python for `script`'s environment: its shebang (pip's two forms), else ours."""
    try:
        with open(script, "rb") as handle:
            first, second = handle.readline().decode(errors="replace"), handle.readline().decode(errors="replace")
    except OSError:
        return [sys.executable]
    if first.startswith("#!/bin/sh") and second.startswith("'''exec' "):
        return [second.split('"')[1]]  # pip's form for long paths: '''exec' "/path/python" "$0" "$@"
    if first.startswith("#!") and "python" in first:
        return first[2:].split()
    return [sys.executable]


def socket_dir(environ: dict[str, str]) -> str:
    """The private folder for the sockets (created 0700; refused if it is not ours alone)."""
    folder = environ.get("FEDSYNTH_WARM_CLIENTAPP_DIR") or os.path.join(
        tempfile.gettempdir(), f"fedsynth-warm-clientapp-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.stat(folder)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to uid {os.getuid()} with mode 0700")
    return folder


def socket_path(folder: str, owner_pid: int, real: str) -> str:
    """One warm server per owner process and real command (short: a unix socket path has 107 bytes)."""
    key = hashlib.sha256(f"{owner_pid}\0{os.path.realpath(real)}".encode()).hexdigest()[:16]
    return os.path.join(folder, f"{key}.sock")


def start_server(real: str, path: str, owner_pid: int) -> None:
    """Start a warm server in the background (double fork: not our child; stderr stays the SuperNode's log).

    It exits at once if another one holds this socket's lock (one is starting already).
    """
    command = [*interpreter_of(real), SERVER_PY, "--socket", path, "--owner-pid", str(owner_pid), "--real", real]
    pid = os.fork()
    if pid == 0:
        try:
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.execvp(command[0], command)
        except BaseException as error:  # noqa: BLE001 - a child must never return into the shim
            log(f"could not start the warm server: {error}")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def server_starting(path: str) -> bool:
    """Whether a warm server holds `path`'s lock (server.py takes it before importing anything)."""
    try:
        with open(f"{path}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(lock, fcntl.LOCK_UN)
    except OSError:
        pass
    return False


def connect_or_wait(path: str, wait_s: float = STARTING_WAIT_S) -> socket.socket:
    """Connect to the warm server; if one is starting, wait for it to listen (up to `wait_s`, while it lives).

    Raises the last connection error when there is no server, the starting one died, or the wait ran out.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() >= deadline or not server_starting(path):
                raise
            time.sleep(0.05)


def send_request(sock: socket.socket, argv: list[str], environ: dict[str, str], cwd: str) -> None:
    """Our argv, environment and folder (length-prefixed JSON), and our fds 0-2 alongside the length."""
    payload = json.dumps({"argv": argv, "env": environ, "cwd": cwd}).encode()
    fds, opened = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:  # closed: the task gets /dev/null there, as a closed fd would give it nothing anyway
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
    socket.send_fds(sock, [struct.pack("!I", len(payload))], fds)
    sock.sendall(payload)
    for fd in opened:
        os.close(fd)


def read_lines(sock: socket.socket):
    """The server's replies, one text line at a time, until it closes the connection."""
    buffer = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode()


def die_like(signum: int) -> None:
    """End this process by `signum`, as the task ended: Flower sees the same status."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught or blocked
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def run_warm(sock: socket.socket, argv: list[str]) -> None:
    """Hand the task over, pass signals on to it, and end as it ended. Never returns."""
    send_request(sock, argv, dict(os.environ), os.getcwd())
    child = 0

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child, signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    for line in read_lines(sock):
        kind, _, value = line.partition(" ")
        if kind == "pid":
            child = int(value)
        elif kind == "exit":
            sys.stdout.flush()
            os._exit(int(value))
        elif kind == "signal":
            die_like(int(value))
        elif kind == "error":
            log(f"the warm server could not run the task: {value}")
            os._exit(1)
    # The server went away mid-task; its children die with it (PR_SET_PDEATHSIG = SIGKILL), so did the task.
    log("the warm server ended during the task; the task was killed with it")
    die_like(signal.SIGKILL)


def main(shim_dir: str) -> None:
    """`flwr-clientapp ARGS...` through the warm server; the real command when off or when there is none."""
    argv = sys.argv[1:]
    environ = dict(os.environ)
    real = find_real_command(shim_dir, environ)
    if real is None:
        log(f"no {COMMAND} on PATH beyond {shim_dir}")
        sys.exit(127)
    if not enabled(environ):
        os.execv(real, [real, *argv])
    owner_pid = int(environ.get("FEDSYNTH_WARM_CLIENTAPP_OWNER_PID") or os.getppid())
    try:
        path = socket_path(socket_dir(environ), owner_pid, real)
        sock = connect_or_wait(path)
    except OSError as error:
        reason = error.strerror or str(error)
        if isinstance(error, PermissionError):
            log(f"{error}; running {real} cold")
        else:
            log(f"no warm server ({reason}); running {real} cold and starting a warm server for the next task")
            start_server(real, path, owner_pid)
        os.execv(real, [real, *argv])
    run_warm(sock, [real, *argv])


def superexec_main(shim_dir: str) -> None:
    """`flower-superexec ARGS...`: start the warm server for this executor's tasks, then become the real one.

    Flower's SuperNode starts its SuperExec as `flower-superexec` from `PATH` (and the compose ClientApp
    services run it as their command). `exec` keeps this process's pid, which is the SuperExec's and so the
    owner that its tasks' shims name (their parent): the server they look for is the one started here, while
    the node connects and the ServerApp starts, instead of beside the first task. When off, or when anything
    stops the server from starting, the SuperExec runs unchanged and the first task starts a server as before.
    """
    argv = sys.argv[1:]
    environ = dict(os.environ)
    real_superexec = find_real_command(shim_dir, environ, SUPEREXEC)
    if real_superexec is None:
        log(f"no {SUPEREXEC} on PATH beyond {shim_dir}")
        sys.exit(127)
    real = find_real_command(shim_dir, environ)
    if enabled(environ) and real is not None:
        owner_pid = int(environ.get("FEDSYNTH_WARM_CLIENTAPP_OWNER_PID") or os.getpid())
        try:
            path = socket_path(socket_dir(environ), owner_pid, real)
            start_server(real, path, owner_pid)
            # until the server holds its lock: a task that comes sooner must find it starting, not absent
            deadline = time.monotonic() + LOCK_WAIT_S
            while not server_starting(path) and not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.01)
        except OSError as error:
            log(f"could not start the warm server with the SuperExec ({error}); the first task will")
    os.execv(real_superexec, [real_superexec, *argv])
