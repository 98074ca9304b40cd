"""Local training machinery shared by every client update rule.

A round of local training is: a seeded sequence of mini-batches, and for each a
gradient rule (plain, proximal, SAM, …) followed by an SGD step and an optional
correction (SCAFFOLD). The batch order depends only on (seed, round,
partition id), so one FedAvg round with a single client equals the same plain
SGD loop run in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from common.config import RunConfig
from common.diffusion import optimizer_kind
from common.optimizers import SGD, Adam, make_optimizer

# Fills .grad of the model's parameters for one batch and returns the batch loss.
GradientRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# The task's loss of a model on a batch: classification cross-entropy by default;
# the diffusion task and plug-ins such as FedCOG's KD term replace or wrap it.
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def classification_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a classifier on a labelled batch."""
    return F.cross_entropy(model(xb), yb)
# Runs after each optimizer step (SCAFFOLD's control-variate correction).
AfterStep = Callable[[], None]
# A plug-in's change of the task loss of a real batch, (model, task loss) -> training
# loss; FedCOG scales it and adds its KD term on a generated batch.
LossPlugin = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass
class LocalJob:
    """Everything a client update rule needs for one round on one node."""

    cfg: RunConfig
    server_round: int
    partition_id: int
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    device: torch.device
    incoming: RecordDict
    state: RecordDict
    loss_fn: LossFn = classification_loss
    global_params: list[torch.Tensor] = field(default_factory=list)
    loss_plugins: list[LossPlugin] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.global_params = [p.detach().clone() for p in self.model.parameters()]

    def add_loss_plugin(self, plugin: LossPlugin) -> None:
        """Route the task loss through a plug-in (FedCOG's KD term).

        Rules that use `loss_fn` get the plug-in without knowing of it; a rule that
        computes the task loss itself (MOON, from its projection head) passes it
        through `plugged_loss`.
        """
        inner = self.loss_fn
        self.loss_fn = lambda model, xb, yb: plugin(model, inner(model, xb, yb))
        self.loss_plugins.append(plugin)

    def plugged_loss(self, model: nn.Module, task_loss: torch.Tensor) -> torch.Tensor:
        """A task loss computed by the rule itself, passed through the job's plug-ins."""
        for plugin in self.loss_plugins:
            task_loss = plugin(model, task_loss)
        return task_loss

    @property
    def lr(self) -> float:
        """This round's local learning rate."""
        return self.cfg.local_lr(self.server_round)

    @property
    def num_steps(self) -> int:
        """K: local steps this round."""
        return local_step_count(len(self.y), self.cfg)


@dataclass
class LocalResult:
    """What a client update rule reports: metrics and extra records for the reply."""

    train_loss: float
    num_steps: int
    outgoing: dict[str, ArrayRecord] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def local_step_count(num_examples: int, cfg: RunConfig) -> int:
    """K = local-steps if set, else local-epochs full passes of ceil(n / batch) batches."""
    if cfg.local_steps > 0:
        return cfg.local_steps
    return cfg.local_epochs * max(1, -(-num_examples // cfg.batch_size))


def batch_indices(num_examples: int, cfg: RunConfig, server_round: int, partition_id: int) -> Iterator[np.ndarray]:
    """Index batches for one round: seeded epoch permutations, cut into batches, K in total."""
    rng = np.random.default_rng([cfg.seed, server_round, partition_id])
    remaining = local_step_count(num_examples, cfg)
    while remaining > 0:
        order = rng.permutation(num_examples)
        for start in range(0, num_examples, cfg.batch_size):
            if remaining == 0:
                return
            yield order[start:start + cfg.batch_size]
            remaining -= 1


def plain_rule(job: "LocalJob") -> GradientRule:
    """Plain gradient of the task's loss."""

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = job.loss_fn(job.model, xb, yb)
        loss.backward()
        return loss.detach()

    return rule


def local_optimizer(model: nn.Module, cfg: RunConfig, lr: float) -> SGD | Adam:
    """Local SGD (or Adam, `local-optimizer`: Adam by default for the diffusion task); a new one each round,
    so no optimizer state carries over. `clip-grad-norm` clips every step's gradient (0: off)."""
    return make_optimizer(model.parameters(), optimizer_kind(cfg), lr, cfg.momentum, cfg.weight_decay,
                          cfg.clip_grad_norm)


def run_local_steps(job: LocalJob, rule: GradientRule, after_step: AfterStep | None = None) -> LocalResult:
    """Train `job.model` in place for K steps with the given gradient rule."""
    model = job.model
    model.train()
    optimizer = local_optimizer(model, job.cfg, job.lr)
    total, steps = 0.0, 0
    for idx in batch_indices(len(job.y), job.cfg, job.server_round, job.partition_id):
        index = torch.from_numpy(idx).to(job.device)
        optimizer.zero_grad(set_to_none=True)
        loss = rule(job.x[index], job.y[index])
        optimizer.step()
        if after_step is not None:
            after_step()
        total += float(loss)
        steps += 1
    return LocalResult(train_loss=total / max(steps, 1), num_steps=steps)
