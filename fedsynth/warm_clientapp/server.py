"""The warm ClientApp server: import torch and Flower once, fork one child per `flwr-clientapp` task.

    python server.py --socket PATH --owner-pid PID --real /path/to/flwr-clientapp

Started by the shim (`shim.py`), never by hand. It checks its folder and socket path (no symbolic link, its
user's alone, short enough for a unix socket) and that its owner lives, before it imports anything: a refusal is
one line naming the folder, and an owner already gone (a SuperNode refused at start-up) ends it without a word.
It holds `PATH.lock` (a second server for the same socket exits at once), imports the preload modules, then
listens on `PATH`. Per connection it reads the shim's request (argv, environment, working directory, fds 0-2),
forks, answers `pid N`, and when the child has ended `exit N` or `signal N`. If the shim goes away first
(killed), the child is killed too, as a cold `flwr-clientapp` would have been. It exits when the owner process
exits or on SIGTERM/SIGINT/SIGHUP, after its running children have ended.

Each connection is read on its own thread, within one deadline for the whole request
(`FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S`, default 10 s) and a size cap (`REQUEST_MAX_BYTES`, checked on the
length field before anything is read), from a peer of the server's own user only (`SO_PEERCRED`). Whatever goes
wrong in one (a slow or silent client, a length of 4 GiB, JSON nested past Python's recursion limit, a request
of the wrong shape, another user) ends that connection, with one line naming the peer and the reason; the other
connections and the running tasks go on. The threads only read and parse: they hand a finished request to the
main thread, the only one that forks (and logs), so a child never inherits a lock that a reader held.

Environment (read once, at start):
- `FEDSYNTH_WARM_CLIENTAPP_PRELOAD`: comma-separated modules to import before forking (default
  `PRELOAD`). Nothing here may initialise CUDA (a forked child could not use it) or be one of the app's
  own modules (those come with each run's FAB and are imported fresh by each child).
- `FEDSYNTH_WARM_CLIENTAPP_ENTRY`: `module:function` that a child runs (default `task.py`'s `run`: the
  `flwr-clientapp` console script's function, `flwr.supernode.cli:flwr_clientapp`, without re-extracting an
  installed FAB).
- `FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S`: seconds a connection has to deliver its whole request (default
  `REQUEST_DEADLINE_S`).

A child's `sys.path` is a cold `flwr-clientapp`'s: the real command's folder, then the task's own `PYTHONPATH`,
then the interpreter's own entries (`cold_sys_path`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import fcntl
import importlib
import importlib.util
import json
import os
import queue
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
# task.py and shim.py, loaded from this folder under names no app's own module can have (a FAB's top-level
# `task` module must not find ours in sys.modules)
TASK_MODULE = "fedsynth_warm_clientapp_task"
SHIM_MODULE = "fedsynth_warm_clientapp_shim"
ENTRY = f"{TASK_MODULE}:run"
PRELOAD = "numpy,networkx,torch,flwr.supernode.cli,flwr.supernode.runtime.run_clientapp,flwr.clientapp"
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
REQUEST_DEADLINE_S = 10.0
# A request is argv, environment and folder: a SuperNode's environment is a few kB; 4 MiB leaves room for any
# real one and bounds what a connection can make the server hold.
REQUEST_MAX_BYTES = 4 * 1024 * 1024
# Connections being read at once; more are refused at once (each reader is a thread, ended by the deadline).
MAX_READING = 64
# interpreter_entries(), set at start
INTERPRETER_PATH: list[str] = []


def log(message: str) -> None:
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def preload(modules: list[str]) -> None:
    """Import `modules`; fail if any of it initialised CUDA (a forked child could not use the device)."""
    for name in modules:
        importlib.import_module(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("preloading initialised CUDA; a forked task could not use the GPU")


def load_sibling(name: str, filename: str):  # type: ignore[no-untyped-def]
    """Import `filename` (next to this file) as the module `name`, so that forked tasks find it loaded."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     filename))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_task_module() -> None:
    """Import task.py as `TASK_MODULE`."""
    load_sibling(TASK_MODULE, "task.py")


def pythonpath_entries(environ: dict[str, str]) -> list[str]:
    """The `sys.path` entries a new interpreter makes of `PYTHONPATH` here (absolute; an empty one is the folder)."""
    value = environ.get("PYTHONPATH", "")
    return [os.path.abspath(entry) for entry in value.split(os.pathsep)] if value else []


