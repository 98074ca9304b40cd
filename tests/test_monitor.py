"""`fedsynth monitor`: its views, its /metrics against metrics.jsonl, and hostile requests and folders.

The browser test (tests/test_monitor_browser.py) watches a live run; these tests need no browser.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.run.results import lock_run_folder
from fedsynth.cli import main as cli_main
from fedsynth.inprocess import InProcessGrid, run_federation
from fedsynth.monitor import server as monitor_server
from fedsynth.monitor.files import MAX_FILE_BYTES, parse_json_lines
from fedsynth.monitor.prometheus import metric_name, reason_kind
from fedsynth.monitor.server import MAX_CONNECTIONS, MonitorError, make_server, start
from fedsynth.monitor.views import node_rows, run_state

REPO = Path(__file__).resolve().parent.parent
SITES = ("site-a", "site-b", "site-c")
TOKEN = "0123456789abcdef-token"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_data_dir) -> Path:
    """A real 3-round in-process run of three named sites; site-b's round-2 reply is an error."""
    root = tmp_path_factory.mktemp("monitor")
    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(root / "cache"), "results-dir": str(root / "results"),
           "run-name": "fedavg-three-sites", "num-server-rounds": 3, "local-steps": 2, "batch-size": 16,
           "model": "mlp"}
    grid = InProcessGrid(3, raw, node_config=lambda p: {"partition-id": p, "num-partitions": 3, "name": SITES[p]})
    grid.faults[(1, 2, "train")] = "raise"
    run_federation(raw, grid)
    return root / "results"


class Served:
    """A monitor serving `root` on a free loopback port, stopped on close."""

    def __init__(self, root: Path, token: str | None = None) -> None:
        self.server = make_server(root, "127.0.0.1", 0, token=token)
        self.port = self.server.server_address[1]
        start(self.server)

    def get(self, target: str, headers: dict[str, str] | None = None, method: str = "GET",
            body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.putrequest(method, target, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
            for name, value in (headers or {}).items():
                connection.putheader(name, value)
            if body is not None:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            reply = connection.getresponse()
            return reply.status, dict(reply.getheaders()), reply.read()
        finally:
            connection.close()

    def json(self, target: str) -> dict:
        status, _, body = self.get(target)
        assert status == 200, body
        return json.loads(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    started: list[Served] = []

    def make(root: Path, token: str | None = None) -> Served:
        started.append(Served(root, token))
        return started[-1]

    yield make
    for served in started:
        served.close()


# ----- /metrics against metrics.jsonl ---------------------------------------------------------------------

def test_metrics_parsed_by_prometheus_client_match_metrics_jsonl(finished_run, serve):
    records = [json.loads(line) for line in (finished_run / "fedavg-three-sites" / "metrics.jsonl").read_text()
               .splitlines()]
    trained = [r for r in records if r["round"] >= 1]
    served = serve(finished_run)
    status, headers, body = served.get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    samples = {}
    listed = 0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
            listed += 1
    assert listed == len(samples), "a sample listed twice (Prometheus refuses the whole scrape)"
    run = ("run", "fedavg-three-sites")

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"run": run[1], **labels}.items())))]

    assert value("fedsynth_run_state", state="completed") == 1.0
    assert value("fedsynth_run_state", state="running") == 0.0
    assert value("fedsynth_run_last_round") == 3 and value("fedsynth_run_planned_rounds") == 3
    assert value("fedsynth_run_uplink_bytes_total") == sum(r["uplink-bytes"] for r in trained)
    assert value("fedsynth_run_downlink_bytes_total") == sum(r["downlink-bytes"] for r in trained)
    assert value("fedsynth_round_duration_seconds_count") == 3
    assert value("fedsynth_round_duration_seconds_sum") == pytest.approx(sum(r["round-time"] for r in trained))
    assert value("fedsynth_last_round_duration_seconds") == pytest.approx(trained[-1]["round-time"])
    assert value("fedsynth_run_failed_rounds_total") == 0
    for site in SITES:
        answered = sum(site in r["answered-nodes"] for r in trained)
        assert value("fedsynth_node_answered_replies_total", node=site) == answered
        assert value("fedsynth_node_answered_last_round", node=site) == float(site in trained[-1]["answered-nodes"])
    assert value("fedsynth_node_answered_replies_total", node="site-b") == 2
    assert trained[1]["failures"] == [{"node": 1001, "partition": 1, "reason": "error: injected failure"}]
    assert value("fedsynth_node_dropped_replies_total", node="site-b", reason="error") == 1
    assert not [k for k in samples if k[0] == "fedsynth_node_dropped_replies_total" and ("node", "site-a") in k[1]]
    nodes = {row["name"]: row for row in json.loads((finished_run / "fedavg-three-sites" / "nodes.json").read_text())}
    assert value("fedsynth_node_train_examples", node="site-c") == nodes["site-c"]["num-train-examples"]
    assert value("fedsynth_round_central_accuracy") == records[-1]["central-accuracy"]
    assert value("fedsynth_round_train_loss") == trained[-1]["train-loss"]


