"""A user's model factory that cannot start a run is named, before any round (issue 54): NaN initial weights, and
an architecture that changes from one call to the next."""

from __future__ import annotations

import textwrap

import pytest
import torch

from common.data.types import DatasetInfo
from common.models.classifiers import build_model

INFO = DatasetInfo(name="site", num_classes=3, channels=1, height=8, width=8)

FACTORIES = '''
import itertools, torch
from torch import nn

def nan_init(num_classes, channels, image_size):
    model = nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, num_classes))
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    return model

_calls = itertools.count()

def growing(num_classes, channels, image_size):
    hidden = 4 + next(_calls)
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, hidden),
                         nn.Linear(hidden, num_classes))

def steady(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, num_classes))
'''


@pytest.fixture()
def factories(tmp_path, monkeypatch):
    (tmp_path / "site_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FEDSYNTH_ALLOWED_IMPORTS", "site_factories")  # the site permits it (common/imports.py)
    yield "site_factories"
    import sys

    sys.modules.pop("site_factories", None)


def test_nan_initial_weights_name_the_factory(factories):
    with pytest.raises(ValueError) as refused:
        build_model(f"{factories}:nan_init", INFO)
    message = str(refused.value)
    assert message.startswith(f"model '{factories}:nan_init': the factory returns a model whose initial weights")
    assert "'1.weight'" in message and "lr" not in message


def test_an_architecture_that_changes_per_call_is_named_not_a_checkpoint(factories):
    with pytest.raises(ValueError) as refused:
        build_model(f"{factories}:growing", INFO)
    message = str(refused.value)
    assert f"model '{factories}:growing': the factory builds a different architecture on each call" in message
    assert "'1.weight': shape (4, 64), float32 on one call, shape (5, 64), float32 on the next" in message
    assert "checkpoint" not in message


def test_a_steady_factory_builds_the_same_model_and_leaves_the_rng_as_it_was(factories):
    import importlib

    steady = importlib.import_module(factories).steady
    torch.manual_seed(0)
    expected_model, expected_draw = steady(3, 1, 8), torch.rand(3)
    torch.manual_seed(0)
    model = build_model(f"{factories}:steady", INFO)  # the first build checks with a second call, RNG forked
    assert torch.equal(torch.rand(3), expected_draw)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected_model.state_dict().values()))
