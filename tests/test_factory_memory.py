"""A user's model factory that cannot allocate its model is refused naming the model and its size
(common/models/classifiers.py `build_user_model`), not a raw MemoryError from deep inside the checks."""

from __future__ import annotations

import sys
import textwrap

import pytest

from common.data.types import DatasetInfo
from common.imports import ENV_VAR
from common.models.classifiers import build_model, is_allocation_failure

INFO = DatasetInfo(name="site", num_classes=3, channels=1, height=8, width=8)

FACTORIES = '''
import itertools
from torch import nn

def too_big(num_classes, channels, image_size):
    raise MemoryError()

_calls = itertools.count()

def second_build_fails(num_classes, channels, image_size):
    if next(_calls) > 0:  # the check's second build: torch's CPU allocator gives up
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 2000000000 bytes")
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, 1000), nn.Linear(1000, num_classes))

class Huge(nn.Module):
    def __init__(self, channels, image_size, num_classes):
        super().__init__()
        self.layer = nn.Linear(channels * image_size * image_size, num_classes)

    def forward(self, x):
        raise MemoryError()

def forward_fails(num_classes, channels, image_size):
    return Huge(channels, image_size, num_classes)
'''


@pytest.fixture()
def factories(tmp_path, monkeypatch):
    (tmp_path / "memory_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "memory_factories")
    yield "memory_factories"
    sys.modules.pop("memory_factories", None)


def test_a_factory_that_cannot_allocate_is_refused_naming_the_model(factories) -> None:
    with pytest.raises(ValueError) as refused:
        build_model(f"{factories}:too_big", INFO)
    text = str(refused.value)
    assert text.startswith(f"model '{factories}:too_big': the factory could not allocate its model"), text
    assert "too_big(num_classes=3, channels=1, image_size=8)" in text and "MemoryError" in text


@pytest.mark.parametrize("factory, size", [
    # 64*1000 + 1000 + 1000*3 + 3 = 68,003 parameters, float32: 0.00 GiB
    ("second_build_fails", "68,003 parameters, 0.00 GiB of arrays"),
    ("forward_fails", "195 parameters, 0.00 GiB of arrays"),  # 64*3 + 3
])
def test_a_model_whose_checks_cannot_allocate_is_refused_naming_it_and_its_size(factories, factory, size) -> None:
    with pytest.raises(ValueError) as refused:
        build_model(f"{factories}:{factory}", INFO)
    text = str(refused.value)
    assert text.startswith(f"model '{factories}:{factory}': its model ({size}) was built once"), text


def test_which_errors_are_allocation_failures() -> None:
    import torch

    assert is_allocation_failure(MemoryError()) and is_allocation_failure(torch.OutOfMemoryError("CUDA"))
    assert is_allocation_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to"))
    assert not is_allocation_failure(RuntimeError("size mismatch")) and not is_allocation_failure(ValueError())
