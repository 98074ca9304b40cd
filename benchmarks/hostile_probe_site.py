"""The hostile probe's site family (benchmarks/hostile_probe.py): a site's warm ClientApp server, its SuperNode's
watchdog and the SuperLink's busy state database, each judged by docs/deployment.md.

- warm-server: a neighbour of the SuperNode's warm ClientApp server (fedsynth/warm_clientapp) that nests its JSON
  past the recursion limit, trickles, sends only a header or nothing, claims 40 MB or 4 GiB, replaces the socket, or
  a socket folder that is a symbolic link or too long, or an owner gone at start. Handled: the connection is
  refused naming the reason (or the task runs cold with a line naming the socket or folder), and a normal task
  started beside it finishes as it would alone; silently wrong: a task handed to an impostor, a normal task held up
  or killed.
- watchdog: deploy/retry-activation.sh with a stand-in node: a ClientApp printing Flower's 500 line or its refusal,
  or a child writing a forged record, must not restart the node; Flower's own record must.
- state-503: deploy/superlink-state.py's answers: a database locked past `--busy-limit` ends in one error naming it
  and Flower's 500; an error that only says "database is locked" is Flower's 500.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hostile_probe import HANDLED, UNCLEAR, WRONG, Case, Verdict

ROOT = Path(__file__).resolve().parent.parent
SHIM_DIR = ROOT / "deploy" / "warm-clientapp"
DEPLOY = ROOT / "deploy"
DEADLINE_S = 2.0
TASK = '''
import sys, time
def main():
    mode, *rest = sys.argv[1:]
    if mode == "sleep":
        time.sleep(float(rest[0]))
    print(f"done warm={'probe_preload' in sys.modules}", flush=True)
    return int(rest[0]) if mode == "exit" else 0
'''


class WarmSite:
    """A SuperNode host's warm ClientApp server with a stand-in `flwr-clientapp` (stdlib only: starts in a second)."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="hp-site-"))
        (self.tmp / "lib").mkdir()
        (self.tmp / "lib" / "probe_task.py").write_text(TASK)
        (self.tmp / "lib" / "probe_preload.py").write_text("LOADED = True\n")
        (self.tmp / "bin").mkdir()
        real = self.tmp / "bin" / "flwr-clientapp"
        real.write_text(f"#!{sys.executable}\nimport sys\nfrom probe_task import main\nsys.exit(main())\n")
        real.chmod(0o755)
        self.sockets = Path(tempfile.mkdtemp(prefix="hp-"))
        self.owner = subprocess.Popen(["sleep", "120"])
        self.log = self.tmp / "node.log"
        self.env = {**os.environ, "PATH": f"{SHIM_DIR}{os.pathsep}{self.tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": str(self.tmp / "lib"), "FEDSYNTH_WARM_CLIENTAPP_DIR": str(self.sockets),
                    "FEDSYNTH_WARM_CLIENTAPP_OWNER_PID": str(self.owner.pid),
                    "FEDSYNTH_WARM_CLIENTAPP_PRELOAD": "probe_preload", "FEDSYNTH_WARM_CLIENTAPP_ENTRY": "probe_task:main",
                    "FEDSYNTH_WARM_CLIENTAPP_REQUEST_DEADLINE_S": str(DEADLINE_S)}

    def task(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A ClientApp task through the shim (its stderr: the node's log, which a server it starts keeps open)."""
        with open(self.log, "a") as log:
            return subprocess.Popen(["flwr-clientapp", *args], env=env or self.env, cwd=self.tmp,
                                    stdout=subprocess.PIPE, stderr=log, text=True)

    def start(self) -> None:
        first = self.task("ok")
        first.communicate(timeout=30)
        deadline = time.monotonic() + 30
        while not list(self.sockets.glob("*.sock")):
            if time.monotonic() > deadline:
                raise RuntimeError("the warm server did not start")
            time.sleep(0.05)

    def socket_path(self) -> Path:
        return next(self.sockets.glob("*.sock"))

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        self.owner.kill()
        self.owner.wait()


def normal_task_ends_normally(site: WarmSite, seconds: float = 0.5) -> str | None:
    """Run a normal warm task beside the hostile one; None when it ended as alone, else what went wrong."""
    started = time.monotonic()
    proc = site.task("sleep", str(seconds))
    try:
        out, _ = proc.communicate(timeout=seconds + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "the normal task beside it hung"
    took = time.monotonic() - started
    if proc.returncode != 0 or "done warm=True" not in out:
        return f"the normal task beside it ended with {proc.returncode} ({out.strip()!r})"
    if took > seconds + 2 * DEADLINE_S:  # slack for a loaded host; the old server held it 10 s
        return f"the normal task beside it was held up ({took:.1f} s for {seconds} s of work)"
    return None


def raw_request(site: WarmSite, size: int, payload: bytes = b"", trickle: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(site.socket_path()))
    if size >= 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        socket.send_fds(sock, [struct.pack("!I", size)], [devnull] * 3)
        os.close(devnull)
    if trickle:
        def drip() -> None:
            with contextlib.suppress(OSError):
                for _ in range(40):
                    sock.send(b" ")
                    time.sleep(0.25)
        threading.Thread(target=drip, daemon=True).start()
    elif payload:
        sock.sendall(payload)
    return sock


def server_answer(sock: socket.socket) -> str:
    sock.settimeout(DEADLINE_S + 10)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(4096):
            data += chunk
    sock.close()
    return data.decode(errors="replace")


def neighbour_case(size: int, payload: bytes, trickle: bool, expected: str) -> Verdict:
    """A hostile connection beside a normal task: refused naming `expected`, the normal task as alone, still served."""
    site = WarmSite()
    try:
        site.start()
        sock = raw_request(site, size, payload, trickle)
        trouble = normal_task_ends_normally(site)
        reply = server_answer(sock)
        if trouble:
            return WRONG, f"{trouble}; the hostile connection got {reply!r}"
        if expected not in reply:
            return UNCLEAR, f"the hostile connection got {reply!r} (names no {expected!r})"
        if normal_task_ends_normally(site):
            return WRONG, "the server stopped serving after the hostile connection"
        return HANDLED, reply.strip()
    finally:
        site.close()


def impostor_case() -> Verdict:
    """A same-user process replaces the socket file: a task must run cold and the impostor get nothing."""
    site = WarmSite()
    try:
        site.start()
        path = site.socket_path()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path.with_name("impostor")))
        listener.listen(1)
        os.rename(path.with_name("impostor"), path)
        got: list[bytes] = []

        def serve() -> None:
            listener.settimeout(20)
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                conn.settimeout(5)
                data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
                got.extend([data, *(b"fd" for _ in fds)])

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        task = site.task("exit", "4")
        out, _ = task.communicate(timeout=30)
        thread.join(10)
        if any(got):
            return WRONG, f"the impostor received {sum(map(len, got))} bytes of a task's request"
        if task.returncode != 4:
            return WRONG, f"the task ended with {task.returncode}, not its own 4"
        if "not the warm server that holds its lock" not in site.log_text():
            return UNCLEAR, "the task ran cold without a line naming the socket"
        return HANDLED, "the task ran cold, the impostor got nothing"
    finally:
        site.close()


def folder_case(kind: str) -> Verdict:
    """A socket folder that is a symbolic link or too long: every task cold, with a line naming the folder."""
    site = WarmSite()
    try:
        site.start()
        if kind == "symlink":
            folder = Path(tempfile.mkdtemp(prefix="hp-l-")) / "s"
            folder.symlink_to(tempfile.mkdtemp(prefix="hp-t-"))
            words = "is a symbolic link"
        else:
            folder = Path(tempfile.mkdtemp(prefix="hp-long-")) / ("d" * 90)
            folder.mkdir(mode=0o700)
            words = "is too long for a unix socket"
        task = site.task("exit", "3", env={**site.env, "FEDSYNTH_WARM_CLIENTAPP_DIR": str(folder)})
        task.communicate(timeout=30)
        trouble = normal_task_ends_normally(site)
        if trouble:
            return WRONG, trouble
        if task.returncode != 3:
            return WRONG, f"the task ended with {task.returncode}, not its own 3"
        if f"{folder} {words}" not in site.log_text():
            return UNCLEAR, f"no line naming {folder}"
        if list(Path(os.path.realpath(folder)).iterdir()):
            return WRONG, f"a server was started in {folder}"
        return HANDLED, f"cold, naming the folder ({words})"
    finally:
        site.close()


def dead_owner_case() -> Verdict:
    site = WarmSite()
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()
        done = subprocess.run([sys.executable, str(ROOT / "fedsynth" / "warm_clientapp" / "server.py"), "--socket",
                               str(site.sockets / "0123456789abcdef.sock"), "--owner-pid", str(gone.pid), "--real",
                               str(site.tmp / "bin" / "flwr-clientapp")], env=site.env, capture_output=True, text=True,
                              timeout=30)
        if "Traceback" in done.stderr:
            return UNCLEAR, "a refused start left a traceback: " + done.stderr.splitlines()[-1]
        return (HANDLED, "ends quietly") if done.returncode == 0 else (UNCLEAR, f"exit {done.returncode}")
    finally:
        site.close()


def watchdog_case(body: str, restart_expected: bool) -> Verdict:
    """deploy/retry-activation.sh over a stand-in node running `body` (tests/supernode_standin.py) on its first start."""
    sys.path.insert(0, str(ROOT))
    from tests import supernode_standin

    bin_dir = Path(tempfile.mkdtemp(prefix="hp-node-"))
    calls = supernode_standin.write(bin_dir, "if CALL == 1:\n" + "\n".join(f"    {line}" for line in body.splitlines())
                                    + "\n    time.sleep(6)\nsys.exit(0)\n")
    done = subprocess.run([str(DEPLOY / "retry-activation.sh"), "--retry-every", "1", "--stop-grace", "0", "--",
                           "flower-supernode"], env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=60)
    starts = len(calls.read_text().splitlines())
    said = [line for line in done.stderr.splitlines() if line.startswith("retry-activation.sh: ")]
    if restart_expected:
        if starts == 2 and said and "Flower's record: HTTP 500 for /v1/fleet/pull-messages" in said[0]:
            return HANDLED, said[0][:200]
        return (WRONG if starts == 1 else UNCLEAR), f"{starts} start(s), said {said}"
    if starts == 1 and not said and done.returncode in (0, 1):
        return HANDLED, f"not restarted (exit {done.returncode})"
    return WRONG, f"{starts} start(s), exit {done.returncode}, said {said}"


def state_case(kind: str) -> Verdict:
    """deploy/superlink-state.py's middleware on Flower's own SQL store (busy timeout 0.1 s, --busy-limit 1 s)."""
    import importlib.util
    import sqlite3

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from flwr.supercore.error import http_error_translator
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore
    from sqlalchemy import text
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware

    spec = importlib.util.spec_from_file_location("superlink_state", DEPLOY / "superlink-state.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    database = Path(tempfile.mkdtemp(prefix="hp-state-")) / "state.db"
    launcher.set_busy_timeout(100)
    streak = launcher.BusyStreak(1.0, str(database))
    launcher.note_writes(streak)
    store = SqlObjectStore(str(database))
    store.initialize()
    app = FastAPI(middleware=[Middleware(BaseHTTPMiddleware,
                                         dispatch=launcher.busy_state_answers_503(http_error_translator, streak))])

    @app.post("/v1/fleet/push-object")
    def push() -> dict:
        if kind == "text":
            raise ValueError("database is locked")
        if kind == "hand-made":
            raise sqlite3.OperationalError("database is locked")
        with store.session() as session:
            session.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
        return {}

    client = TestClient(app, raise_server_exceptions=False)
    if kind != "locked":
        status = client.post("/v1/fleet/push-object").status_code
        return (HANDLED, "Flower's 500") if status == 500 else (WRONG, f"answered {status}")
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    started, statuses, err = time.monotonic(), [], io.StringIO()
    with contextlib.redirect_stderr(err):
        while time.monotonic() - started < 10 and 500 not in statuses:
            statuses.append(client.post("/v1/fleet/push-object").status_code)
            time.sleep(0.1)
    took = time.monotonic() - started
    if 500 not in statuses:
        return WRONG, f"{len(statuses)} answers in {took:.0f} s, none final: {sorted(set(statuses))}"
    named = [line for line in err.getvalue().splitlines() if "ERROR" in line and str(database) in line]
    if not named:
        return UNCLEAR, "ended in a 500 without an error naming the database"
    return (HANDLED, f"500 after {took:.1f} s: {named[0][:160]}") if took < 3 else (WRONG, f"only after {took:.0f} s")


LEFT_OFFLINE_LINE = "ERROR :     Server error '500 Internal Server Error' for url 'https://h:1/v1/fleet/pull-messages'"


def site_cases(_work: Path) -> list[Case]:
    nested = b"[" * 100_000 + b"]" * 100_000
    cases = [
        Case("warm-server", "JSON nested 100,000 deep", lambda: neighbour_case(len(nested), nested, False,
                                                                               "nested deeper")),
        Case("warm-server", "a client trickling a byte every 0.25 s", lambda: neighbour_case(1000, b"", True,
                                                                                          "request deadline")),
        Case("warm-server", "a client that sends nothing", lambda: neighbour_case(-1, b"", False, "no request within")),
        Case("warm-server", "a length field of 40 MB", lambda: neighbour_case(40_000_000, b"", False, "over the cap")),
        Case("warm-server", "a length field of 4 GiB", lambda: neighbour_case(2**32 - 1, b"", False, "over the cap")),
        Case("warm-server", "a request of the wrong shape", lambda: neighbour_case(
            len(b'{"argv": 1}'), b'{"argv": 1}', False, "malformed request")),
        Case("warm-server", "an impostor replaces the socket", impostor_case),
        Case("warm-server", "a symlinked socket folder", lambda: folder_case("symlink")),
        Case("warm-server", "a socket folder too long for AF_UNIX", lambda: folder_case("long")),
        Case("warm-server", "an owner gone at start", dead_owner_case),
        Case("watchdog", "a ClientApp prints Flower's 500 line",
             lambda: watchdog_case(f"print({LEFT_OFFLINE_LINE!r}, file=sys.stderr)", False)),
        Case("watchdog", "a ClientApp prints 'Failed to activate SuperNode' and the node fails",
             lambda: watchdog_case("print('ERROR :     Exit Code: 305')\nprint('Failed to activate SuperNode.')\n"
                                   "sys.exit(1)", False)),
        Case("watchdog", "a child of the node forges a record on fd 3",
             lambda: watchdog_case("import subprocess\nsubprocess.run([sys.executable, '-c', " + json.dumps(
                 "import os; os.write(3, b'deactivated 500 /v1/fleet/pull-messages' + bytes([10]))")
                 + "], close_fds=False, capture_output=True)", False)),
        Case("watchdog", "Flower's own record of a 500 on its pull (control: restarts)",
             lambda: watchdog_case("import httpx\nrequest = httpx.Request('POST', 'https://h:1/v1/fleet/pull-messages')\n"
                                   "FLOWER.error(httpx.HTTPStatusError('x', request=request, "
                                   "response=httpx.Response(500, request=request)))", True)),
        Case("state-503", "a database locked past --busy-limit", lambda: state_case("locked")),
        Case("state-503", "an error whose text says 'database is locked'", lambda: state_case("text")),
        Case("state-503", "a hand-made sqlite3.OperationalError('database is locked')",
             lambda: state_case("hand-made")),
    ]
    return cases