def test_hostile_metric_keys_give_one_valid_exposition(tmp_path, serve):
    record = {"round": 1, "sampled": 1, "answered": 1, "answered-nodes": ['site"} evil 1\n'], "failures": [],
              "central-accuracy": 0.5, "central_accuracy": 0.9, "duration_seconds": 7.0, "run_state": 1,
              "é\nx{y=\"z\"}": 2.0, "fid": float("nan"), "big": 1e308}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    _, _, body = serve(tmp_path).get("/metrics")
    samples = [(s.name, tuple(sorted(s.labels.items()))) for family in text_string_to_metric_families(body.decode())
               for s in family.samples]
    assert len(samples) == len(set(samples))
    values = {name: s for name, s in samples}
    assert "fedsynth_round_fid" not in values  # NaN is no value
    (tmp_path / "run" / "metrics.jsonl").write_text(
        json.dumps({**record, "big": 10**400}) + "\n" + json.dumps({"round": 10**400}) + "\n"
        + json.dumps({"round": True}) + "\n" + json.dumps({"round": -1}) + "\n")
    (tmp_path / "run" / "config.json").write_text(json.dumps({"num-server-rounds": 10**400}))
    served = serve(tmp_path)
    view = served.json("/api/view?id=run")
    assert [r["round"] for r in view["rounds"]] == [1] and view["skipped-lines"] == 3
    assert "big" not in view["rounds"][0]["metrics"] and view["planned-rounds"] is None
    assert served.get("/metrics")[0] == 200
    text = body.decode()
    assert "fedsynth_round_central_accuracy{run=\"run\"} 0.5" in text
    assert "fedsynth_round_duration_seconds_count{run=\"run\"} 0.0" in text  # not the run's duration_seconds key
    assert ('fedsynth_node_answered_replies_total{node="site\\"} evil 1\\n",run="run"} 1.0') in text


def test_metric_names_and_reason_kinds():
    assert metric_name("central-accuracy") == "fedsynth_round_central_accuracy"
    assert metric_name("stat-cog.generated") == "fedsynth_round_stat_cog_generated"
    assert reason_kind("error: injected failure") == "error"
    assert reason_kind("timeout") == "timeout"
    assert reason_kind("malformed reply (ValueError: x)") == "malformed reply"
    assert reason_kind("") == "unknown"


# ----- what the page shows -----------------------------------------------------------------------------

def test_the_run_view_names_the_dropped_site_and_the_outcome(finished_run, serve):
    served = serve(finished_run)
    overview = served.json("/api/overview")
    assert [e["id"] for e in overview["entries"]] == ["fedavg-three-sites"]
    view = served.json("/api/view?id=fedavg-three-sites")
    assert (view["state"], view["reason"], view["last-round"]) == ("completed", "", 3)
    round2 = next(r for r in view["rounds"] if r["round"] == 2)
    assert (round2["answered"], round2["sampled"]) == (2, 3)
    assert round2["dropped"] == [{"node": "site-b", "reason": "error: injected failure"}]
    site_b = next(n for n in view["nodes"] if n["name"] == "site-b")
    assert site_b["dropped"] == [{"round": 2, "reason": "error: injected failure"}]
    assert site_b["online"] and site_b["last-answered"] == 3 and site_b["away-since"] is None
    assert "dropped replies: round 2: site-b: error: injected failure" in view["events"]
    status, _, body = served.get("/")
    assert status == 200 and b"/static/uPlot.iife.min.js" in body and b"http" not in body.split(b"<body>")[1]


def _summary(status: str, reason: str = "") -> dict:
    return {"status": status, "status-reason": reason}


