"""Device choice, tensor conversion and classifier evaluation, shared by server and clients."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.data.datasets import normalization


def resolve_device(requested: str) -> torch.device:
    """`auto` -> CUDA when available, else CPU; an explicit CUDA device must exist."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} requested but CUDA is not available on this machine; use 'auto' or 'cpu'")
    return torch.device(requested)


def to_model_input(images: torch.Tensor, dataset: str) -> torch.Tensor:
    """uint8 (N, H, W, C) -> normalised float32 (N, C, H, W) as the classifiers expect, on the images' device.

    Callers move the uint8 images to their device first and normalise there: a
    quarter of the float32 bytes cross the host-device link, and on a GPU the
    arithmetic is the GPU's (the data path of a ClientApp message, see
    benchmarks/local_steps.py). The constants are tensors, not Python scalars,
    so every device divides exactly rather than multiplying by a reciprocal.
    """
    mean, std = (torch.tensor(v, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
                 for v in normalization(dataset, images.shape[-1]))
    scale = torch.tensor(255.0, dtype=torch.float32, device=images.device)
    x = images.permute(0, 3, 1, 2).to(torch.float32) / scale
    return ((x - mean) / std).contiguous()


def normalisation_table(dataset: str, channels: int = 0) -> np.ndarray:
    """(C, 256) float32: `to_model_input`'s value for every uint8 level of every channel.

    Computed by `to_model_input` itself, so a lookup gives bitwise the same
    numbers as the arithmetic.
    """
    channels = channels or len(normalization(dataset, 1)[0])
    levels = torch.arange(256, dtype=torch.uint8).view(256, 1, 1, 1).expand(256, 1, 1, channels)
    return to_model_input(levels, dataset).view(256, channels).T.contiguous().numpy()


def _lookup_on_cpu(images: np.ndarray, dataset: str) -> torch.Tensor:
    """uint8 (N, H, W, C) -> normalised float32 (N, C, H, W) by table lookup: one `np.take` per channel (1.7x the
    CPU speed of one broadcast fancy index over all channels, the same values).

    The (N, H, W, C) values are permuted and made contiguous as before: with one channel that keeps the
    (N, H, W, C) strides, which make a convolution pick its channels-last kernels, so its sums (and every
    model's bits) stay what they were."""
    table = normalisation_table(dataset, images.shape[-1])
    values = np.empty(images.shape, dtype=np.float32)
    for channel in range(images.shape[-1]):
        np.take(table[channel], images[..., channel], out=values[..., channel], mode="clip")  # uint8: in range
    return torch.from_numpy(values).permute(0, 3, 1, 2).contiguous()


def as_tensors(images: np.ndarray, labels: np.ndarray, dataset: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images and int labels -> normalised float tensors on the device.

    On a CPU a table lookup (every message converts its whole partition: it
    was half of a trivial round's work); elsewhere the uint8 images cross to the
    device and are normalised there.
    """
    if device.type == "cpu":
        x = _lookup_on_cpu(np.asarray(images), dataset)
    else:
        # a copy of the uint8 images (a quarter of the float32 bytes): cached partitions load read-only
        x = to_model_input(torch.tensor(images).to(device), dataset)
    y = torch.from_numpy(labels.astype(np.int64)).to(device)
    return x, y


@torch.no_grad()
def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of a classifier on a dataset held as tensors."""
    if len(y) == 0:
        return float("nan"), float("nan")
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start:start + batch_size])
        target = y[start:start + batch_size]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    return loss_sum / len(y), correct / len(y)