def unique(entries: list[str]) -> list[str]:
    """`entries` without repeats, first kept (what `site.removeduppaths` does to a new interpreter's path)."""
    return list(dict.fromkeys(entries))


def interpreter_entries(server_path: list[str], server_env: dict[str, str]) -> list[str]:
    """The interpreter's own `sys.path` entries (stdlib, site-packages, .pth files): the server's path less its
    script's folder and its `PYTHONPATH` (called at start, in the folder those were made absolute in)."""
    ours = set(pythonpath_entries(server_env))
    return [entry for entry in server_path[1:] if entry not in ours]


def cold_sys_path(real: str, task_env: dict[str, str], own: list[str]) -> list[str]:
    """The `sys.path` a cold `flwr-clientapp` (a new interpreter running `real` in `task_env`, in the task's
    folder) starts with: the script's folder, then the task's `PYTHONPATH`, then the interpreter's own entries."""
    return [os.path.dirname(os.path.abspath(real)), *unique([*pythonpath_entries(task_env), *own])]


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
        sys.path[:] = cold_sys_path(real, request["env"], INTERPRETER_PATH)
        random.seed()  # a fresh process draws a fresh seed; forked ones would all share the server's
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        status = run_entry(entry)
    except BaseException:  # noqa: BLE001 - never return into the server's loop
        traceback.print_exc()
        status = 1
    finally:
        finish_like_an_interpreter(status)


class RequestError(Exception):
    """A connection's request is refused (what is wrong with it, in words)."""


def read_exactly(conn: socket.socket, size: int, deadline: float, what: str) -> bytearray:
    """`size` bytes from `conn` before `deadline` (monotonic), read into one buffer (no copies per chunk)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RequestError(f"{what} not complete by the request deadline ({got} of {size} bytes)")
        conn.settimeout(left)
        try:
            count = conn.recv_into(view[got:])
        except TimeoutError:
            continue
        if count == 0:
            raise RequestError(f"{what} cut short ({got} of {size} bytes)")
        got += count
    return buffer


def discard_unread(conn: socket.socket, limit: int = 1 << 20) -> None:
    """Read and drop what a peer sent that was not read (at most `limit` bytes, without waiting): a socket closed with
    unread bytes resets its peer's connection, which can then fail to read the answer it was just sent."""
    dropped = 0
    while dropped < limit:
        try:
            chunk = conn.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            return
        dropped += len(chunk)


