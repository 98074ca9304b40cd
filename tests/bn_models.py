"""Site model factories with BatchNorm, for `model = "tests.bn_models:<factory>"` (issue 44: any PyTorch model).

Each is called as fedsynth calls a user's factory, `factory(num_classes=, channels=, image_size=)`.
Their state dicts hold what fedsynth's built-in models do not: BatchNorm's float running mean and
variance and its 0-d int64 `num_batches_tracked`.
"""

from __future__ import annotations

from torch import nn


def bn_cnn(num_classes: int, channels: int, image_size: int) -> nn.Module:
    """A small CNN as `flwr new`'s PyTorch template writes one, with BatchNorm after each convolution."""
    side = image_size // 4
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * side * side, 32), nn.BatchNorm1d(32), nn.ReLU(),
        nn.Linear(32, num_classes),
    )


def resnet18(num_classes: int, channels: int, image_size: int) -> nn.Module:
    """torchvision's `resnet18(num_classes=...)` unchanged but for its first convolution, which takes `channels`.

    Everything else (BatchNorm in every block, the 7x7 stride-2 stem and max-pool) is torchvision's,
    so a 28x28 image shrinks to 1x1 by the last stage: cheap enough for a test on a CPU.
    """
    from torchvision.models import resnet18 as torchvision_resnet18

    net = torchvision_resnet18(num_classes=num_classes)
    if channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


def bn_cnn_with_own_buffer(num_classes: int, channels: int, image_size: int) -> nn.Module:
    """`bn_cnn` plus a float buffer of the site's own (`input_scale`), whose name says nothing of a buffer."""
    import torch

    model = bn_cnn(num_classes, channels, image_size)
    model.register_buffer("input_scale", torch.tensor(1.0))
    return model
