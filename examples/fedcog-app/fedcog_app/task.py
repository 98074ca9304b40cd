"""The app's own model and data: a small MLP on Fashion-MNIST, a few hundred label-skewed examples per node.

The data are the IDX files of the Debian package (`data-dir`), read with numpy.
Node `partition-id` of `num-partitions` draws its class mix from a seeded
Dirichlet(`dirichlet-alpha`) over the ten classes (the same draw on every node),
then `examples-per-node` training and a quarter as many local test examples
with that mix: the label skew FedCOG is built for.
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 10
INPUT_SHAPE = (1, 28, 28)
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel mean and standard deviation


class Net(nn.Module):
    """A two-layer MLP: small enough that a round takes a second on a CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def initial_model(seed: int) -> Net:
    """The global model of round 0, the same for a given seed."""
    torch.manual_seed(seed)
    return Net()


def _idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped) as a numpy array: images (n, 28, 28) uint8 or labels (n,) uint8."""
    data = gzip.decompress(path.read_bytes())
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


@lru_cache(maxsize=2)
def load_split(data_dir: str, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole train or test split as normalised (n, 1, 28, 28) float32 images and int64 labels."""
    prefix = "train" if train else "t10k"
    images = _idx(Path(data_dir) / f"{prefix}-images-idx3-ubyte.gz")
    labels = _idx(Path(data_dir) / f"{prefix}-labels-idx1-ubyte.gz")
    x = (torch.from_numpy(images.astype(np.float32) / 255.0) - MEAN) / STD
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def _skewed_indices(labels: np.ndarray, mix: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` example indices whose labels follow the class mix `mix`."""
    wanted = rng.choice(NUM_CLASSES, size=count, p=mix)
    by_class = {c: rng.permutation(np.flatnonzero(labels == c)) for c in range(NUM_CLASSES)}
    return np.array([by_class[c][i] for c, i in zip(wanted, _ranks(wanted))], dtype=np.int64)


def _ranks(values: np.ndarray) -> list[int]:
    """How many earlier entries share each entry's value (picks distinct examples per class)."""
    seen: dict[int, int] = {}
    ranks = []
    for v in values.tolist():
        ranks.append(seen.get(v, 0))
        seen[v] = ranks[-1] + 1
    return ranks


def load_data(partition_id: int, num_partitions: int, data_dir: str, examples: int, alpha: float, seed: int,
              batch_size: int) -> tuple[DataLoader, DataLoader]:
    """This node's train and local test loaders (the train loader reshuffles with a seeded generator)."""
    mix = np.random.default_rng(seed).dirichlet([alpha] * NUM_CLASSES, size=num_partitions)[partition_id]
    rng = np.random.default_rng([seed, partition_id])
    x_train, y_train = load_split(data_dir, True)
    x_test, y_test = load_split(data_dir, False)
    train = _skewed_indices(y_train.numpy(), mix, examples, rng)
    test = _skewed_indices(y_test.numpy(), mix, max(examples // 4, 1), rng)
    generator = torch.Generator().manual_seed(seed * 1000 + partition_id)
    trainloader = DataLoader(TensorDataset(x_train[train], y_train[train]), batch_size=batch_size, shuffle=True,
                             generator=generator)
    testloader = DataLoader(TensorDataset(x_test[test], y_test[test]), batch_size=256)
    return trainloader, testloader


def central_test_set(data_dir: str, count: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `count` examples of the test split, balanced enough for a central accuracy."""
    x, y = load_split(data_dir, False)
    return x[:count], y[:count]


def loader_tensors(loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """All of a loader's examples as two tensors."""
    dataset = loader.dataset
    return dataset.tensors[0], dataset.tensors[1]
