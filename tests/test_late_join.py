"""A site that joins mid-run (docs/own-data.md, docs/deployment.md "Sites that join late"), on the in-process grid:
asked the handshake and in from its next round where the algorithm allows it; refused by name where it does not."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from common.run import interrupt
from common.run.interrupt import RunInterrupted

from fedsynth.inprocess import InProcessGrid, run_federation

LATE = 1002  # the node id of partition 2, which connects after round 1


def late_grid(tmp_path: Path, data_dir: Path, join_in_round: int = 1, **extra) -> tuple[InProcessGrid, dict]:
    """Three partitions; partition 2 ('late-site') is not connected at the handshake and joins during a round."""
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

    grid.faults[(0, join_in_round, "train")] = connect_the_late_site
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


# ----- a run with a late site, interrupted and resumed: the site keeps its place -------------------------------


def stop_in_round(grid: InProcessGrid, number: int) -> InProcessGrid:
    """`grid` requests a stop (as SIGTERM's handler does) once round `number`'s train replies are in."""
    send_and_receive = grid.send_and_receive

    def stopping(messages, *, timeout=None):
        messages = list(messages)
        replies = send_and_receive(messages, timeout=timeout)
        if messages and messages[0].metadata.message_type == "train" and grid._round_of(messages[0]) == number:
            interrupt.request_stop(15)
            interrupt.raise_if_stopped()
        return replies

    grid.send_and_receive = stopping
    return grid


@pytest.fixture
def no_stop_left_over():
    interrupt.reset()
    yield
    interrupt.reset()


def test_a_resumed_run_takes_its_late_site_back_in_its_place_when_it_joins_late_again(tmp_path, tiny_data_dir,
                                                                                    flower_log, no_stop_left_over):
    extra = {"num-server-rounds": 4, "checkpoint-every": 1}
    grid, raw = late_grid(tmp_path, tiny_data_dir, **extra)
    with pytest.raises(RunInterrupted):
        run_federation(raw, stop_in_round(grid, 3))  # checkpoint of round 2, which late-site trained in
    interrupt.reset()
    # the resumed start lacks late-site again (max-missing-nodes = 1); before: refused, "written with nodes ..."
    grid, resumed = late_grid(tmp_path, tiny_data_dir, join_in_round=3, resume=True, **extra)
    assert run_federation(resumed, grid)["status"] == "ok"
    answered = {number: sorted(record["answered-nodes"]) for number, record in rounds(tmp_path).items()}
    everyone = ["late-site", "site-0", "site-1"]
    assert answered == {1: ["site-0", "site-1"], 2: everyone, 3: ["site-0", "site-1"], 4: everyone}
    lines = [r.getMessage() for r in flower_log.records]
    assert "resumed without partition(s) [2] of the checkpoint: each takes part again once it connects (as a site " \
           "that joins late)" in lines
    assert any(re.fullmatch(r"node 1002 \('late-site'\) joined mid-run \(partition 2, \d+ training examples\): it "
                            r"takes part from round 4", line) for line in lines), lines


def test_a_site_that_joined_after_the_checkpoint_takes_part_when_the_run_resumes(tmp_path, tiny_data_dir,
                                                                                 flower_log, no_stop_left_over):
    from fedsynth.inprocess import InProcessGrid

    extra = {"num-server-rounds": 3, "checkpoint-every": 1}
    grid, raw = late_grid(tmp_path, tiny_data_dir, **extra)
    with pytest.raises(RunInterrupted):
        run_federation(raw, stop_in_round(grid, 2))  # checkpoint of round 1, before late-site took part
    interrupt.reset()
    resumed = {**raw, "resume": True}
    names = {pid: {"partition-id": pid, "num-partitions": 3, "name": "late-site" if pid == 2 else f"site-{pid}"}
             for pid in range(3)}
    assert run_federation(resumed, InProcessGrid(3, resumed, node_config=lambda pid: names[pid]))["status"] == "ok"
    answered = {number: sorted(record["answered-nodes"]) for number, record in rounds(tmp_path).items()}
    assert answered == {1: ["site-0", "site-1"], 2: ["late-site", "site-0", "site-1"],
                        3: ["late-site", "site-0", "site-1"]}
    assert "partition(s) [2] joined after the checkpoint was written: they take part as sites that joined late" in [
        r.getMessage() for r in flower_log.records]


def test_which_node_tables_may_continue_a_checkpoint():
    from server_app.checkpoint import node_table_problem

    saved = [[0, 100], [1, 120], [2, 80]]
    assert node_table_problem(saved, [[1, 120], [0, 100], [2, 80]], late_joins=False) is None
    for fewer_or_more in ([[0, 100], [1, 120]], [*saved, [3, 50]]):  # a site away at the start, or joined since
        assert node_table_problem(saved, fewer_or_more, late_joins=True) is None
        assert "node set is fixed at the start" in node_table_problem(saved, fewer_or_more, late_joins=False)
    changed = node_table_problem(saved, [[0, 100], [1, 121]], late_joins=True)  # another site under partition 1
    assert "partitions [1] changed their training examples" in changed and "resume with the same" in changed
