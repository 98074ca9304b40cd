"""Trajectory-matching distillation of a synthetic set on the server (SPEC 4.3; FedSynSAM Sec. IV-B).

The server keeps the global models `w^0 .. w^R` of the first R rounds. It
learns `D_syn = {X, Y}` (Y uniform over the classes, `ipc` per class; X from
Gaussian noise) and a step size `alpha` such that `s` steps of gradient descent
on D_syn started at `w^r` land near `w^{r+s}`:

    w_hat = A(X, Y, w^r, alpha, s),   L = ||w_hat - w^{r+s}||^2 / ||w^r - w^{r+s}||^2

(matching trajectories, Cazenavette et al. 2022; SPEC 4.3). FedSynSAM's eq. 9
is the unnormalised ||w_hat - w^{r+s}||^2 (`matching-loss = "paper"`): it
weighs each segment by its squared length and scales alpha's gradient by it. The inner loop runs the
model functionally (`torch.func.functional_call`) with `create_graph=True`, so
`L` is differentiated through all s steps with respect to X and alpha. Only
the global trajectory is used: nothing beyond what FedAvg already gives the
server. The normalisation makes segments of different lengths comparable; a
loss of 1 is as far from the target as not moving at all.

What the loss can reach depends on the trajectory. Under an unbiased
compressor the global step is `mean_i Delta_i` plus zero-mean compression
noise that nothing at `w^r` can predict, so the normalised loss cannot fall
below the noise's share of `||w^{r+s} - w^r||^2`. With 4-bit qsgd (s = 7
levels per tensor) on the cpu preset (mlp, Path(1), 10 clients) that share is
about 98-99 %: the loss ends near 0.99 although the synthetic gradient lines
up with the true global gradient far better than a local one does (see
benchmarks/results/fedsynsam-distillation.md). On an uncompressed trajectory
of the same setup the same settings bring it from 1.06 to 0.30. This floor
does not explain why FedSynSAM ties FedSAM: it ties without compression too
(issue 16; docs/fedsynsam.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common.logger import log
from torch import nn
from torch.func import functional_call

from common.algorithms.synsam_settings import SynSAMSettings
from common.run.progress import Progress
from common.records import Weights, load_weights, model_weights

Tensors = dict[str, torch.Tensor]


@dataclass
class DistillResult:
    """The synthetic set, the learned step size and how well the trajectory is matched."""

    x: np.ndarray
    y: np.ndarray
    alpha: float
    start_loss: float  # mean matching loss (the configured one) over all segments, before
    end_loss: float    # ... and after distillation
    losses: list[float] = field(default_factory=list)  # the sampled segment's loss, per iteration


def uniform_labels(num_classes: int, ipc: int) -> np.ndarray:
    """Y: `ipc` examples of every class, class-major."""
    return np.repeat(np.arange(num_classes, dtype=np.int64), ipc)


def split_weights(model: nn.Module, weights: Mapping[str, np.ndarray], device: torch.device) -> tuple[Tensors, Tensors]:
    """(parameters, buffers) of a state dict as tensors on the device, by the model's names: copies, never views.

    The unrolled model runs in train mode, so its BatchNorm layers write their running
    statistics and `num_batches_tracked` into the buffers they are given. `torch.as_tensor`
    of a numpy array on the CPU is a view, and those writes landed in the stored trajectory
    (its `w^0` counted 64 batches after one distillation); a copy keeps the trajectory as it was.
    """
    names = {name for name, _ in model.named_parameters()}
    params = {k: torch.tensor(np.asarray(v), device=device) for k, v in weights.items() if k in names}
    buffers = {k: torch.tensor(np.asarray(v), device=device) for k, v in weights.items() if k not in names}
    return params, buffers


def unroll(
    model: nn.Module, start: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor,
    alpha: torch.Tensor, steps: int, create_graph: bool = True,
) -> Tensors:
    """`steps` full-batch gradient steps of cross-entropy on (x, y) from `start`, as a differentiable function.

    With `create_graph`, the result depends differentiably on x and alpha
    through every step (second-order terms included).
    """
    params = {name: p.detach().requires_grad_(True) for name, p in start.items()}
    for _ in range(steps):
        loss = F.cross_entropy(functional_call(model, {**params, **buffers}, (x,)), y)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)
        params = {name: p - alpha * g for (name, p), g in zip(params.items(), grads)}
    return params


def matching_loss(w_hat: Tensors, w_start: Tensors, w_target: Tensors, normalized: bool = True) -> torch.Tensor:
    """||w_hat - w_target||^2 / ||w_start - w_target||^2 over all parameters together.

    With `normalized` False, eq. 9's ||w_hat - w_target||^2 alone.
    """
    num = sum(torch.sum((w_hat[n] - w_target[n]) ** 2) for n in w_target)
    if not normalized:
        return num
    den = sum(torch.sum((w_start[n] - w_target[n]) ** 2) for n in w_target)
    return num / (den + 1e-12)


def segment_starts(trajectory_length: int, steps: int) -> list[int]:
    """All r with w^r and w^{r+s} in a trajectory of `trajectory_length` models."""
    return list(range(max(trajectory_length - steps, 0)))


def mean_matching_loss(
    model: nn.Module, trajectory: Sequence[tuple[Tensors, Tensors]], x: torch.Tensor, y: torch.Tensor,
    alpha: torch.Tensor, steps: int, normalized: bool = True,
) -> float:
    """The matching loss averaged over every segment of the trajectory (no graph kept)."""
    losses = []
    for r in segment_starts(len(trajectory), steps):
        (start, buffers), (target, _) = trajectory[r], trajectory[r + steps]
        w_hat = unroll(model, start, buffers, x, y, alpha.detach(), steps, create_graph=False)
        losses.append(float(matching_loss({k: v.detach() for k, v in w_hat.items()}, start, target, normalized)))
    return float(np.mean(losses)) if losses else math.nan


def distill(
    model: nn.Module, trajectory: Sequence[Mapping[str, np.ndarray]], num_classes: int,
    input_shape: tuple[int, ...], settings: SynSAMSettings, device: torch.device, seed: int = 0,
) -> DistillResult:
    """Learn D_syn and alpha by matching segments of the global trajectory (M iterations).

    `settings` is the run config's FedSynSAM part (`synthetic-ipc`, `distill-*`, `matching-loss`), its `auto`/0
    values resolved by `input_shape`'s channels (`distillation_resolved`); `seed` seeds the noise and segments.
    """
    if len(trajectory) < 2:
        raise ValueError(f"distillation needs at least 2 global models, got {len(trajectory)}")
    settings = settings.distillation_resolved(grey=input_shape[0] == 1)
    steps = settings.distill_inner_steps
    if steps >= len(trajectory):
        log(WARNING, "distillation: %d inner steps need %d global models but the trajectory has %d; using %d steps",
            steps, steps + 1, len(trajectory), len(trajectory) - 1)
        steps = len(trajectory) - 1
    model = model.to(device)
    tensors = [split_weights(model, w, device) for w in trajectory]
    generator = torch.Generator().manual_seed(seed)
    y_np = uniform_labels(num_classes, settings.synthetic_ipc)
    y = torch.from_numpy(y_np).to(device)
    x = torch.randn((len(y_np), *input_shape), generator=generator).to(device).requires_grad_(True)
    alpha = torch.tensor(settings.distill_alpha_init, device=device, requires_grad=True)
    if settings.distill_optimizer == "adam":
        x_opt: torch.optim.Optimizer = torch.optim.Adam([x], lr=settings.distill_lr)
    else:
        x_opt = torch.optim.SGD([x], lr=settings.distill_lr, momentum=0.5)
    alpha_opt = torch.optim.SGD([alpha], lr=settings.distill_alpha_lr)
    starts = segment_starts(len(tensors), steps)
    rng = np.random.default_rng([seed, 4])

    progress = Progress("distillation", settings.distill_iterations, "iterations")
    progress.start(f" of {steps} unrolled steps each, learning {len(y_np)} synthetic images "
                   f"({settings.synthetic_ipc} per class)")
    start_loss = mean_matching_loss(model, tensors, x.detach(), y, alpha, steps, settings.normalized_matching)
    losses = []
    for _ in range(settings.distill_iterations):
        r = int(rng.choice(starts))
        (w_start, buffers), (w_target, _) = tensors[r], tensors[r + steps]
        w_hat = unroll(model, w_start, buffers, x, y, alpha, steps, create_graph=True)
        loss = matching_loss(w_hat, w_start, w_target, settings.normalized_matching)
        x_opt.zero_grad(set_to_none=True)
        alpha_opt.zero_grad(set_to_none=True)
        loss.backward()
        x_opt.step()
        alpha_opt.step()
        losses.append(float(loss.detach()))
        progress.advance(1)
    end_loss = mean_matching_loss(model, tensors, x.detach(), y, alpha, steps, settings.normalized_matching)
    log(INFO, "distillation: %d iterations, %d segments of %d steps, matching loss %.4f -> %.4f, alpha %.5f",
        settings.distill_iterations, len(starts), steps, start_loss, end_loss, float(alpha.detach()))
    return DistillResult(
        x=x.detach().cpu().numpy().astype(np.float32), y=y_np, alpha=float(alpha.detach()),
        start_loss=start_loss, end_loss=end_loss, losses=losses,
    )


# ----- the real-image oracle: a diagnostic, not the method -------------------------------


def oracle_indices(labels: np.ndarray, num_classes: int, ipc: int, seed: int) -> np.ndarray:
    """Indices of `ipc` training examples of every class, class-major, drawn without replacement with `seed`.

    The order matches `uniform_labels`, so `labels[indices]` equals `uniform_labels(num_classes, ipc)`.
    """
    rng = np.random.default_rng([seed, 46])
    chosen = []
    for label in range(num_classes):
        pool = np.flatnonzero(labels == label)
        if len(pool) < ipc:
            raise ValueError(f"real-oracle: class {label} has {len(pool)} training examples, fewer than "
                             f"synthetic-ipc = {ipc}")
        chosen.append(np.sort(rng.choice(pool, size=ipc, replace=False)))
    return np.concatenate(chosen).astype(np.int64)


def real_oracle(
    model: nn.Module, trajectory: Sequence[Mapping[str, np.ndarray]], x: np.ndarray, y: np.ndarray,
    settings: SynSAMSettings, device: torch.device,
) -> DistillResult:
    """D_syn replaced by real training images (`x`, `y`: model input and labels, `synthetic-ipc` per class).

    A diagnostic, **not FedSynSAM**: a federated server holds no training data. It asks whether
    FedSynSAM would gain with a perfect synthetic set, so that a shortfall can be put down to the
    distillation or to the ascent rule (eq. 14). Nothing is learned: alpha stays at its start value, and
    the start and end losses are both the set's matching loss on the trajectory at that alpha (how well
    real images reproduce the global steps, comparable with a distilled set's end loss).
    """
    settings = settings.distillation_resolved(grey=np.asarray(x).shape[1] == 1)
    steps = min(settings.distill_inner_steps, len(trajectory) - 1)
    model = model.to(device)
    tensors = [split_weights(model, w, device) for w in trajectory]
    alpha = torch.tensor(settings.distill_alpha_init, device=device)
    loss = mean_matching_loss(model, tensors, torch.as_tensor(x, device=device), torch.as_tensor(y, device=device),
                              alpha, steps, settings.normalized_matching)
    log(INFO, "real-oracle (a diagnostic, not the method): %d real training images as D_syn, matching loss %.4f "
        "at alpha %.5f", len(y), loss, settings.distill_alpha_init)
    return DistillResult(x=np.asarray(x, dtype=np.float32), y=np.asarray(y, dtype=np.int64),
                         alpha=settings.distill_alpha_init,
                         start_loss=loss, end_loss=loss)


def train_on_synthetic(
    model: nn.Module, weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray,
    epochs: int, lr: float, batch_size: int, rng: np.random.Generator, device: torch.device,
) -> Weights:
    """DynaFed's server step: `epochs` of Adam on D_syn from `weights`; returns the new weights."""
    load_weights(model, weights)
    model = model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    xs, ys = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(ys))).to(device)
        for start in range(0, len(ys), batch_size):
            index = order[start:start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs[index]), ys[index]).backward()
            optimizer.step()
    return model_weights(model)
