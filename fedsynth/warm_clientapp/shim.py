"""The `flwr-clientapp` shim: hand one ClientApp task to the warm server, or run it cold if there is none.

Run by `deploy/warm-clientapp/flwr-clientapp`, which sits first on the SuperNode's `PATH`. Stdlib only (it is
a process per task too, and must start in milliseconds). `deploy/warm-clientapp/flower-superexec` runs
`superexec_main`: the SuperNode starts its SuperExec by that name, so the warm server starts with the node,
not with its first task, and the first round's tasks are warm too. A task that comes while the server is
still importing waits for it (`STARTING_WAIT_S`) rather than import the same modules beside it. Environment:

- `FEDSYNTH_WARM_CLIENTAPP=0` (or false/no/off): run the real `flwr-clientapp` directly, no warm server.
- `FEDSYNTH_WARM_CLIENTAPP_DIR`: where the sockets live (default `$TMPDIR/fedsynth-warm-clientapp-<uid>`,
  created with mode 0700; refused, and every task run cold with a line naming it, if it is a symbolic link,
  not a folder, another user's, open to others, or so long that a socket path in it would pass the 107 bytes
  a unix socket path may have).
- `FEDSYNTH_WARM_CLIENTAPP_OWNER_PID`: whose life bounds the warm server (default: this shim's parent,
  the SuperExec). Tests set it; deployments leave it alone.
- `FEDSYNTH_REAL_FLWR_CLIENTAPP`: the real command (default: the next `flwr-clientapp` on `PATH`).

Whom a task is handed to: only the warm server of this socket, checked on the connected socket itself
(`SO_PEERCRED`), not from a file: its user is ours and its pid is the pid that holds the socket's lock (the
server a launcher started for this owner takes that lock before anything else, `/proc/locks` names the
holder). A process that replaced the socket file gets nothing (no argv, environment or fds): the task runs
cold, with a line naming the socket, the peer and the lock's holder. Within one user, this is as far as a
check can go: a process of the SuperNode's own user may also trace or kill the SuperNode itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import socket
import stat
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
# sun_path holds 108 bytes with the closing NUL (Linux `struct sockaddr_un`)
MAX_SOCKET_PATH_BYTES = 107
SOCKET_NAME_BYTES = len("0123456789abcdef.sock")  # socket_path's names: 16 hex digits of a hash


class WarmPathError(OSError):
    """The socket folder or path cannot be used (a symbolic link, another user's, open to others, too long)."""


class NotOurServer(OSError):
    """The process behind the socket is not the warm server of this socket (another user, or not its lock's holder)."""


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


def check_folder(folder: str) -> None:
    """Refuse a socket folder that is a symbolic link, not a folder, not ours alone, or too long for a socket in it.

    `lstat`, so a symbolic link is seen as one (the folder and the names in it are the parts the project makes;
    the folders above it are the operator's).
    """
    try:
        info = os.lstat(folder)
    except OSError as error:
        raise WarmPathError(f"the warm ClientApp folder {folder} cannot be read: {error.strerror}") from error
    if stat.S_ISLNK(info.st_mode):
        raise WarmPathError(f"the warm ClientApp folder {folder} is a symbolic link; it must be a real folder")
    if not stat.S_ISDIR(info.st_mode):
        raise WarmPathError(f"the warm ClientApp folder {folder} is not a folder")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WarmPathError(f"the warm ClientApp folder {folder} must belong to uid {os.getuid()} with mode 0700 "
                            f"(it has uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})")
    longest = len(os.fsencode(os.path.join(folder, "x" * SOCKET_NAME_BYTES)))
    if longest > MAX_SOCKET_PATH_BYTES:
        raise WarmPathError(f"the warm ClientApp folder {folder} is too long for a unix socket in it ({longest} bytes "
                            f"with the socket's name, at most {MAX_SOCKET_PATH_BYTES}); set FEDSYNTH_WARM_CLIENTAPP_DIR "
                            "to a shorter folder")


def socket_dir(environ: dict[str, str]) -> str:
    """The private folder for the sockets (created 0700; refused by `check_folder` if it is unfit)."""
    folder = environ.get("FEDSYNTH_WARM_CLIENTAPP_DIR") or os.path.join(
        tempfile.gettempdir(), f"fedsynth-warm-clientapp-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise WarmPathError(f"the warm ClientApp folder {folder} cannot be made: {error.strerror}") from error
    check_folder(folder)
    return folder


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected unix socket, from the kernel."""
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def lock_holder(lock_path: str) -> int | None:
    """The pid that holds the `flock` on `lock_path` (from /proc/locks), or None when no process holds it."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF" (a waiting lock has "->" after the number)
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE" and fields[5] == device:
                return int(fields[4])
    return None


def check_server(sock: socket.socket, path: str) -> None:
    """Refuse a peer that is not this socket's warm server: another user, or not the holder of the socket's lock."""
    pid, uid, _ = peer_credentials(sock)
    if uid != os.getuid():
        raise NotOurServer(f"the process behind {path} (pid {pid}) runs as uid {uid}, not as this SuperNode's uid "
                           f"{os.getuid()}")
    holder = lock_holder(f"{path}.lock")
    if pid != holder:
        raise NotOurServer(f"the process behind {path} (pid {pid}) is not the warm server that holds its lock "
                           f"({'none holds it' if holder is None else f'pid {holder}'})")


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
    """A connection to the warm server of `path`, after `check_server` (a refused peer is sent nothing)."""
    info = os.lstat(path)  # FileNotFoundError: no server
    if not stat.S_ISSOCK(info.st_mode):
        raise NotOurServer(f"{path} is not a unix socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        check_server(sock, path)
    except OSError:
        sock.close()
        raise
    return sock


def server_starting(path: str) -> bool:
    """Whether a warm server holds `path`'s lock (server.py takes it before importing anything)."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock if we took it
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
    """The server's replies, one text line at a time, until it closes (or resets) the connection."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            chunk = b""
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


def run_warm(sock: socket.socket, argv: list[str]) -> str:
    """Hand the task over, pass signals on to it, and end as it ended; never returns once the task has started.

    Returns the server's reason when it refused the request before starting anything (the caller runs it cold).
    """
    try:
        send_request(sock, argv, dict(os.environ), os.getcwd())
    except OSError as error:  # closed on us before the request was in (a server that refuses, or stopping)
        return f"the warm server closed the connection before the request was sent ({error.strerror or error})"
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
            if not child:
                return value
            log(f"the warm server could not run the task: {value}")
            os._exit(1)
    if not child:
        return "the warm server closed the connection before starting the task"
    # The server went away mid-task; its children die with it (PR_SET_PDEATHSIG = SIGKILL), so did the task.
    log("the warm server ended during the task; the task was killed with it")
    die_like(signal.SIGKILL)
    return ""  # not reached


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
        if isinstance(error, (WarmPathError, NotOurServer, PermissionError)):
            log(f"{error}; running {real} cold")
        else:
            log(f"no warm server ({reason}); running {real} cold and starting a warm server for the next task")
            start_server(real, path, owner_pid)
        os.execv(real, [real, *argv])
    refusal = run_warm(sock, [real, *argv])
    sock.close()
    log(f"the warm server refused the task ({refusal}); running {real} cold")
    os.execv(real, [real, *argv])


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
        except WarmPathError as error:
            log(f"{error}; every ClientApp task runs cold")
        except OSError as error:
            log(f"could not start the warm server with the SuperExec ({error}); the first task will")
    os.execv(real_superexec, [real_superexec, *argv])
