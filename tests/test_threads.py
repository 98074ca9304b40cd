"""The ClientApp's torch thread count: node config, then OMP_NUM_THREADS, then cores per SuperNode on the host."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Context, RecordDict

from client_app.threads import torch_threads


@pytest.mark.parametrize(("node_config", "environ", "cores", "expected"), [
    ({"torch-threads": 3}, {"OMP_NUM_THREADS": "1"}, 8, 3),       # the operator's explicit choice wins
    ({}, {"OMP_NUM_THREADS": "2"}, 8, 2),                         # Ray sets it from --cpus-per-client
    ({}, {}, 8, 8),                                               # one SuperNode: every usable core
    ({"supernodes-per-host": 2}, {}, 8, 4),
    ({"supernodes-per-host": 3}, {}, 8, 2),                       # floored
    ({"supernodes-per-host": 4}, {}, 2, 1),                       # never below one
    ({"supernodes-per-host": 2}, {"OMP_NUM_THREADS": " "}, 2, 1),  # blank: unset
])
def test_thread_count_rules(node_config, environ, cores, expected):
    assert torch_threads(node_config, environ, cores) == expected


@pytest.mark.parametrize(("node_config", "environ", "named"), [
    ({"torch-threads": 0}, {}, "torch-threads"),
    ({"torch-threads": "2"}, {}, "torch-threads"),
    ({"supernodes-per-host": 0}, {}, "supernodes-per-host"),
    ({}, {"OMP_NUM_THREADS": "two"}, "OMP_NUM_THREADS"),
])
def test_malformed_settings_name_their_key(node_config, environ, named):
    with pytest.raises(ValueError, match=named):
        torch_threads(node_config, environ, 4)


def test_every_clientapp_message_applies_the_node_setting(tiny_data_dir, tmp_path):
    import json

    from fedsynth.inprocess import InProcessGrid, run_federation

    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "r"),
           "run-name": "run", "num-server-rounds": 1, "local-steps": 1, "batch-size": 16, "checkpoint-every": 0}
    before = torch.get_num_threads()
    wanted = 3 if before != 3 else 2
    try:
        grid = InProcessGrid(2, raw, node_config=lambda pid: {"partition-id": pid, "num-partitions": 2,
                                                             "torch-threads": wanted})
        run_federation(raw, grid)
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)
    rounds = [json.loads(line) for line in (tmp_path / "r" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rounds[-1]["stat-torch-threads"] == wanted and rounds[-1]["stat-torch-threads-max"] == wanted


def test_a_bad_thread_setting_stops_the_node_naming_the_key(tmp_path):
    from client_app.app import node_settings
    from common.run.config import ConfigError, parse_run_config
    from client_app.registry import CLIENT_UPDATES

    cfg = parse_run_config({}, CLIENT_UPDATES)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1, "torch-threads": 0},
                      state=RecordDict(), run_config={})
    with pytest.raises(ConfigError, match="torch-threads"):
        node_settings(context, cfg)
