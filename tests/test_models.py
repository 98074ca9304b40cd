"""Model options of issue 35: McMahan's 2NN (`mlp2`) and resnet18's GroupNorm group count (`gn-groups`)."""

from __future__ import annotations

import pytest
import torch

from common.run.config import RunConfig
from common.data.datasets import dataset_info
from common.models.classifiers import build_model
from common.run.task import make_model


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_mlp2_is_mcmahans_2nn_with_199210_parameters() -> None:
    """784*200 + 200 + 200*200 + 200 + 200*10 + 10 = 199,210; `mlp` (one hidden layer) has 159,010."""
    info = dataset_info("fashion-mnist")
    mlp2 = build_model("mlp2", info)
    assert _count(mlp2) == 199_210
    assert _count(build_model("mlp", info)) == 159_010
    linears = [m for m in mlp2.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 200), (200, 200), (200, 10)]
    assert mlp2(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert mlp2.features(torch.zeros(3, 1, 28, 28)).shape == (3, 200)
    with pytest.raises(ValueError, match="'mlp2' takes 1x28x28"):
        build_model("mlp2", dataset_info("cifar10"))


def test_resnet18_group_count_comes_from_the_config() -> None:
    info = dataset_info("cifar10")

    def groups(model: torch.nn.Module) -> set[int]:
        return {m.num_groups for m in model.modules() if isinstance(m, torch.nn.GroupNorm)}

    assert groups(build_model("resnet18", info)) == {2}  # the project's default
    paper = make_model(RunConfig(dataset="cifar10", model="resnet18", gn_groups=32))
    assert groups(paper) == {32}  # DisPFL's code
    # the group count changes how channels are normalised, not the parameter count
    assert _count(paper) == _count(build_model("resnet18", info))
    with pytest.raises(ValueError, match="divides 64"):
        build_model("resnet18", info, gn_groups=3)
