"""The warm ClientApp server: import torch and Flower once, fork one child per `flwr-clientapp` task.

    python server.py --socket PATH --owner-pid PID --real /path/to/flwr-clientapp

Started by the shim (`shim.py`), never by hand. It holds `PATH.lock` (a second server for the same socket
exits at once), imports the preload modules, then listens on `PATH`. Per connection it reads the shim's
request (argv, environment, working directory, fds 0-2), forks, answers `pid N`, and when the child has
ended `exit N` or `signal N`. If the shim goes away first (killed), the child is killed too, as a cold
`flwr-clientapp` would have been. It exits when the owner process exits or on SIGTERM/SIGINT/SIGHUP, after
its running children have ended.

Environment (read once, at start):
- `FEDSYNTH_WARM_CLIENTAPP_PRELOAD`: comma-separated modules to import before forking (default
  `PRELOAD`). Nothing here may initialise CUDA (a forked child could not use it) or be one of the app's
  own modules (those come with each run's FAB and are imported fresh by each child).
- `FEDSYNTH_WARM_CLIENTAPP_ENTRY`: `module:function` that a child runs (default `task.py`'s `run`: the
  `flwr-clientapp` console script's function, `flwr.supernode.cli:flwr_clientapp`, without re-extracting an
  installed FAB).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import fcntl
import importlib
import importlib.util
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback

LOG_PREFIX = "fedsynth warm-clientapp:"
# task.py, loaded from this folder under a name no app's own module can have (a FAB's top-level `task`
# module must not find ours in sys.modules)
TASK_MODULE = "fedsynth_warm_clientapp_task"
ENTRY = f"{TASK_MODULE}:run"
PRELOAD = "numpy,networkx,torch,flwr.supernode.cli,flwr.supernode.runtime.run_clientapp,flwr.clientapp"
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
REQUEST_TIMEOUT_S = 10.0


def log(message: str) -> None:
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def preload(modules: list[str]) -> None:
    """Import `modules`; fail if any of it initialised CUDA (a forked child could not use the device)."""
    for name in modules:
        importlib.import_module(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("preloading initialised CUDA; a forked task could not use the GPU")


def load_task_module() -> None:
    """Import task.py (next to this file) as `TASK_MODULE`, so that forked tasks find it loaded."""
    spec = importlib.util.spec_from_file_location(TASK_MODULE, os.path.join(os.path.dirname(__file__), "task.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[TASK_MODULE] = module
    spec.loader.exec_module(module)


def exit_status(code: object) -> int:
    """The process status `sys.exit(code)` gives (None -> 0, an int as is, anything else printed -> 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_entry(entry: str) -> int:
    """Run `module:function` as its console script would (`sys.exit(function())`); the process's status."""
    module, _, function = entry.partition(":")
    try:
        return exit_status(getattr(importlib.import_module(module), function)())
    except SystemExit as stop:
        return exit_status(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT  # Python ends an unhandled Ctrl-C by SIGINT
    except BaseException:  # noqa: BLE001 - the interpreter's top level: print the traceback, status 1
        traceback.print_exc()
        return 1


def finish_like_an_interpreter(status: int) -> None:
    """Join non-daemon threads, run atexit handlers, flush, and end with `status` (negative: that signal)."""
    main = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what Py_Finalize does; os._exit below would skip them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status if status >= 0 else 128 - status)


def become_task(request: dict, fds: list[int], server_fds: list[int], server_pid: int, entry: str,
                real: str) -> None:
    """In the forked child: take the shim's fds, environment, folder and argv, and run the entry. No return."""
    status = 70
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:  # the server died before prctl took effect
            os._exit(128 + signal.SIGKILL)
        os.setpgid(0, 0)  # group signals reach the shim, which passes them on: once, not twice
        signal.set_wakeup_fd(-1)
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(real))  # what the console script's sys.path starts with
        random.seed()  # a fresh process draws a fresh seed; forked ones would all share the server's
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        status = run_entry(entry)
    except BaseException:  # noqa: BLE001 - never return into the server's loop
        traceback.print_exc()
        status = 1
    finally:
        finish_like_an_interpreter(status)


def receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The shim's request: a 4-byte length with fds 0-2 alongside, then that much JSON."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    header, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    if len(header) != 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("malformed request")
    (size,) = struct.unpack("!I", header)
    payload = b""
    while len(payload) < size:
        chunk = conn.recv(size - len(payload))
        if not chunk:
            raise ValueError("request cut short")
        payload += chunk
    conn.settimeout(None)
    return json.loads(payload), fds


def status_line(status: int) -> str:
    """`exit N` or `signal N` for a `waitpid` status."""
    code = os.waitstatus_to_exitcode(status)
    return f"signal {-code}\n" if code < 0 else f"exit {code}\n"