def check_request(request: object) -> dict:
    """The request's shape: {"argv": [str, ...], "env": {str: str}, "cwd": str}."""
    if not isinstance(request, dict) or set(request) != {"argv", "env", "cwd"}:
        raise RequestError("malformed request: not an object of argv, env and cwd")
    argv, env, cwd = request["argv"], request["env"], request["cwd"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RequestError("malformed request: argv is not a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("malformed request: env is not an object of strings")
    if not isinstance(cwd, str):
        raise RequestError("malformed request: cwd is not a string")
    return request


def receive_request(conn: socket.socket, deadline_s: float = REQUEST_DEADLINE_S,
                    max_bytes: int = REQUEST_MAX_BYTES) -> tuple[dict, list[int]]:
    """The shim's request: a 4-byte length with fds 0-2 alongside, then that much JSON, all within `deadline_s`.

    Raises RequestError (or OSError) for anything else; the fds received are closed then.
    """
    deadline = time.monotonic() + deadline_s
    conn.settimeout(deadline_s)
    try:
        header, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    except TimeoutError:
        raise RequestError(f"no request within the request deadline ({deadline_s:g} s)") from None
    try:
        if not header:
            raise RequestError("closed before sending a request")
        if len(fds) != 3:
            raise RequestError(f"sent {len(fds)} file descriptors with its request, not 3 (stdin, stdout, stderr)")
        header = bytes(header) + bytes(read_exactly(conn, 4 - len(header), deadline, "the request's length"))
        (size,) = struct.unpack("!I", header)
        if size > max_bytes:
            raise RequestError(f"request of {size} bytes is over the cap of {max_bytes} bytes")
        payload = read_exactly(conn, size, deadline, "the request")
        try:
            request = json.loads(payload)
        except RecursionError:
            raise RequestError("request JSON is nested deeper than Python's recursion limit") from None
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise RequestError(f"request is not JSON ({error})") from None
        return check_request(request), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def read_connection(conn: socket.socket, deadline_s: float, done: "queue.SimpleQueue", wake: socket.socket) -> None:
    """A reader thread: the peer's credentials and its request, handed to the main thread (which logs and forks).

    Nothing may escape: whatever fails ends this connection only.
    """
    peer = "an unknown peer"
    try:
        shim = load_shim()
        pid, uid, _ = shim.peer_credentials(conn)
        peer = f"pid {pid}"
        if uid != os.getuid():
            raise RequestError(f"runs as uid {uid}, not as this SuperNode's uid {os.getuid()}")
        request, fds = receive_request(conn, deadline_s)
        done.put((conn, peer, request, fds, None))
    except Exception as error:  # noqa: BLE001 - one connection's failure, reported by the main thread
        reason = str(error) if isinstance(error, RequestError) else f"{type(error).__name__}: {error}"
        done.put((conn, peer, None, [], reason))
    try:
        wake.send(b"r")
    except OSError:
        pass  # the main loop has a byte to read already (its buffer is full) or is gone


def load_shim():  # type: ignore[no-untyped-def]
    """shim.py (the path and peer checks), loaded once under `SHIM_MODULE`."""
    return sys.modules.get(SHIM_MODULE) or load_sibling(SHIM_MODULE, "shim.py")


def status_line(status: int) -> str:
    """`exit N` or `signal N` for a `waitpid` status."""
    code = os.waitstatus_to_exitcode(status)
    return f"signal {-code}\n" if code < 0 else f"exit {code}\n"


class WarmServer:
    """The accept-fork-reap loop. Only this thread forks; reader threads (`read_connection`) only read requests."""

    def __init__(self, listener: socket.socket, owner_fd: int, entry: str, real: str, kept_fds: list[int],
                 deadline_s: float = REQUEST_DEADLINE_S) -> None:
        self.listener, self.entry, self.real, self.deadline_s = listener, entry, real, deadline_s
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, ("accept", None))
        self.wakeup_read, self.wakeup_write = socket.socketpair()
        self.wakeup_read.setblocking(False)
        self.wakeup_write.setblocking(False)
        signal.set_wakeup_fd(self.wakeup_write.fileno())
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: None)  # noticed through the wakeup fd
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, ("signal", None))
        self.owner_fd = owner_fd  # opened before the preload: the owner may be gone by now
        self.selector.register(self.owner_fd, selectors.EVENT_READ, ("owner", None))
        self.ready: queue.SimpleQueue = queue.SimpleQueue()  # (conn, peer, request, fds, refusal) from readers
        self.ready_read, self.ready_write = socket.socketpair()
        self.ready_read.setblocking(False)
        self.ready_write.setblocking(False)
        self.selector.register(self.ready_read, selectors.EVENT_READ, ("ready", None))
        self.reading: set[socket.socket] = set()  # connections whose request a reader thread is reading
        self.kept_fds = kept_fds  # e.g. the lock file: the children must not hold it
        self.tasks: dict[int, tuple[socket.socket, int]] = {}  # pid -> (shim connection, pidfd)
        self.gone_shims: set[socket.socket] = set()  # connections of killed shims whose tasks are not reaped yet
        self.stopping = False

    def server_fds(self) -> list[int]:
        fds = [self.listener.fileno(), self.wakeup_read.fileno(), self.wakeup_write.fileno(), self.owner_fd,
               self.ready_read.fileno(), self.ready_write.fileno(), self.selector.fileno(), *self.kept_fds]
        for conn, pidfd in self.tasks.values():
            fds += [conn.fileno(), pidfd]
        fds += [conn.fileno() for conn in self.reading]
        return [fd for fd in fds if fd >= 0]

    def accept(self) -> None:
        """A new connection: read on its own thread (at most MAX_READING at once; more are refused at once)."""
        try:
            conn, _ = self.listener.accept()
        except OSError as error:
            log(f"could not accept a connection: {error}")
            return
        if len(self.reading) >= MAX_READING:
            log(f"refused a connection: {MAX_READING} connections are sending their requests already")
            conn.close()
            return
        self.reading.add(conn)
        threading.Thread(target=read_connection, args=(conn, self.deadline_s, self.ready, self.ready_write),
                         daemon=True, name="warm-request").start()

    def take_ready(self) -> None:
        """The requests (and refusals) the reader threads have finished."""
        try:
            self.ready_read.recv(4096)
        except BlockingIOError:
            pass
        while True:
            try:
                conn, peer, request, fds, refusal = self.ready.get_nowait()
            except queue.Empty:
                return
            self.reading.discard(conn)
            if refusal is not None:
                self.refuse(conn, peer, refusal)
            elif self.stopping:
                for fd in fds:
                    os.close(fd)
                self.refuse(conn, peer, "the warm server is stopping")
            else:
                self.start_task(conn, request, fds)

    @staticmethod
    def refuse(conn: socket.socket, peer: str, reason: str) -> None:
        """End one connection: say why in the log and to the peer (a shim logs it and runs its task cold)."""
        log(f"dropped a connection from {peer}: {reason}")
        try:
            conn.settimeout(1.0)
            conn.sendall(f"error {reason}\n".encode())
            conn.shutdown(socket.SHUT_WR)
            discard_unread(conn)
        except OSError:
            pass
        conn.close()

    def start_task(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        conn.settimeout(None)
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
        """The shim's end closed (it sends nothing after its request): kill its task, as the shim was.

        Anything it does send after its request is read and dropped (left unread, it would wake this loop for ever).
        """
        conn = self.tasks[pid][0]
        try:
            conn.setblocking(False)
            if conn.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.setblocking(True)
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
        while not (self.stopping and not self.tasks and not self.reading):
            for key, _ in self.selector.select():
                kind, pid = key.data
                if kind == "accept" and not self.stopping:
                    self.accept()
                elif kind == "ready":
                    self.take_ready()
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
    """Listen on `path` (mode 0600): bound under a short temporary name, then renamed, so a shim never meets a
    half-made socket."""
    temporary = os.path.join(os.path.dirname(path), f".{os.getpid()}.bind")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.lexists(temporary):
        os.unlink(temporary)
    listener.bind(temporary)
    os.chmod(temporary, 0o600)
    listener.listen(64)
    os.rename(temporary, path)
    return listener


def check_socket_path(path: str) -> None:
    """Refuse a socket path whose folder is unfit (shim.check_folder) or that is too long for a unix socket."""
    shim = load_shim()
    shim.check_folder(os.path.dirname(path) or ".")
    size = len(os.fsencode(path))
    if size > shim.MAX_SOCKET_PATH_BYTES:
        raise shim.WarmPathError(f"the warm server socket {path} is {size} bytes long, over the "
                                 f"{shim.MAX_SOCKET_PATH_BYTES} a unix socket path may have; set "
                                 f"FEDSYNTH_WARM_CLIENTAPP_DIR to a shorter folder than {os.path.dirname(path)}")


def open_lock(path: str) -> int:
    """`path` (created 0600, never through a symbolic link), for the server's lock."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--real", required=True, help="the real flwr-clientapp (its folder starts sys.path)")
    args = parser.parse_args(argv)
    INTERPRETER_PATH[:] = interpreter_entries(sys.path, dict(os.environ))
    try:  # before anything is imported: a refusal costs nothing and says what to change
        check_socket_path(args.socket)
        deadline_s = float(os.environ.get("FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S", REQUEST_DEADLINE_S))
        if not 0 < deadline_s <= 3600:
            raise ValueError(f"FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S={deadline_s:g} is not in (0, 3600]")
        lock = open_lock(f"{args.socket}.lock")
    except (OSError, ValueError) as error:
        log(f"warm server not started: {error}")
        return 2
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server for this socket is starting or running
    try:
        owner_fd = os.pidfd_open(args.owner_pid)
    except ProcessLookupError:
        return 0  # the owner is gone already (a SuperNode refused at start-up): nothing to serve, nothing to say
    start = time.monotonic()
    modules = [m for m in os.environ.get("FEDSYNTH_WARM_CLIENTAPP_PRELOAD", PRELOAD).split(",") if m]
    preload(modules)
    load_task_module()
    listener = bind(args.socket)
    log(f"warm server {os.getpid()} ready in {time.monotonic() - start:.1f} s (preloaded {', '.join(modules)}; "
        f"owner {args.owner_pid})")
    server = WarmServer(listener, owner_fd, os.environ.get("FEDSYNTH_WARM_CLIENTAPP_ENTRY", ENTRY),
                        args.real, [lock], deadline_s)
    try:
        server.serve()
    finally:
        if os.path.exists(args.socket):
            os.unlink(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
