"""What every dataset source returns: shape facts, the arrays of the official splits, the known names.

The lowest floor of the data layer: torchvision's file formats (common/data/torchvision_files.py), Hugging
Face datasets (common/data/hf_datasets.py) and sites' own folders (common/data/site_data.py) all return these,
and common/data/datasets.py chooses among them by the dataset's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DatasetInfo:
    """Shape facts a model needs before any data is loaded."""

    name: str
    channels: int
    height: int
    width: int
    num_classes: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image as the models see it."""
        return (self.channels, self.height, self.width)


BUILTIN_INFO = {
    "mnist": DatasetInfo("mnist", 1, 28, 28, 10),
    "fashion-mnist": DatasetInfo("fashion-mnist", 1, 28, 28, 10),
    "cifar10": DatasetInfo("cifar10", 3, 32, 32, 10),
    "cifar100": DatasetInfo("cifar100", 3, 32, 32, 100),
}
DATASETS = tuple(BUILTIN_INFO)

# Normalisation per SPEC 3.1: grey images Normalize(0.5, 0.5); CIFAR the usual mean/std.
NORMALIZATION = {
    "mnist": ((0.5,), (0.5,)),
    "fashion-mnist": ((0.5,), (0.5,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class DatasetMissingError(FileNotFoundError):
    """The dataset's files are not in the data directory."""


@dataclass(frozen=True)
class DatasetArrays:
    """A dataset's official train and test splits as numpy arrays."""

    info: DatasetInfo
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def builtin_info(name: str) -> DatasetInfo:
    """Shape facts of one of the named torchvision datasets (DATASETS)."""
    try:
        return BUILTIN_INFO[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)} or hf:<repo>") from None


def normalization(name: str, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel: SPEC 3.1's for the named datasets, 0.5 and 0.5 for any other."""
    return NORMALIZATION.get(name, ((0.5,) * channels, (0.5,) * channels))


def default_data_dir() -> Path:
    """Where datasets are looked for when `data-dir` is empty."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedsynth" / "data"
