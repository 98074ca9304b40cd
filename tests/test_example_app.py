"""examples/fedcog-app, a Flower app built on fedsynth.strategies and fedsynth.client, runs to completion.

It runs in Flower's simulation engine through the same runtime entry as
`flwr run` (`fedsynth.simulation._simulate`: the app's pyproject config fused with
the overrides), on the learnable Fashion-MNIST stand-in of conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "fedcog-app"
pytestmark = pytest.mark.slow


def test_the_fedcog_example_app_trains_to_completion_in_the_simulation_engine(tmp_path, tiny_data_dir, monkeypatch):
    from fedsynth.simulation import _simulate

    monkeypatch.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the engine's workers get the driver's sys.path
    out = tmp_path / "result"
    overrides = {"num-server-rounds": 2, "examples-per-node": 200, "gen-steps": 5, "gen-budget": 32,
                 "data-dir": str(tiny_data_dir / "FashionMNIST" / "raw"), "result-dir": str(out)}
    _simulate(EXAMPLE, overrides, num_supernodes=2, cpus_per_client=1, gpus_per_client=0.0)

    result = json.loads((out / "result.json").read_text())
    central = result["central"]
    assert sorted(central) == ["0", "1", "2"]  # evaluate_fn before round 1 and after each round
    assert central["2"]["central-accuracy"] > 0.3  # ten classes: chance is 0.1
    assert central["2"]["central-accuracy"] > central["0"]["central-accuracy"]
    assert sorted(result["train"]) == ["1", "2"] and result["train"]["2"]["train-loss"] > 0
    from fedcog_app.task import initial_model

    final = torch.load(out / "final_model.pt")
    initial = initial_model(0).state_dict()
    assert final.keys() == initial.keys()
    assert all(not torch.equal(final[name], initial[name]) for name in initial)