def test_the_five_states_and_their_reasons():
    rounds = [{"round": 1}, {"round": 2, "skipped": True}]
    assert run_state(_summary("ok"), rounds, False, 2) == ("completed", "")
    assert run_state(_summary("completed-with-failed-rounds", "1 of 2"), rounds, False, 2) == (
        "completed with failed rounds", "1 of 2")
    assert run_state(_summary("failed", "handshake: x"), rounds, False, 2) == ("failed", "handshake: x")
    assert run_state(_summary("interrupted", "SIGTERM"), rounds, False, 2) == ("stopped", "SIGTERM")
    assert run_state(None, rounds, True, 5) == ("running", "round 2 of 5 recorded")
    assert run_state(_summary("interrupted"), rounds, True, 5)[0] == "running"  # resumed: the old summary stays
    state, reason = run_state(None, rounds, False, 5)
    assert state == "stopped" and "killed after round 2" in reason and "resume=true" in reason
    assert run_state(None, rounds, None, 5)[0] == "unknown"
    assert run_state("JSONDecodeError: x", rounds, False, 5) == ("unknown", "summary.json is not a run summary: "
                                                                 "JSONDecodeError: x")


def test_a_site_that_joined_late_and_one_that_went_away():
    nodes = [{"name": "a", "node-id": 1, "partition-id": 0, "num-train-examples": 10},
             {"name": "b", "node-id": 2, "partition-id": 1, "num-train-examples": 20}]
    records = [
        {"round": 1, "sampled": 2, "answered-nodes": ["a", "b"], "failures": []},
        {"round": 2, "sampled": 3, "answered-nodes": ["a", "late"], "failures": [
            {"node": 2, "partition": 1, "reason": "timeout"}]},
        {"round": 3, "sampled": 3, "answered-nodes": ["a", "late"], "failures": []},
    ]
    rows = {row["name"]: row for row in node_rows(nodes, records, {1: "a", 2: "b"})}
    assert rows["late"]["joined"] == 2 and rows["late"]["examples"] is None and rows["late"]["online"]
    assert rows["b"]["away-since"] == 2 and rows["b"]["last-answered"] == 1 and not rows["b"]["online"]
    assert rows["a"]["joined"] is None and rows["a"]["answered-rounds"] == 3 and rows["a"]["examples"] == 10
    # before the handshake wrote nodes.json, a node is not "late"
    assert all(row["joined"] is None for row in node_rows(None, records, {}))


def test_a_running_run_holds_its_folder_lock_and_shows_as_running(tmp_path, serve):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"round": 1, "sampled": 1, "answered": 1}\n')
    (folder / "summary.json").write_text(json.dumps(_summary("interrupted", "SIGTERM")))  # before a resume
    served = serve(folder)
    assert served.json("/api/view?id=.")["state"] == "stopped"
    handle = lock_run_folder(folder)  # what RunResults takes while a run writes the folder
    try:
        assert served.json("/api/view?id=.")["state"] == "running"
    finally:
        handle.close()
    assert served.json("/api/view?id=.")["state"] == "stopped"


def test_a_study_shows_its_arms_and_once_reported_its_claims(tmp_path, serve):
    study = tmp_path / "study"
    (study / "claims").mkdir(parents=True)
    entries = [{"key": f"k{i}", "cell": cell, "phase": "report", "seed": seed, "exit-code": code}
               for i, (cell, seed, code) in enumerate([("fedavg@niid1", 0, 0), ("fedavg@niid1", 1, 0),
                                                       ("fedavg+cog@niid1", 0, 1)])]
    (study / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries) + '{"key": "torn')
    (study / "claims" / "k9.claim").write_text("host 1 pid 2")
    served = serve(study)
    view = served.json("/api/view?id=.")
    assert view["kind"] == "study" and view["report"] is False and view["claims"] == []
    assert (view["runs-finished"], view["runs-failed"], view["runs-under-way"]) == (2, 1, 1)
    assert {a["arm"]: (a["finished"], a["failed"], a["seeds"]) for a in view["arms"]} == {
        "fedavg@niid1": (2, 0, [0, 1]), "fedavg+cog@niid1": (0, 1, [])}
    shutil.copyfile(REPO / "benchmarks/results/studies/fedcog-cpu/report.md", study / "report.md")
    view = served.json("/api/view?id=.")
    claim = next(c for c in view["claims"] if c["claim"] == "fedavg+cog > fedavg" and c["variant"] == "niid2")
    assert (claim["mean"], claim["95 % CI"], claim["verdict"]) == ("+10.61", "[+6.94, +14.28]", "holds")
    assert view["runs-planned"] is not None
    _, _, body = served.get("/metrics")
    text = body.decode()
    assert 'fedsynth_study_finished_runs_total{arm="fedavg@niid1",study="."} 2.0' in text
    assert 'fedsynth_study_runs_under_way{study="."} 1.0' in text


