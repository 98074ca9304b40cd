"""A model must fit the task: its output width is the federation's class count, on the server and every node (issue 47).

Before, a user's model with 12 outputs for 10 classes trained silently (a site reached 0.30, status ok) and
one with 7 failed mid-round with "IndexError: Target 6 is out of bounds".
"""

from __future__ import annotations

import pytest

WIDTH_MODELS = '''
from torch import nn


def seven(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, 7))


def twelve(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, 12))
'''


@pytest.fixture()
def width_models(tmp_path, monkeypatch):
    package = tmp_path / "widthpkg"
    package.mkdir()
    (package / "widthmodels.py").write_text(WIDTH_MODELS)
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("FEDSYNTH_ALLOWED_IMPORTS", "widthmodels")  # the site permits it (common/imports.py)
    return "widthmodels"


@pytest.mark.parametrize("factory, outputs", [("seven", 7), ("twelve", 12)])
def test_a_model_with_the_wrong_output_width_is_refused_on_the_server_before_round_1(
        tmp_path, tiny_data_dir, width_models, factory, outputs):
    from common.run.config import ConfigError
    from fedsynth.inprocess import InProcessGrid, run_federation

    model = f"{width_models}:{factory}"
    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "r"),
           "run-name": "run", "num-server-rounds": 1, "local-steps": 2, "model": model}
    grid = InProcessGrid(2, raw)
    with pytest.raises(ConfigError) as caught:
        run_federation(raw, grid)
    assert f"model '{model}': it has {outputs} outputs but the federation has 10 classes" in str(caught.value)
    assert not [m for m in grid.sent if m.metadata.message_type == "train"]  # refused before round 1


@pytest.mark.parametrize("factory, outputs", [("seven", 7), ("twelve", 12)])
def test_a_model_with_the_wrong_output_width_is_refused_on_a_node_at_the_handshake(
        tmp_path, tiny_data_dir, width_models, factory, outputs):
    from flwr.app import Message, RecordDict

    from fedsynth.inprocess import InProcessGrid

    model = f"{width_models}:{factory}"
    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "cache"), "model": model}
    grid = InProcessGrid(1, raw)
    [reply] = grid.send_and_receive([Message(RecordDict(), dst_node_id=1000, message_type="query.handshake")])
    assert reply.has_error()
    assert f"model '{model}': it has {outputs} outputs but the federation has 10 classes" in reply.error.reason
