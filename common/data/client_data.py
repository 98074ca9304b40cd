"""One client's local data: its train and test split, how a partition is cut into them, and the cache's files.

Shared by the simulated partitions (common/data/partition.py) and sites' own folders (common/data/site_data.py),
which both hand a ClientApp a `ClientData`.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ClientData:
    """One client's local train and test split (uint8 images, int64 labels)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def label_counts(self, num_classes: int) -> np.ndarray:
        """Histogram of the local training labels."""
        return np.bincount(self.y_train, minlength=num_classes)


def split_local(indices: np.ndarray, test_fraction: float, seed: int, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a partition into local train/test index sets (seeded per partition)."""
    rng = np.random.default_rng([seed, partition_id, 7])
    shuffled = rng.permutation(indices)
    num_test = int(round(len(shuffled) * test_fraction))
    if len(shuffled) - num_test < 1:
        num_test = len(shuffled) - 1
    return np.sort(shuffled[num_test:]), np.sort(shuffled[:num_test])


def default_cache_dir() -> Path:
    """Where partitions are cached when `cache-dir` is empty."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedsynth" / "partitions"


def write_atomic_npz(path: Path, **arrays: np.ndarray) -> None:
    # Two simulated clients may build the cache at once: each writes a temp file
    # and renames it, so a reader never sees a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(tmp, path)
