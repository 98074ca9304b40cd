"""Real-size replies in a real deployment: three sites with ~45 MB replies (an 11M-parameter model, resnet18's
size), TLS and SuperNode authentication on, the SuperLink's state in a file, as docs/own-data.md's walk-through
starts them (deploy/superlink.sh, so its SQLite waits 60 s for a lock, not Flower's 5 s). Two rounds on tiny data.

Marked slow: on the shared 2-core CI host it takes minutes (each round moves ~270 MB through TLS and SQLite).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from fedsynth.loopback import BIN, free_ports, wait_for_port
from tests.site_folders import write_sites
from tests.test_own_data_deployment import (WalkThrough, _isolated_env, app_copy, commands, read_rounds, replaced,
                                            walk_through_steps, REPO)

LARGE_MODEL = """from torch import nn


def large(num_classes, channels, image_size):  # 11.1M float32 parameters: a ~45 MB reply, as resnet18's
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, 14000), nn.ReLU(),
                         nn.Linear(14000, num_classes))
"""


@pytest.mark.slow
def test_three_sites_with_45_mb_replies_complete_two_rounds_with_the_state_in_a_file(tmp_path):
    for tool in ("openssl", "ssh-keygen"):
        assert shutil.which(tool), f"`{tool}` is needed by deploy/pki.sh"
    work = tmp_path
    sites = write_sites(work / "data")
    (work / "deploy").symlink_to(REPO / "deploy")
    link_port, *node_ports = free_ports(4)
    env = {**os.environ, **_isolated_env(work), "FLWR_HOME": str(work / "flwr-home"),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1"}
    address = f"127.0.0.1:{link_port}"
    steps = walk_through_steps()
    results = work / "results"
    fed = WalkThrough(work, env)
    try:
        for command in commands(replaced(steps[2], {"superlink.example.org:8000": address})):
            fed.run(command)
        start_link, register = commands(replaced(steps[3], {
            "/srv/fedsynth/state.db": str(work / "state.db"),
            "deploy/superlink.sh ": f"deploy/superlink.sh --host 127.0.0.1 --port {link_port} "}))
        fed.start(start_link, "superlink.log")
        wait_for_port(link_port, 120)
        fed.run(register)
        (site_a,) = commands(replaced(steps[4], {"superlink.example.org:8000": address,
                                                  "/data/site-a": str(work / "data" / "site-a"),
                                                  "/var/cache/fedsynth": str(work / "cache")}))
        for site, port in zip(sites, node_ports):
            fed.start(f"{site_a.replace('site-a', site.name)} --port {port} --supernodes-per-host 3", f"{site.name}.log")
        app = app_copy(REPO, work / "app")
        (app / "sitemodels").mkdir()
        (app / "sitemodels" / "__init__.py").write_text("")
        (app / "sitemodels" / "nets.py").write_text(LARGE_MODEL)
        keys = {"results-dir": f"'{results}'", "run-name": "'large'", "local-steps": "1", "batch-size": "8",
                "checkpoint-every": "0", "node-wait-timeout": "300.0", "round-timeout": "600.0",
                "model": "'sitemodels.nets:large'"}
        (command,) = commands(replaced(steps[5], {
            "flwr run . fed --stream": "flwr run . fed --format json",
            "num-server-rounds=20 bounded-influence=true\"": "num-server-rounds=2 bounded-influence=true " + " ".join(f"{k}={v}" for k, v in keys.items()) + '"'}))
        start = time.monotonic()
        run_id = int(json.loads(fed.run(command, cwd=app))["run-id"])
        status = fed.wait_until_finished(run_id, results / "large" / "summary.json", timeout=1500)
        took = time.monotonic() - start
        assert status == "finished:completed", status + fed.log_tails()
        summary = json.loads((results / "large" / "summary.json").read_text())
        assert summary["status"] == "ok", summary
        rounds = {r["round"]: r for r in read_rounds(results / "large" / "metrics.jsonl")}
        for number in (1, 2):
            assert sorted(rounds[number]["answered-nodes"]) == [s.name for s in sites], rounds[number]
            assert rounds[number]["uplink-bytes"] > 3 * 44e6, rounds[number]  # three ~45 MB replies
        link_log = (fed.logs / "superlink.log").read_text(errors="replace")
        assert "database is locked" not in link_log
        print(f"2 rounds of three ~45 MB replies: {took:.0f} s, round times "
              f"{[round(rounds[n].get('round-time', 0)) for n in (1, 2)]} s, load {os.getloadavg()[0]:.1f}")
    finally:
        fed.stop()