# ----- a results folder being written, malformed, or hostile ---------------------------------------------

def test_json_lines_being_written_or_malformed_are_skipped_not_fatal():
    data = b'{"round": 1}\nnot json\n[1, 2]\n' + b"[" * 200_000 + b'\n\xff\xfe\n{"round": 2}\n{"round": 3, "samp'
    lines = parse_json_lines(data)
    assert [r["round"] for r in lines.records] == [1, 2]
    assert lines.malformed == 4 and lines.partial
    cut = parse_json_lines(b'und": 1}\n{"round": 2}\n', truncated=True)  # a read that began inside a line
    assert [r["round"] for r in cut.records] == [2] and cut.malformed == 0


def test_fedsynth_status_reads_metrics_jsonl_as_the_monitor_does(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2, "failures": [{"node": 4, "partition": 3, '
                                            '"reason": "timeout"}]}\nnot json\n{"round": 3, "fail')
    assert cli_main(["status", str(tmp_path)]) == 4
    assert "last round recorded: 2" in capsys.readouterr().out  # the half-written round 3 is not counted yet
    (tmp_path / "summary.json").write_text(json.dumps(_summary("ok")))
    assert cli_main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "dropped replies: round 2: partition-3: timeout" in out
    assert "metrics.jsonl: 1 malformed line(s) skipped" in out


def test_a_run_folder_being_written_replaced_and_damaged(tmp_path, serve):
    folder = tmp_path / "results" / "run"
    folder.mkdir(parents=True)
    metrics = folder / "metrics.jsonl"
    metrics.write_text("")
    served = serve(tmp_path / "results")
    stop = threading.Event()

    def writer() -> None:  # a round's line written in pieces, as a slow disk or a big line does
        with open(metrics, "ab", buffering=0) as handle:
            for number in range(1, 200):
                line = json.dumps({"round": number, "sampled": 2, "answered": 2, "uplink-bytes": 10}).encode() + b"\n"
                handle.write(line[:7])
                time.sleep(0.001)
                handle.write(line[7:])
                if stop.is_set():
                    return

    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    while thread.is_alive():
        view = served.json("/api/view?id=run")
        assert view["skipped-lines"] == 0
        seen.append(len(view["rounds"]))
    thread.join()
    assert seen == sorted(seen) and served.json("/api/view?id=run")["rounds"][-1]["round"] == 199
    # a resume rewrites metrics.jsonl from its checkpoint (a new file renamed over the old one): read afresh
    replacement = folder / ".metrics.jsonl.tmp"
    replacement.write_text(json.dumps({"round": 1, "sampled": 2}) + "\nnot json\n")
    os.replace(replacement, metrics)
    view = served.json("/api/view?id=run")
    assert [r["round"] for r in view["rounds"]] == [1] and view["skipped-lines"] == 1
    (folder / "summary.json").write_text("{half")
    (folder / "config.json").write_text('{"num-server-rounds": "many"}')
    os.mkfifo(folder / "nodes.json")  # a FIFO would block a plain open: refused as not a regular file
    view = served.json("/api/view?id=run")
    assert view["state"] == "unknown" and "summary.json is not a run summary" in view["reason"]
    assert view["planned-rounds"] is None and view["nodes"] == []
    with open(metrics, "ab") as handle:  # bigger than the monitor reads: its end is read
        handle.truncate(MAX_FILE_BYTES + 10)
        handle.seek(0, os.SEEK_END)
        handle.write(b"\n" + json.dumps({"round": 7}).encode() + b"\n")
    view = served.json("/api/view?id=run")
    assert view["truncated"] and view["rounds"][-1]["round"] == 7
    assert served.get("/metrics")[0] == 200


def test_symlinks_in_the_results_folder_are_not_followed(tmp_path, serve):
    outside = tmp_path / "outside"
    (outside / "secret-run").mkdir(parents=True)
    (outside / "secret-run" / "metrics.jsonl").write_text('{"round": 1, "answered-nodes": ["secret-site"]}\n')
    (outside / "names.json").write_text(json.dumps([{"name": "secret-site", "node-id": 1}]))
    root = tmp_path / "results"
    (root / "run").mkdir(parents=True)
    (root / "run" / "config.json").write_text("{}")
    (root / "linked-run").symlink_to(outside / "secret-run")                        # a run folder elsewhere
    (root / "run" / "metrics.jsonl").symlink_to(outside / "secret-run" / "metrics.jsonl")  # a file elsewhere
    (root / "run" / "nodes.json").symlink_to(outside / "names.json")
    (root / "run" / "summary.json").symlink_to("/etc/passwd")
    served = serve(root)
    assert [e["id"] for e in served.json("/api/overview")["entries"]] == ["run"]
    for target in ("/api/view?id=run", "/metrics", "/api/overview"):
        status, _, body = served.get(target)
        assert status == 200 and b"secret" not in body and b"root:" not in body
    assert served.get("/api/view?id=linked-run")[0] == 404


@pytest.mark.parametrize("target", [
    "/static/../../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "//etc/passwd", "/static/..%2fserver.py", "/static/monitor.js/../../server.py", "/fedsynth/monitor/server.py",
    "/api/view?id=../../etc", "/api/view?id=/etc", "/api/view?id=%2e%2e", "/api/view?id=run/../../outside",
    "/api/view?id=run%00", "/api/view", "http://127.0.0.1/../../etc/passwd", "/index.html", "/static/",
])
def test_path_tricks_are_refused(tmp_path, serve, target):
    (tmp_path / "results" / "run").mkdir(parents=True)
    (tmp_path / "results" / "run" / "config.json").write_text("{}")
    status, _, body = serve(tmp_path / "results").get(target)
    assert status == 404 and b"root:" not in body and b"import" not in body


def test_huge_odd_and_writing_requests_are_refused_and_the_monitor_keeps_serving(tmp_path, serve):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    served = serve(tmp_path)
    assert served.get("/?" + "a=1&" * 5000)[0] == 414
    assert served.get("/api/view?id=run&a=1&b=2&c=3&d=4&e=5")[0] == 400
    assert served.get("/", headers={f"X-H{i}": "x" for i in range(60)})[0] == 431
    assert served.get("/", method="POST", body=b"x" * 1000)[0] == 405
    assert served.get("/", headers={"Content-Length": "100000000"})[0] == 413
    assert served.get("/", headers={"Host": "attacker.example"})[0] == 421  # DNS rebinding
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:  # past http.server's line limit
        raw.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.0 414")
    assert served.get("/api/view?id=run")[0] == 200


def test_idle_connections_are_capped_and_dropped(tmp_path, serve, monkeypatch):
    monkeypatch.setattr(monitor_server._Handler, "timeout", 1.0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    served = serve(tmp_path)
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as extra:
            extra.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert extra.recv(100).startswith(b"HTTP/1.1 503")
        time.sleep(1.5)  # the idle ones are past their deadline and closed
        assert all(s.recv(10) == b"" for s in idle)
        assert served.get("/api/view?id=run")[0] == 200
    finally:
        for s in idle:
            s.close()
    served.server.deadline = 1.0
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as drip:  # a byte at a time, forever
        began = time.monotonic()
        with pytest.raises(OSError):
            for byte in b"GET /" + b"a" * 100:
                drip.sendall(bytes([byte]))
                time.sleep(0.1)
        assert time.monotonic() - began < 3
    assert served.get("/api/view?id=run")[0] == 200


# ----- the token and the interface --------------------------------------------------------------------------

def test_every_route_needs_the_token_when_one_is_set(tmp_path, serve):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    served = serve(tmp_path, token=TOKEN)
    for target in ("/", "/metrics", "/api/overview", "/api/view?id=run", "/static/monitor.js", "/nowhere"):
        status, headers, body = served.get(target)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer") and b"run" not in body[:40]
        assert served.get(target, {"Authorization": "Bearer " + TOKEN[:-1] + "X"})[0] == 401
        assert served.get(target, {"Authorization": "Bearer " + TOKEN * 100})[0] == 401
        assert served.get(target, {"Cookie": "fedsynth-monitor-token=wrong"})[0] == 401
    assert served.get("/metrics", {"Authorization": "Bearer " + TOKEN})[0] == 200
    status, headers, _ = served.get("/?token=" + TOKEN)
    assert status == 200 and "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
    cookie = headers["Set-Cookie"].split(";")[0]
    assert served.get("/api/overview", {"Cookie": cookie})[0] == 200
    assert served.get("/", {"Host": "monitor.site.example"})[0] == 401  # a token server is meant to be reached


def test_another_interface_needs_a_token_and_the_cli_says_so(tmp_path, capsys):
    with pytest.raises(MonitorError, match="needs --token"):
        make_server(tmp_path, "0.0.0.0", 0)
    for bad in ("short", "sixteen-or-more;Path=/x", "sixteen-or-more\r\nSet-Cookie: x=1", "sixteen or more chars"):
        with pytest.raises(MonitorError, match="at least 16 characters of"):
            make_server(tmp_path, "127.0.0.1", 0, token=bad)
    for port in (-1, 65536, 10**6):
        with pytest.raises(MonitorError, match=f"--port {port} is not a port"):
            make_server(tmp_path, "127.0.0.1", port)
    with pytest.raises(MonitorError, match="both --tls-certfile and --tls-keyfile"):
        make_server(tmp_path, "127.0.0.1", 0, tls_certfile=tmp_path / "c.pem")
    assert cli_main(["monitor", str(tmp_path), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "needs --token" in capsys.readouterr().err
    assert cli_main(["monitor", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    taken = make_server(tmp_path, "127.0.0.1", 0)
    with pytest.raises(MonitorError, match=f"cannot listen on 127.0.0.1:{taken.server_address[1]}"):
        make_server(tmp_path, "127.0.0.1", taken.server_address[1])
    taken.server_close()
    server = make_server(tmp_path, "0.0.0.0", 0, token=TOKEN)
    server.server_close()


# ----- deploy/: the scrape config and the Grafana dashboard ---------------------------------------------------

def test_the_grafana_dashboard_queries_only_metrics_the_monitor_serves(finished_run, tmp_path, serve):
    import re

    import yaml

    shutil.copytree(finished_run / "fedavg-three-sites", tmp_path / "run")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "ledger.jsonl").write_text(json.dumps({"key": "k", "cell": "fedavg", "exit-code": 0}) + "\n")
    _, _, body = serve(tmp_path).get("/metrics")
    served = {sample.name for family in text_string_to_metric_families(body.decode()) for sample in family.samples}
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"fedsynth_[a-z_]+", target["expr"])}
    assert len(queried) >= 10 and queried <= served, queried - served
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics" and scrape["authorization"]["type"] == "Bearer"


def test_tls_with_the_deployments_own_certificate(tmp_path):
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "monitor")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    (tmp_path / "results").mkdir()
    server = make_server(tmp_path / "results", "127.0.0.1", 0, TOKEN, tmp_path / "cert.pem", tmp_path / "key.pem")
    start(server)
    try:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        connection = http.client.HTTPSConnection("localhost", server.server_address[1], context=context, timeout=10)
        connection.request("GET", "/?token=" + TOKEN)
        reply = connection.getresponse()
        assert reply.status == 200 and "; Secure" in reply.getheader("Set-Cookie")
        reply.read()
        connection.close()
        plain = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        with pytest.raises((OSError, http.client.HTTPException)):
            plain.request("GET", "/")
            plain.getresponse()
        plain.close()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(MonitorError, match="cannot load the TLS certificate"):
        make_server(tmp_path / "results", "127.0.0.1", 0, TOKEN, tmp_path / "key.pem", tmp_path / "cert.pem")


def test_the_page_and_its_chart_library_ship_in_the_package():
    """Every file the server serves matches pyproject's package-data for fedsynth.monitor (a wheel carries it)."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "fedsynth.monitor"]
    static = REPO / "fedsynth" / "monitor" / "static"
    shipped = [f"static/{name}" for name, _ in monitor_server.STATIC.values()] + ["static/uPlot-LICENSE"]
    for path in shipped:
        assert (REPO / "fedsynth" / "monitor" / path).is_file() and any(fnmatch.fnmatch(path, p) for p in patterns)
    assert sorted(p.name for p in static.iterdir()) == sorted(path.split("/")[1] for path in shipped)
    assert "MIT License" in (static / "uPlot-LICENSE").read_text()
    assert (static / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_the_fedsynth_monitor_command_serves_until_interrupted(finished_run):
    import signal
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from fedsynth.cli import main; sys.exit(main())", "monitor",
         str(finished_run), "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith(f"fedsynth monitor: {finished_run.resolve()} on http://127.0.0.1:"), line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/api/overview")
        assert json.loads(connection.getresponse().read())["entries"][0]["state"] == "completed"
        connection.close()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
