"""Exact-number end-to-end tests through the real ServerApp and ClientApp code, without Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from client_app.training import batch_indices
from common.run.config import parse_run_config
from common.data.datasets import load_dataset
from common.metrics.evaluation import as_tensors
from common.records import model_weights
from common.run.results import RunResults
from common.run.task import make_model
from server_app.handshake import handshake
from server_app.registry import SERVER_STRATEGIES, build_strategy
from tests.diffusion_tiny import TINY_DIFFUSION
from fedsynth.inprocess import InProcessGrid
from flwr.app import Context, RecordDict
from server_app.app import run_strategy


def run_inprocess(raw: dict, num_nodes: int, grid: InProcessGrid | None = None):
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = grid or InProcessGrid(num_nodes, raw)
    nodes = handshake(grid, cfg)
    strategy = build_strategy(cfg, nodes)
    with RunResults(cfg) as results:
        summary = run_strategy(grid, cfg, strategy, results)
    return summary, results, strategy, grid


def base_config(tmp_path, data_dir, **extra) -> dict:
    return {
        "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
        "run-name": "run", "num-server-rounds": 2, "local-steps": 3, "batch-size": 16, **extra,
    }


def test_one_iid_client_fedavg_equals_plain_sgd(tmp_path, tiny_data_dir):
    """With one client holding all data, a FedAvg round is exactly K plain SGD steps."""
    raw = base_config(tmp_path, tiny_data_dir, **{
        "num-server-rounds": 1, "partition": "iid", "local-test-fraction": 0.0,
        "local-steps": 25, "lr": 0.05, "momentum": 0.9, "weight-decay": 1e-4,
    })
    summary, results, strategy, _ = run_inprocess(raw, num_nodes=1)

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    data = load_dataset("fashion-mnist", tiny_data_dir)
    x, y = as_tensors(data.x_train, data.y_train, "fashion-mnist", torch.device("cpu"))
    model = make_model(cfg, seeded=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for idx in batch_indices(len(y), cfg, 1, 0):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    expected = model_weights(model)
    for name, value in expected.items():
        np.testing.assert_allclose(strategy.current[name], value, atol=1e-6, rtol=0)


# The algorithms that another test already runs for two rounds on 3 nodes in this same in-process engine, with
# this test's checks: the cases of tests/test_simulation.py's TestEveryStrategyInFlowerSimulation run each
# through `fedsynth run --engine inprocess` (and compare it with Flower's simulation engine), and plain FedDDPM
# is tests/test_fedddpm_runs.py's `fedddpm_run`. Running them here again is the same code the same way.
RUN_ELSEWHERE_INPROCESS = {"moon+cog", "scaffold", "fedsynsam", "oledfl-sam", "fedddpm+", "fedddpm"}


def test_the_algorithms_left_out_below_run_in_process_elsewhere():
    """RUN_ELSEWHERE_INPROCESS is exactly the simulation cases plus plain FedDDPM: a case dropped there is run here."""
    from tests.test_simulation import SIMULATION_CASES

    assert RUN_ELSEWHERE_INPROCESS == set(SIMULATION_CASES) | {"fedddpm"}


@pytest.mark.parametrize("algorithm", sorted(set(SERVER_STRATEGIES) - RUN_ELSEWHERE_INPROCESS))
def test_every_algorithm_two_rounds_inprocess(tmp_path, tiny_data_dir, algorithm):
    cog = {"gen-steps": 3, "gen-budget": 16, "cog-start-round": 2} if "cog" in algorithm else {}  # FedCOG, test size
    ddpm = TINY_DIFFUSION if "ddpm" in algorithm else {}  # FedDDPM (issue 5): the diffusion task, test size
    raw = base_config(tmp_path, tiny_data_dir, algorithm=algorithm, **cog, **ddpm)
    summary, results, _, _ = run_inprocess(raw, num_nodes=3)
    rounds = [json.loads(line) for line in (results.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r["answered"] == 3 and r["failed"] == 0 for r in rounds[1:])
    assert np.isfinite(summary["final-fid"] if ddpm else summary["final-central-accuracy"])
    for name in ("config.json", "summary.json", "accuracy.png", "bytes.png", "model.safetensors"):
        assert (results.path / name).is_file(), name


def test_scaffold_control_variates_travel_both_ways_and_are_counted(tmp_path, tiny_data_dir):
    fedavg, _, _, _ = run_inprocess(base_config(tmp_path / "a", tiny_data_dir), num_nodes=2)
    scaffold, _, strategy, grid = run_inprocess(base_config(tmp_path / "b", tiny_data_dir, algorithm="scaffold"), num_nodes=2)
    assert scaffold["uplink-bytes"] == pytest.approx(2 * fedavg["uplink-bytes"], rel=0.01)
    assert scaffold["downlink-bytes"] == pytest.approx(2 * fedavg["downlink-bytes"], rel=0.01)
    assert any(np.abs(c).sum() > 0 for c in strategy.control.values())
    # each node keeps its c_i in Context.state between rounds
    assert all("scaffold-c-i" in ctx.state.array_records for ctx in grid.contexts.values())


def test_failed_and_timed_out_nodes_are_skipped_and_recorded(tmp_path, tiny_data_dir):
    raw = base_config(tmp_path, tiny_data_dir, **{"num-server-rounds": 3, "min-nodes": 2})
    grid = InProcessGrid(4, raw)
    grid.faults[(1, 2, "train")] = "raise"
    grid.faults[(2, 3, "train")] = "timeout"
    summary, results, _, _ = run_inprocess(raw, 4, grid)
    rounds = {r["round"]: r for r in results.rounds}
    assert rounds[2]["answered"] == 3 and rounds[2]["failures"][0]["partition"] == 1
    assert rounds[2]["answered-nodes"] == ["partition-0", "partition-2", "partition-3"]  # who answered, by name
    assert rounds[3]["answered-nodes"] == ["partition-0", "partition-1", "partition-3"]
    assert "injected failure" in rounds[2]["failures"][0]["reason"]
    assert rounds[3]["answered"] == 3 and rounds[3]["failures"][0]["reason"] == "timeout"
    assert summary["rounds"] == 3


def test_nan_reply_is_dropped_not_averaged(tmp_path, tiny_data_dir):
    from flwr.app import Array

    raw = base_config(tmp_path, tiny_data_dir)
    grid = InProcessGrid(3, raw)

    def poison(reply):
        record = reply.content.array_records["arrays"]
        first = next(iter(record.keys()))
        bad = record[first].numpy().copy()
        bad.flat[0] = np.nan
        record[first] = Array(bad)
        return reply

    grid.faults[(0, 1, "train")] = poison
    summary, results, strategy, _ = run_inprocess(raw, 3, grid)
    assert "non-finite" in results.rounds[1]["failures"][0]["reason"]
    assert all(np.all(np.isfinite(w)) for w in strategy.current.values())


def test_too_few_nodes_for_too_long_stops_the_run(tmp_path, tiny_data_dir):
    from server_app.strategies.base import TooManyFailedRounds

    raw = base_config(tmp_path, tiny_data_dir, **{"num-server-rounds": 4, "min-nodes": 2, "max-failed-rounds": 2})
    grid = InProcessGrid(2, raw)
    for rnd in (1, 2):
        grid.faults[(0, rnd, "train")] = "raise"
    with pytest.raises(TooManyFailedRounds, match="min-nodes=2"):
        run_inprocess(raw, 2, grid)


def test_the_inprocess_engine_keeps_no_message_it_sent(tmp_path, tiny_data_dir, monkeypatch):
    """`fedsynth run --engine inprocess` runs through a grid that drops what it sent: a grid keeping every
    message held every round's models (a 200-round run of 100 decentralized nodes grew to 12 GB and was
    killed by the out-of-memory killer)."""
    from pathlib import Path

    from fedsynth import inprocess
    from fedsynth.simulation import run_simulation

    grids: list[InProcessGrid] = []

    class Spy(InProcessGrid):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            grids.append(self)

    monkeypatch.setattr(inprocess, "InProcessGrid", Spy)
    raw = base_config(tmp_path, tiny_data_dir, **{"algorithm": "dfedavg", "peers": 1})
    folder = run_simulation(Path(__file__).resolve().parent.parent, raw, 2, 1.0, engine="inprocess")
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2] and all(r["answered"] == 2 for r in rounds[1:])
    assert len(grids) == 1 and grids[0].sent == [] and not grids[0].keep_sent


class RestartingGrid(InProcessGrid):
    """An in-process grid where one node restarts in a round under a new node id, as a SuperNode without node
    authentication does: the message of that round is lost, the new process has an empty `Context.state`."""

    def __init__(self, *args, partition: int, restart_round: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.partition, self.restart_round, self.new_node_id = partition, restart_round, None

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if self.new_node_id is None and any(self._round_of(m) == self.restart_round for m in messages):
            old_id = next(nid for nid, ctx in self.contexts.items() if ctx.node_config["partition-id"] == self.partition)
            old = self.contexts.pop(old_id)
            self.new_node_id = old_id + 1000
            self.contexts[self.new_node_id] = Context(run_id=1, node_id=self.new_node_id, node_config=old.node_config,
                                                      state=RecordDict(), run_config=old.run_config)
        return super().send_and_receive([m for m in messages if m.metadata.dst_node_id in self.contexts],
                                        timeout=timeout)


@pytest.mark.parametrize("algorithm", ["fedavg", "dfedavg"])
def test_a_node_that_restarts_under_a_new_id_takes_part_again_from_its_next_round(tmp_path, tiny_data_dir,
                                                                                algorithm):
    from fedsynth.inprocess import run_federation

    raw = base_config(tmp_path, tiny_data_dir, algorithm=algorithm, **{"num-server-rounds": 4, "min-nodes": 2,
                                                                        "topology": "full"})
    grid = RestartingGrid(3, raw, partition=1, restart_round=2)
    summary = run_federation(raw, grid)
    rounds = {r["round"]: r for r in (json.loads(line) for line in
                                      (tmp_path / "results" / "run" / "metrics.jsonl").read_text().splitlines())}
    assert grid.new_node_id is not None
    assert rounds[2]["answered-nodes"] == ["partition-0", "partition-2"]  # its old id's message was lost
    for r in (3, 4):  # the new id was asked who it is and sent partition 1's messages
        assert rounds[r]["answered-nodes"] == ["partition-0", "partition-1", "partition-2"], rounds[r]
    assert summary["rounds"] == 4
