"""The monitor's HTTP server: a fixed set of routes over one results root, read-only, safe by default.

Python's own `http.server.ThreadingHTTPServer`: the page polls one JSON route and Prometheus scrapes another, a
few requests a second at most, and the standard library's server lets every limit be set here in a few lines
(URL and header sizes, no request body read at all, a deadline per connection, a cap on connections at once)
with no dependency to keep up. Flower's own FastAPI/uvicorn would add an event loop and an ASGI stack for
nothing this needs.

Routes: `/` (the page), `/static/<file>` (the page's script, its style and the uPlot chart library, served from
the package: hospital networks are often closed to CDNs), `/api/overview` (every run and study under the root,
one line each), `/api/view?id=<id>` (one run or study; `id` is looked up among the folders found, never joined
to a path), `/metrics` (fedsynth/monitor/prometheus.py). Anything else is 404; a method other than GET and HEAD
405. No request path reaches the filesystem.

Safe by default: it listens on 127.0.0.1 and then answers only requests whose Host is a loopback name (a web
page a browser loaded elsewhere cannot read it by DNS rebinding); any other address needs a token of at least
16 characters (`--token` or FEDSYNTH_MONITOR_TOKEN; a bearer token's characters only), which every request must carry (`Authorization: Bearer`,
the page's `?token=` once, which sets an HttpOnly cookie), compared in constant time. TLS with the
deployment's own certificate and key is optional (`--tls-certfile`, `--tls-keyfile`).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from fedsynth.monitor.files import FolderReader, scan
from fedsynth.monitor.prometheus import MonitorCollector
from fedsynth.monitor.views import run_view, study_view

MAX_URL_BYTES = 2048         # the longest request target answered (414 beyond)
MAX_QUERY_FIELDS = 4
MAX_HEADERS = 40             # 431 beyond
MAX_CONNECTIONS = 16         # at once; 503 beyond
CONNECTION_TIMEOUT = 10.0    # seconds a connection may wait between two reads of its request
CONNECTION_DEADLINE = 30.0   # seconds a connection may take in all
MIN_TOKEN_LENGTH = 16
TOKEN_CHARACTERS = re.compile(r"[A-Za-z0-9._~+/=-]+")  # a bearer token's characters (RFC 6750), safe in a cookie
TOKEN_ENV = "FEDSYNTH_MONITOR_TOKEN"
COOKIE = "fedsynth-monitor-token"
SCAN_EVERY = 2.0             # seconds between two looks for new run folders
STATIC = {  # route -> (file in fedsynth/monitor/static, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/monitor.js": ("monitor.js", "text/javascript; charset=utf-8"),
    "/static/monitor.css": ("monitor.css", "text/css; charset=utf-8"),
    "/static/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/static/uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8"),
}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class MonitorError(ValueError):
    """The monitor cannot start as asked: no such results folder, or another interface without a token."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Monitor:
    """The runs and studies under one results root, and their views (fedsynth/monitor/views.py)."""

    def __init__(self, root: Path) -> None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise MonitorError(f"fedsynth monitor: {root} is not a folder (give a run's results folder, a folder of "
                               "them, or a study's --out)")
        self.root = path.resolve()
        self.reader = FolderReader(str(self.root))
        self._entries: list[tuple[str, str]] = []
        self._scanned = 0.0
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MonitorCollector(self.views))

    def entries(self) -> list[tuple[str, str]]:
        """(kind, id) of every run folder and study under the root, looked for again every SCAN_EVERY seconds."""
        with self._lock:
            if time.monotonic() - self._scanned > SCAN_EVERY:
                self._entries = scan(str(self.root))
                self._scanned = time.monotonic()
            return list(self._entries)

    def view(self, ident: str) -> dict[str, Any] | None:
        """The view of the run or study named `ident` among those found, None for any other `ident`."""
        for kind, rel in self.entries():
            if rel == ident:
                return run_view(self.reader, rel) if kind == "run" else study_view(self.reader, rel)
        return None

    def views(self) -> list[dict[str, Any]]:
        """Every run's and study's view."""
        return [run_view(self.reader, rel) if kind == "run" else study_view(self.reader, rel)
                for kind, rel in self.entries()]

    def overview(self) -> dict[str, Any]:
        """One line per run and study: what the page's list shows."""
        keys = ("id", "kind", "state", "reason", "algorithm", "dataset", "last-round", "planned-rounds",
                "runs-finished", "runs-planned")
        return {"root": self.root.name, "entries": [{k: v[k] for k in keys if k in v} for v in self.views()]}

    def metrics(self) -> bytes:
        """/metrics' body."""
        return generate_latest(self.registry)


