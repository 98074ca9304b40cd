"""The watchdog of deploy/retry-activation.sh against Flower's own SuperLink and SuperNode (issue 54).

When the SuperLink answers a SuperNode's pull with an HTTP error that Flower does not retry (a 500, as a
SuperLink whose state database is busy answers), Flower 1.42's `flower-supernode` logs the error,
deactivates the node and stops pulling, but its process lives on. Here a real SuperLink (TLS and SuperNode
authentication, as docs/own-data.md starts one) is reached through a small proxy that answers ONE
`/v1/fleet/pull-messages` with HTTP 500 and forwards everything else. The node runs as a site runs it,
`deploy/supernode.sh` (so under the watchdog, with its default grace), and must be back by itself: Flower's
own line, then the watchdog's, the node's deactivation reaching the SuperLink before the stop, the node
started again and activated under its old id without a refusal, pulling again, and `online` in
`flwr supernode list`.

Marked slow: it starts a SuperLink and the node twice (about 40 s on an idle core).
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fedsynth.loopback import BIN, free_ports, stop_process_groups, wait_for_port

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PULL = "/v1/fleet/pull-messages"
WATCHDOG_LINE = ("retry-activation.sh: the SuperLink answered this SuperNode with an error Flower does not retry, "
                 "and Flower deactivated the node but left its process running")


class FailingFleetProxy:
    """A TLS proxy on 127.0.0.1 in front of a SuperLink: answers the first pull-messages with HTTP 500 (the body
    a busy SQLite state gives), forwards every other request; `requests` records (seconds, path, status)."""

    def __init__(self, certs: Path, upstream_port: int) -> None:
        self.requests: list[tuple[float, str, int]] = []
        self.failed = threading.Event()
        upstream = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == PULL and not proxy.failed.is_set():
                    proxy.failed.set()
                    self.answer(500, [("Content-Type", "text/plain")], b"database is locked")
                    return
                link = http.client.HTTPSConnection("127.0.0.1", upstream_port, timeout=60, context=upstream)
                try:
                    link.request("POST", self.path, body,
                                 {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")})
                    response = link.getresponse()
                    self.answer(response.status, response.getheaders(), response.read())
                except OSError:  # the SuperLink is gone (the test is stopping it): a gateway's answer
                    self.answer(502, [], b"")
                finally:
                    link.close()

            def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                proxy.requests.append((time.monotonic(), self.path, status))
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(certs / "superlink.crt", certs / "superlink.key")  # its SAN lists 127.0.0.1
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FailingFleetProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def after(self, since: float, path: str, status: int) -> list[float]:
        """When `path` was answered with `status` after `since`."""
        return [at for at, p, s in list(self.requests) if at > since and p == path and s == status]


def run(command: list[str], work: Path, env: dict[str, str]) -> str:
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_a_supernode_that_flower_leaves_offline_after_a_500_on_its_pull_is_back_by_itself(tmp_path: Path) -> None:
    for tool in ("openssl", "ssh-keygen"):
        assert shutil.which(tool), f"`{tool}` is needed by deploy/pki.sh"
    work, certs = tmp_path, tmp_path / "certs"
    (work / "home").mkdir()
    env = {**os.environ, "HOME": str(work / "home"), "FLWR_HOME": str(work / "flwr-home"),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1"}
    link_port, node_port = free_ports(2)
    for args in (["ca", certs], ["server", certs, "superlink", "IP:127.0.0.1"], ["node-key", certs, "site-a"]):
        run([str(DEPLOY / "pki.sh"), *map(str, args)], work, env)
    run([str(DEPLOY / "connection.sh"), "fed", f"127.0.0.1:{link_port}", str(certs / "ca.crt")], work, env)
    logs = work / "logs"
    logs.mkdir()
    started: list[subprocess.Popen] = []

    def start(command: list[str], log: str) -> None:
        with open(logs / log, "wb") as out:
            started.append(subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))

    def tails() -> str:
        return "".join(f"\n--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in sorted(logs.iterdir()))

    try:
        # the SuperLink as docs/own-data.md starts it (TLS, SuperNode authentication), its state in memory
        start([str(DEPLOY / "superlink.sh"), "--certs", str(certs), "--host", "127.0.0.1", "--port", str(link_port)],
              "superlink.log")
        wait_for_port(link_port, 120)
        run([str(DEPLOY / "register-supernodes.sh"), "fed", str(certs / "site-a.pub")], work, env)
        with FailingFleetProxy(certs, link_port) as proxy:
            begin = time.monotonic()
            start([str(DEPLOY / "supernode.sh"), "--superlink", f"127.0.0.1:{proxy.port}", "--ca",
                   str(certs / "ca.crt"), "--key", str(certs / "site-a"), "--partition-id", "0", "--num-partitions",
                   "1", "--port", str(node_port)], "site-a.log")
            deadline = begin + 240
            back_at = None
            while back_at is None:
                assert time.monotonic() < deadline, "the node did not pull again after the 500" + tails()
                assert started[-1].poll() is None, "deploy/supernode.sh ended" + tails()
                if proxy.failed.is_set():
                    failed_at = proxy.after(begin, PULL, 500)[0]
                    reactivated = proxy.after(failed_at, "/v1/fleet/activate-node", 200)
                    if reactivated and (pulls := proxy.after(reactivated[0], PULL, 200)):
                        back_at = pulls[0]
                time.sleep(0.5)
            nodes = json.loads(run([str(BIN / "flwr"), "supernode", "list", "fed", "--format", "json"], work, env))
            requests = list(proxy.requests)
        node_log = (logs / "site-a.log").read_text(errors="replace")
    finally:
        stop_process_groups([p for p in started if p.poll() is None])

    lines = node_log.splitlines()
    # Flower's own line, as the watchdog matches it (colours and all), then the watchdog's line after it
    flower_line = f"Server error '500 Internal Server Error' for url 'https://127.0.0.1:{proxy.port}{PULL}'"
    (error_at,) = [i for i, line in enumerate(lines) if flower_line in line]
    assert "ERROR" in lines[error_at], lines[error_at]
    (watchdog_at,) = [i for i, line in enumerate(lines) if WATCHDOG_LINE in line]
    assert watchdog_at > error_at, node_log
    # Flower told the SuperLink the node is going (within the watchdog's grace), then the node was stopped and
    # started again: it activated at once (no "refused", no held session to wait out) under its old node id
    deactivated = [at for at, path, status in requests if path == "/v1/fleet/deactivate-node" and status == 200]
    assert deactivated and failed_at < deactivated[0] < reactivated[0], requests
    assert "refused to activate" not in node_log and "Failed to activate SuperNode" not in node_log, node_log
    assert sum("Starting Flower SuperNode" in line for line in lines) == 2, node_log
    node_ids = re.findall(r"SuperNode ID: (\d+)", node_log)
    assert len(node_ids) == 2 and node_ids[0] == node_ids[1], node_ids
    # ... and the SuperLink lists it online again, after the offline spell Flower's deactivation recorded
    (node,) = [n for n in nodes["nodes"] if n["node-id"] == node_ids[0]]
    assert node["status"] == "online" and node["offline-at"] != "N/A", node
    print(f"Flower's line: {lines[error_at]!r}; the 500 {failed_at - begin:.0f} s after the node's start, "
          f"deactivated {deactivated[0] - failed_at:.1f} s after it, activated again after {reactivated[0] - failed_at:.0f} s, "
          f"pulling again after {back_at - failed_at:.0f} s (load {os.getloadavg()[0]:.1f})")
