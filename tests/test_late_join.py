"""A site that joins mid-run (docs/own-data.md, docs/deployment.md "Sites that join late"), on the in-process grid:
asked the handshake and in from its next round where the algorithm allows it; refused by name where it does not."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedsynth.inprocess import InProcessGrid, run_federation

LATE = 1002  # the node id of partition 2, which connects after round 1


def late_grid(tmp_path: Path, data_dir: Path, **extra) -> tuple[InProcessGrid, dict]:
    """Three partitions; partition 2 ('late-site') is not connected at the handshake and joins during round 1."""
    raw = {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "r"),
           "run-name": "run", "num-server-rounds": 2, "local-steps": 1, "batch-size": 16, "model": "mlp",
           "node-wait-timeout": 0.5, "max-missing-nodes": 1, "min-nodes": 2, "central-eval": False, **extra}
    configs = {pid: {"partition-id": pid, "num-partitions": 3, "name": "late-site" if pid == 2 else f"site-{pid}"}
               for pid in range(3)}
    grid = InProcessGrid(3, raw, node_config=lambda pid: configs[pid])
    late = grid.contexts.pop(LATE)

    def connect_the_late_site(reply):
        grid.contexts[LATE] = Context(run_id=1, node_id=LATE, node_config=late.node_config, state=RecordDict(),
                                      run_config=dict(raw))
        return reply

    grid.faults[(0, 1, "train")] = connect_the_late_site
    return grid, raw


@pytest.fixture
def flower_log(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    return caplog


def rounds(tmp_path: Path) -> dict[int, dict]:
    lines = (tmp_path / "r" / "run" / "metrics.jsonl").read_text().splitlines()
    return {r["round"]: r for r in map(json.loads, lines) if r.get("round", 0) >= 1}


def test_a_site_that_joins_mid_run_is_asked_the_handshake_and_trains_from_its_next_round(tmp_path, tiny_data_dir,
                                                                                         flower_log):
    grid, raw = late_grid(tmp_path, tiny_data_dir)
    summary = run_federation(raw, grid)
    assert summary["status"] == "ok", summary
    answered = {number: sorted(record["answered-nodes"]) for number, record in rounds(tmp_path).items()}
    assert answered == {1: ["site-0", "site-1"], 2: ["late-site", "site-0", "site-1"]}
    asked = [m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == LATE]
    assert asked[0] == "query.handshake" and asked.count("train") == 1, asked
    (line,) = [r.getMessage() for r in flower_log.records if "joined mid-run" in r.getMessage()]
    assert re.fullmatch(r"node 1002 \('late-site'\) joined mid-run \(partition 2, \d+ training examples\): it takes "
                        r"part from round 2", line), line


def test_the_decentralized_relay_refuses_a_late_site_with_one_line_naming_it(tmp_path, tiny_data_dir, flower_log):
    grid, raw = late_grid(tmp_path, tiny_data_dir, algorithm="dfedavg", topology="ring")
    summary = run_federation(raw, grid)
    assert summary["status"] == "ok", summary
    assert all(sorted(r["answered-nodes"]) == ["site-0", "site-1"] for r in rounds(tmp_path).values())
    asked = [m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == LATE]
    assert asked == ["query.handshake"], asked  # asked once, never sent a round's message
    (line,) = [r.getMessage() for r in flower_log.records if "joined mid-run" in r.getMessage()]
    assert line.startswith("node 1002 ('late-site') joined mid-run and takes no part: the decentralized relay keeps "
                           "the topology of the 2 nodes of the start"), line
