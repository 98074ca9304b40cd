"""FedCOG in Flower's deployment engine: a SuperLink and 2 SuperNodes on loopback (issue 4).

In deployment every ClientApp message runs in a fresh process, so the previous
local model that FedCOG's disagreement term needs in round 2 must come back
from `Context.state`, not from anything in memory.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_fedcog_runs_on_two_supernodes_and_keeps_its_previous_model_in_node_state(tmp_path, tiny_data_dir, flower_app,
                                                                                  two_node_federation):
    config = " ".join([
        f'data-dir="{tiny_data_dir}"', f'cache-dir="{tmp_path / "cache"}"', f'results-dir="{tmp_path / "results"}"',
        'run-name="run"', 'algorithm="fedcog"', "num-server-rounds=2", "cog-start-round=2", "gen-steps=3",
        "gen-budget=16", "local-steps=3", "batch-size=16", "node-wait-timeout=120.0",
    ])
    result = two_node_federation.run(flower_app, config)
    logs = result.stdout[-3000:] + result.stderr[-2000:] + two_node_federation.log_tails()
    folder = tmp_path / "results" / "run"
    assert (folder / "summary.json").is_file(), logs
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r["answered"] == 2 for r in rounds[1:]), logs
    assert "stat-cog-generated" not in rounds[1]
    # round 2 ran in new ClientApp processes, yet both nodes had their round-1 model
    assert rounds[2]["stat-cog-generated"] > 0 and rounds[2]["stat-cog-disagreement"] == 1.0
    assert json.loads((folder / "summary.json").read_text())["num-nodes"] == 2
    # the node with partition 0 wrote its grid of generated inputs (same host here)
    assert (folder / "fedcog-generated.png").is_file()