class WarmServer:
    """The accept-fork-reap loop (one thread: forking a multi-threaded process is unsafe)."""

    def __init__(self, listener: socket.socket, owner_pid: int, entry: str, real: str, kept_fds: list[int]) -> None:
        self.listener, self.entry, self.real = listener, entry, real
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, ("accept", None))
        self.wakeup_read, self.wakeup_write = socket.socketpair()
        self.wakeup_read.setblocking(False)
        self.wakeup_write.setblocking(False)
        signal.set_wakeup_fd(self.wakeup_write.fileno())
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: None)  # noticed through the wakeup fd
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, ("signal", None))
        self.owner_fd = os.pidfd_open(owner_pid)
        self.selector.register(self.owner_fd, selectors.EVENT_READ, ("owner", None))
        self.kept_fds = kept_fds  # e.g. the lock file: the children must not hold it
        self.tasks: dict[int, tuple[socket.socket, int]] = {}  # pid -> (shim connection, pidfd)
        self.gone_shims: set[socket.socket] = set()  # connections of killed shims whose tasks are not reaped yet
        self.stopping = False

    def server_fds(self) -> list[int]:
        fds = [self.listener.fileno(), self.wakeup_read.fileno(), self.wakeup_write.fileno(), self.owner_fd,
               self.selector.fileno(), *self.kept_fds]
        for conn, pidfd in self.tasks.values():
            fds += [conn.fileno(), pidfd]
        return [fd for fd in fds if fd >= 0]

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            request, fds = receive_request(conn)
        except (OSError, ValueError) as error:
            log(f"dropped a connection: {error}")
            conn.close()
            return
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            become_task(request, fds, self.server_fds() + [conn.fileno()], server_pid, self.entry, self.real)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.tasks[pid] = (conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ("task", pid))
        self.selector.register(conn, selectors.EVENT_READ, ("shim", pid))
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            pass  # the shim is gone: its readable-EOF kills the child below

    def reap(self, pid: int) -> None:
        conn, pidfd = self.tasks.pop(pid)
        _, status = os.waitpid(pid, 0)
        self.selector.unregister(pidfd)
        if conn in self.gone_shims:  # shim_gone unregistered it already
            self.gone_shims.discard(conn)
        else:
            self.selector.unregister(conn)
        os.close(pidfd)
        try:
            conn.sendall(status_line(status).encode())
        except OSError:
            pass
        conn.close()

    def shim_gone(self, pid: int) -> None:
        """The shim's end closed (it sends nothing after its request): kill its task, as the shim was."""
        conn = self.tasks[pid][0]
        try:
            if conn.recv(1, socket.MSG_PEEK):
                return
        except OSError:
            pass
        self.selector.unregister(conn)
        self.gone_shims.add(conn)
        os.kill(pid, signal.SIGKILL)

    def stop_accepting(self, why: str) -> None:
        if not self.stopping:
            log(f"warm server {os.getpid()} stops ({why}); {len(self.tasks)} task(s) still running")
            self.stopping = True
            self.selector.unregister(self.listener)
            self.listener.close()

    def serve(self) -> None:
        while not (self.stopping and not self.tasks):
            for key, _ in self.selector.select():
                kind, pid = key.data
                if kind == "accept" and not self.stopping:
                    self.accept()
                elif kind == "task" and pid in self.tasks:
                    self.reap(pid)
                elif kind == "shim" and pid in self.tasks:
                    self.shim_gone(pid)
                elif kind == "signal":
                    self.wakeup_read.recv(64)
                    self.stop_accepting("signal")
                elif kind == "owner":
                    self.selector.unregister(self.owner_fd)
                    self.stop_accepting("its owner process exited")


def bind(path: str) -> socket.socket:
    """Listen on `path`: bound under a temporary name, then renamed, so a shim never meets a half-made socket."""
    temporary = f"{path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(temporary):
        os.unlink(temporary)
    listener.bind(temporary)
    listener.listen(64)
    os.rename(temporary, path)
    return listener


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--real", required=True, help="the real flwr-clientapp (its folder starts sys.path)")
    args = parser.parse_args(argv)
    lock = open(f"{args.socket}.lock", "a")  # noqa: SIM115 - held for the server's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server for this socket is starting or running
    try:
        owner_alive = os.pidfd_open(args.owner_pid)
        os.close(owner_alive)
    except ProcessLookupError:
        return 0
    start = time.monotonic()
    modules = [m for m in os.environ.get("FEDSYNTH_WARM_CLIENTAPP_PRELOAD", PRELOAD).split(",") if m]
    preload(modules)
    load_task_module()
    listener = bind(args.socket)
    log(f"warm server {os.getpid()} ready in {time.monotonic() - start:.1f} s (preloaded {', '.join(modules)}; "
        f"owner {args.owner_pid})")
    server = WarmServer(listener, args.owner_pid, os.environ.get("FEDSYNTH_WARM_CLIENTAPP_ENTRY", ENTRY),
                        args.real, [lock.fileno()])
    try:
        server.serve()
    finally:
        if os.path.exists(args.socket):
            os.unlink(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
