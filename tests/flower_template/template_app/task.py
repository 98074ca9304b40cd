"""template-app: Training and evaluation, as `flwr new`'s PyTorch template has them (its CIFAR-10 loading
replaced by a small local slice of Fashion-MNIST's IDX files, so that it runs offline in a test)."""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz'), with BatchNorm after each convolution
    (`batch_norm=False`: none, a model without buffers)."""

    def __init__(self, num_classes: int = 10, channels: int = 1, image_size: int = 28, batch_norm: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.bn1 = nn.BatchNorm2d(6) if batch_norm else nn.Identity()
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16) if batch_norm else nn.Identity()
        side = ((image_size - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * side * side, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = x.flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def make_net(num_classes: int = 10, channels: int = 1, image_size: int = 28) -> Net:
    """The model factory fedsynth's server-side distillation builds (`model = "template_app.task:make_net"`)."""
    return Net(num_classes, channels, image_size)


def initial_net(batch_norm: bool = True) -> Net:
    """The global model of round 0 (seeded: a decentralized node starts from it without receiving it)."""
    torch.manual_seed(0)
    return Net(batch_norm=batch_norm)


def _idx(path: Path) -> np.ndarray:
    data = gzip.decompress(path.read_bytes())
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


@lru_cache(maxsize=2)
def _split(data_dir: str, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    prefix = "train" if train else "t10k"
    x = _idx(Path(data_dir) / f"{prefix}-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = _idx(Path(data_dir) / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
    return (torch.from_numpy(x).unsqueeze(1) - 0.5) / 0.5, torch.from_numpy(y)


def load_data(partition_id: int, num_partitions: int, data_dir: str, examples: int,
              batch_size: int) -> tuple[DataLoader, DataLoader]:
    """This node's slice: `examples` training and a quarter as many test examples, disjoint across nodes."""
    x, y = _split(data_dir, True)
    xt, yt = _split(data_dir, False)
    start, test_size = partition_id * examples, max(examples // 4, 1)
    train = TensorDataset(x[start:start + examples], y[start:start + examples])
    test = TensorDataset(xt[partition_id * test_size:(partition_id + 1) * test_size],
                         yt[partition_id * test_size:(partition_id + 1) * test_size])
    generator = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator), DataLoader(test, batch_size=64)


def central_test_set(data_dir: str, count: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _split(data_dir, False)
    return x[-count:], y[-count:]


def train(net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device: str) -> float:
    """Train the model on the training set (the template's loop, SGD here); returns the average loss."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: DataLoader, device: str) -> tuple[float, float]:
    """Validate the model on the test set; returns (loss, accuracy)."""
    net.to(device)
    net.eval()
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += criterion(outputs, labels.to(device)).item()
            correct += (torch.max(outputs.data, 1)[1] == labels.to(device)).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
