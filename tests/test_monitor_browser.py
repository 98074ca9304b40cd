"""`fedsynth monitor` in a real browser: a live in-process run, watched from Chromium headless.

Chromium and its driver come from the system's packages (`apt-get install chromium chromium-driver`, which
`.ci/run` does where they are missing) and Selenium from the test extra. Without them the test says so and
skips. The network is closed: Chromium starts with everything that would call out switched off, and a fresh
profile. With FEDSYNTH_MONITOR_SCREENSHOT=PATH the test also writes its screenshot there (docs/monitor.png is
made so: `FEDSYNTH_MONITOR_SCREENSHOT=docs/monitor.png .venv/bin/python -m pytest tests/test_monitor_browser.py`).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from flwr.app import Context, RecordDict

from fedsynth.inprocess import SlowGrid, run_federation
from fedsynth.monitor.server import make_server, start

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SITES = ("site-a", "site-b", "site-c")
LATE = 1002  # site-c's node id
REPO = Path(__file__).resolve().parent.parent


def _browser(profile: Path):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver on PATH (apt-get install chromium chromium-driver; .ci/run does it "
                    "as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1700"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"the page did not show {what} within {timeout} s")


def test_the_page_shows_a_live_run_its_dropped_and_late_nodes_and_its_end(tmp_path, tiny_data_dir):
    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "cache"),
           "results-dir": str(tmp_path / "results"), "run-name": "fedavg-demo", "num-server-rounds": 4,
           "local-steps": 2, "batch-size": 16, "model": "mlp", "node-wait-timeout": 0.5, "max-missing-nodes": 1,
           "min-nodes": 2}
    grid = SlowGrid(3, raw, node_config=lambda p: {"partition-id": p, "num-partitions": 3, "name": SITES[p]},
                    delay=1.0)  # rounds of 1 s at least: the page polls every 2 s
    grid.faults[(1, 2, "train")] = "raise"  # site-b's round-2 reply is an error: dropped, with its reason
    late = grid.contexts.pop(LATE)  # site-c connects during round 1 and takes part from round 2 (a late join)

    def connect_site_c(reply):
        grid.contexts[LATE] = Context(run_id=1, node_id=LATE, node_config=late.node_config, state=RecordDict(),
                                      run_config=dict(raw))
        return reply

    grid.faults[(0, 1, "train")] = connect_site_c
    study = tmp_path / "results" / "fedcog-cpu-study"  # a study's --out beside the run: its report's claims
    study.mkdir(parents=True)
    shutil.copyfile(REPO / "benchmarks/results/studies/fedcog-cpu/ledger.jsonl", study / "ledger.jsonl")
    shutil.copyfile(REPO / "benchmarks/results/studies/fedcog-cpu/report.md", study / "report.md")
    token = "a-token-of-32-characters-for-the-page"
    server = make_server(tmp_path / "results", "127.0.0.1", 0, token=token)
    start(server)
    driver = _browser(tmp_path / "profile")
    summary: dict = {}
    run = threading.Thread(target=lambda: summary.update(run_federation(raw, grid)), daemon=True)
    try:
        # ?token= sets the HttpOnly cookie the page's requests carry; #id= picks the run once its folder appears
        driver.get(f"{server.url}?token={token}#id=fedavg-demo")
        run.start()

        def texts(selector: str) -> list[str]:  # in one script: the page redraws its tables every 2 s
            return driver.execute_script(
                "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)", selector)

        def rows() -> list[str]:
            return driver.execute_script(
                "return Array.from(document.querySelectorAll('#rounds tbody tr')).map(r => r.dataset.round)")

        began = time.monotonic()
        _wait(lambda: "1" in rows(), 60, "round 1")
        print(f"round 1 shown after {time.monotonic() - began:.1f} s")
        assert run.is_alive() and "4" not in rows(), "round 1 should appear while the run goes on"
        assert "running" in texts("#status")[0]
        assert "?token=" not in driver.current_url  # the page takes the token out of the address bar
        _wait(lambda: "2" in rows(), 30, "round 2")
        _wait(lambda: "status: completed" in texts("#status")[0], 60, "the final status")
        print(f"final status shown after {time.monotonic() - began:.1f} s")
        run.join(30)
        assert summary["status"] == "ok"
        assert rows() == ["4", "3", "2", "1", "0"]
        nodes = {text.split("\t")[0]: text for text in texts("#nodes tbody tr")}
        assert set(nodes) == set(SITES)
        assert "round 2: error: injected failure" in nodes["site-b"]
        assert nodes["site-c"].split("\t")[5] == "round 2"  # joined late
        round1, round2 = texts('#rounds tbody tr[data-round="1"]')[0], texts('#rounds tbody tr[data-round="2"]')[0]
        assert "2 / 2" in round1 and "2 / 3" in round2 and "site-b: error: injected failure" in round2
        events = texts("#events li")
        assert "dropped replies: round 2: site-b: error: injected failure" in events
        assert "round 2: site-c joined late" in events
        assert len(texts("#charts .uplot")) == 4, "accuracy, loss, bytes and round time"
        logs = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not logs, logs
        shot = tmp_path / "monitor.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("FEDSYNTH_MONITOR_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["FEDSYNTH_MONITOR_SCREENSHOT"])

        driver.execute_script("document.querySelector('nav a[data-id=\"fedcog-cpu-study\"]').click()")
        _wait(lambda: driver.execute_script("return document.getElementById('run').hidden && "
                                            "!document.getElementById('study').hidden"), 10, "the study")
        claims = texts("#claims tbody tr")
        assert any("fedavg+cog > fedavg" in c and "[+6.94, +14.28]" in c and "holds" in c for c in claims)
        time.sleep(2.5)  # the next poll shows the study still
        assert driver.execute_script("return document.getElementById('run').hidden")
        assert "run(s) finished" in texts("#study-progress")[0]
        assert texts("#arms tbody tr")
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
        run.join(60)