def _static_files() -> dict[str, tuple[bytes, str]]:
    folder = files("fedsynth.monitor") / "static"
    return {route: ((folder / name).read_bytes(), kind) for route, (name, kind) in STATIC.items()}


class _Handler(BaseHTTPRequestHandler):
    """One request: the route's answer, or a refusal that names what was wrong."""

    server: "MonitorServer"
    timeout = CONNECTION_TIMEOUT
    server_version = "fedsynth-monitor"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        """Quiet: a page polling every 2 s would fill the terminal."""

    def _send(self, status: int, body: bytes, kind: str = "text/plain; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self, status: HTTPStatus, why: str, headers: dict[str, str] | None = None) -> None:
        self.close_connection = True
        self._send(status, f"{status.value} {status.phrase}: {why}\n".encode(), headers=headers)

    def _token_ok(self, query: dict[str, list[str]]) -> tuple[bool, bool]:
        """(authorised, the token came in the query: set the cookie)."""
        token = self.server.token
        if token is None:
            return True, False
        offered: list[str] = []
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            offered.append(auth[len("Bearer "):].strip())
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
            if COOKIE in cookie:
                offered.append(cookie[COOKIE].value)
        except CookieError:
            pass
        from_query = query.get("token", [])[:1]
        expected = token.encode()
        for value in offered + from_query:
            if hmac.compare_digest(value.encode("utf-8", "replace"), expected):
                return True, value in from_query and value not in offered
        return False, False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if len(self.path) > MAX_URL_BYTES:
            return self._refuse(HTTPStatus.REQUEST_URI_TOO_LONG, f"the request target is longer than {MAX_URL_BYTES} "
                                "bytes")
        if len(self.headers) > MAX_HEADERS:
            return self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_HEADERS} headers")
        if self.headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in self.headers:
            return self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "a GET carries no body here")
        if self.server.loopback_only and (self.headers.get("Host", "").rsplit(":", 1)[0] not in LOOPBACK_NAMES):
            return self._refuse(HTTPStatus.MISDIRECTED_REQUEST, "this monitor answers requests to a loopback name "
                                "only (Host: 127.0.0.1, localhost or [::1])")
        target = urlsplit(self.path)
        try:
            query = parse_qs(target.query, max_num_fields=MAX_QUERY_FIELDS, strict_parsing=False)
        except ValueError:
            return self._refuse(HTTPStatus.BAD_REQUEST, f"more than {MAX_QUERY_FIELDS} query fields")
        authorised, set_cookie = self._token_ok(query)
        if not authorised:
            return self._refuse(HTTPStatus.UNAUTHORIZED, "this monitor needs its token (Authorization: Bearer "
                                "<token>, or ?token=<token> on the page's address)",
                                headers={"WWW-Authenticate": 'Bearer realm="fedsynth monitor"'})
        headers = {}
        if set_cookie:
            secure = "; Secure" if self.server.tls else ""
            headers["Set-Cookie"] = f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/{secure}"
        try:
            self._route(target.path, query, headers)
        except (OSError, ValueError, TypeError, KeyError, RecursionError) as err:  # a folder changing under us
            self._refuse(HTTPStatus.INTERNAL_SERVER_ERROR, f"could not read the results folder ({type(err).__name__}); "
                         "the next request reads it again")

    do_HEAD = do_GET

    def _route(self, route: str, query: dict[str, list[str]], headers: dict[str, str]) -> None:
        """The answer of a fixed route, or 404."""
        monitor = self.server.monitor
        if route in self.server.static:
            body, kind = self.server.static[route]
            return self._send(HTTPStatus.OK, body, kind, headers)
        if route == "/metrics":
            return self._send(HTTPStatus.OK, monitor.metrics(), CONTENT_TYPE_LATEST, headers)
        if route == "/api/overview":
            return self._json(monitor.overview(), headers)
        if route == "/api/view":
            ident = query.get("id", [""])[0]
            view = monitor.view(ident)
            if view is None:
                return self._refuse(HTTPStatus.NOT_FOUND, "no run or study of that id under this monitor's folder")
            return self._json(view, headers)
        return self._refuse(HTTPStatus.NOT_FOUND, "no such page (routes: /, /api/overview, /api/view?id=, /metrics)")

    def _json(self, value: Any, headers: dict[str, str]) -> None:
        body = json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
        self._send(HTTPStatus.OK, body, "application/json", headers)

    def _not_allowed(self) -> None:
        self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, "the monitor is read-only: GET and HEAD only",
                     headers={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed


class MonitorServer(ThreadingHTTPServer):
    """The threading HTTP server of one Monitor, at most MAX_CONNECTIONS connections at once."""

    daemon_threads = True
    request_queue_size = 32

    def __init__(self, monitor: Monitor, host: str, port: int, token: str | None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.monitor, self.token, self.tls = monitor, token, tls is not None
        self.loopback_only = token is None
        self.static = _static_files()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.deadline = CONNECTION_DEADLINE
        if ":" in host.strip("[]"):
            self.address_family = socket.AF_INET6
        super().__init__((host.strip("[]"), port), _Handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve in a thread, or refuse at once when MAX_CONNECTIONS are being served."""
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection within CONNECTION_DEADLINE in all (a client sending a byte at a time is cut off)."""
        deadline = threading.Timer(self.deadline, _cut, (request,))
        deadline.daemon = True
        deadline.start()
        try:
            if self.tls:
                request.settimeout(CONNECTION_TIMEOUT)
                request.do_handshake()
            super().process_request_thread(request, client_address)
        except (OSError, ssl.SSLError):
            self.shutdown_request(request)
        finally:
            deadline.cancel()
            self._slots.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"{'https' if self.tls else 'http'}://{shown}:{port}/"


def _cut(request: socket.socket) -> None:
    """End a connection past its deadline: its thread's read or write fails and the thread ends."""
    try:
        request.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def make_server(root: Path, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
                tls_certfile: Path | None = None, tls_keyfile: Path | None = None) -> MonitorServer:
    """The monitor's server on host:port (not yet serving); raises MonitorError for a setup that is not safe."""
    if token is not None and (len(token) < MIN_TOKEN_LENGTH or not TOKEN_CHARACTERS.fullmatch(token)):
        raise MonitorError(f"fedsynth monitor: --token must be at least {MIN_TOKEN_LENGTH} characters of "
                           "A-Z a-z 0-9 . _ ~ + / = - (e.g. `openssl rand -hex 24`): it goes into a cookie and a header")
    if not is_loopback(host) and token is None:
        raise MonitorError(f"fedsynth monitor: listening on {host} (not this machine's loopback) needs --token "
                           f"(or {TOKEN_ENV}): anyone who reaches {host} would see the runs")
    if not 0 <= port <= 65535:
        raise MonitorError(f"fedsynth monitor: --port {port} is not a port (0-65535; 0 picks a free one)")
    if (tls_certfile is None) != (tls_keyfile is None):
        raise MonitorError("fedsynth monitor: TLS needs both --tls-certfile and --tls-keyfile")
    context = None
    if tls_certfile is not None and tls_keyfile is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(str(tls_certfile), str(tls_keyfile))
        except (OSError, ssl.SSLError) as err:
            raise MonitorError(f"fedsynth monitor: cannot load the TLS certificate {tls_certfile} and key "
                               f"{tls_keyfile}: {err}") from None
    try:
        return MonitorServer(Monitor(root), host, port, token, context)
    except OSError as err:
        raise MonitorError(f"fedsynth monitor: cannot listen on {host}:{port}: {err.strerror}") from None


def start(server: MonitorServer) -> threading.Thread:
    """Serve in a daemon thread (tests, a driver beside a run); `server.shutdown()` stops it."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                              name="fedsynth-monitor")
    thread.start()
    return thread
