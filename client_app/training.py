"""Local training machinery shared by every client update rule.

A round of local training is: a seeded sequence of mini-batches, and for each a
gradient rule (plain, proximal, SAM, …) followed by an SGD step and an optional
correction (SCAFFOLD). The batch order depends only on (seed, round,
partition id), so one FedAvg round with a single client equals the same plain
SGD loop run in one process.

Two layers: `train_steps` runs a gradient rule over any iterable of
`(inputs, labels)` batches (a torch `DataLoader`, or `tensor_batches`) with
an optimizer described by plain values (`LocalOptimizer`); it is what a
Flower developer's own ClientApp calls through `fedsynth.client`. `LocalJob`
and `run_local_steps` adapt a fedsynth run (its config, round and seeded
batch order) to that same loop.

Where a `LocalJob`'s values come from is the contract a Flower developer's
client keeps (docs/library.md, "What each strategy sends and expects"):
- from the train message's config (`LocalJob.setting`, `LocalJob.lr`,
  `LocalJob.recipe`), checked by the ClientApp before the job is built: the
  round's learning rate (the server's schedule computes it once) and the
  local training recipe (the step count, batch, momentum, weight decay,
  clipping and optimizer), together the local training group's value
  (common/algorithms/local_training_settings.py), the uplink codec and every
  setting of the algorithm's rule (its settings group, `LocalJob.rule_settings`:
  SAM's radius, FedProx's weight, FedCOG's, ...: `client_keys`);
- from the run config (`LocalJob.cfg`): the task (dataset, model, seed);
- from the node: its data, device and threads (client_app/app.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from common.keys import config_value
from common.algorithms.local_training_settings import LocalTrainingSettings
from common.run.client_settings import own_message_settings, rule_settings
from common.run.config import RunConfig
from common.models.diffusion import optimizer_kind
from common.algorithms.optimizers import SGD, Adam, make_optimizer

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
# What local training iterates over: (inputs, labels) pairs, e.g. a torch DataLoader.
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]
# A plug-in's change of the task loss of a real batch, (model, task loss) -> training
# loss; FedCOG scales it and adds its KD term on a generated batch.
LossPlugin = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def with_loss_plugin(loss_fn: LossFn, plugin: LossPlugin) -> LossFn:
    """`loss_fn` passed through a plug-in: (model, xb, yb) -> plugin(model, loss_fn(model, xb, yb))."""
    return lambda model, xb, yb: plugin(model, loss_fn(model, xb, yb))


@dataclass(frozen=True)
class LocalOptimizer:
    """The local optimizer as plain values: SGD with heavy-ball momentum, or Adam (`kind`).

    A new optimizer is built for every call of a training function, so no
    optimizer state carries over between rounds (common/algorithms/optimizers.py has
    why fedsynth's own SGD and Adam replace torch.optim's, bitwise equal).
    `clip_grad_norm` clips each step's gradient to that global L2 norm (0: off).
    """

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    kind: str = "sgd"
    clip_grad_norm: float = 0.0

    def build(self, params: Iterable[torch.Tensor]) -> SGD | Adam:
        """A fresh optimizer over `params`."""
        return make_optimizer(params, self.kind, self.lr, self.momentum, self.weight_decay, self.clip_grad_norm)


@dataclass
class TrainResult:
    """What a local training function reports: the mean batch loss, the step count, rule metrics."""

    train_loss: float
    num_steps: int
    metrics: dict[str, float] = field(default_factory=dict)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's parameters (batches are moved there)."""
    return next(model.parameters()).device


def train_steps(model: nn.Module, batches: Batches, rule: GradientRule, optimizer: LocalOptimizer,
                after_step: AfterStep | None = None) -> TrainResult:
    """Train `model` in place: one optimizer step with `rule`'s gradients per batch, then `after_step`."""
    model.train()
    step_optimizer = optimizer.build(model.parameters())
    device = model_device(model)
    total, steps = 0.0, 0
    for xb, yb in batches:
        step_optimizer.zero_grad(set_to_none=True)
        loss = rule(xb.to(device), yb.to(device))
        step_optimizer.step()
        if after_step is not None:
            after_step()
        total += float(loss)
        steps += 1
    return TrainResult(train_loss=total / max(steps, 1), num_steps=steps)


def tensor_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, num_steps: int,
                   seed: int | Sequence[int] = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`num_steps` batches of (x, y): seeded epoch permutations cut into batches of `batch_size`.

    fedsynth's own ClientApp draws its batches this way, with the seed
    `(run seed, round, partition id)`, so a round's batch order is reproducible.
    """
    rng = np.random.default_rng(seed)
    remaining = num_steps
    while remaining > 0:
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            if remaining == 0:
                return
            index = torch.from_numpy(order[start:start + batch_size]).to(x.device)
            yield x[index], y[index]
            remaining -= 1


def epochs(loader: Iterable[tuple[torch.Tensor, torch.Tensor]], count: int) -> Batches:
    """`count` passes over a re-iterable loader (a DataLoader), as one iterable of batches."""
    for _ in range(count):
        yield from loader


@dataclass
class LocalJob:
    """Everything a client update rule needs for one round on one node.

    `incoming` is the train message's content: its `"config"` record holds the round's settings (the module
    docstring says which values come from there and which from `cfg`). `recipe` is the round's local training
    group, its rate and recipe: the message's (`rule_settings(config, LocalTrainingSettings)`) unless given
    (FedDDPM's warm-up gives its own length).
    """

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
    recipe: LocalTrainingSettings | None = None

    def __post_init__(self) -> None:
        self.global_params = [p.detach().clone() for p in self.model.parameters()]
        if self.recipe is None:
            self.recipe = rule_settings(self.settings, LocalTrainingSettings)

    def add_loss_plugin(self, plugin: LossPlugin) -> None:
        """Route the task loss through a plug-in (FedCOG's KD term).

        Rules that use `loss_fn` get the plug-in without knowing of it; a rule that
        computes the task loss itself (MOON, from its projection head) passes it
        through `plugged_loss`.
        """
        self.loss_fn = with_loss_plugin(self.loss_fn, plugin)
        self.loss_plugins.append(plugin)

    def plugged_loss(self, model: nn.Module, task_loss: torch.Tensor) -> torch.Tensor:
        """A task loss computed by the rule itself, passed through the job's plug-ins."""
        for plugin in self.loss_plugins:
            task_loss = plugin(model, task_loss)
        return task_loss

    @property
    def settings(self) -> Mapping[str, Any]:
        """The train message's config: the round's settings the server sent."""
        return self.incoming.config_records.get("config", {})

    def setting(self, key: str) -> Any:
        """The setting `key` the server sent in this round's train config; KeyError naming it when absent."""
        return config_value(self.settings, key)

    def rule_settings(self, group: type) -> Any:
        """This round's value of the rule's settings group `group` (`SAMSettings`, ...), read from the train
        config and checked as the run config checks its keys (common/run/client_settings.py `rule_settings`)."""
        return rule_settings(self.settings, group)

    @property
    def own_settings(self) -> Any:
        """A plugin's own settings group (its strategy class's `settings`), its node-side fields as this round's
        message carries them ("<name>.<key>", checked by the group's `check()`), the others the run config's;
        None for an algorithm without settings of its own (common/run/own_settings.py)."""
        return own_message_settings(self.settings, self.cfg)

    @property
    def lr(self) -> float:
        """This round's local learning rate, as the server's schedule sent it (the recipe's rate)."""
        return self.recipe.lr

    @property
    def num_steps(self) -> int:
        """K: local steps this round."""
        return local_step_count(len(self.y), self.recipe)

    @property
    def batch_size(self) -> int:
        """The round's mini-batch size, as the recipe says."""
        return self.recipe.batch_size

    @property
    def optimizer(self) -> LocalOptimizer:
        """This round's local optimizer, as the recipe says (`auto`, which fedsynth's server resolves before
        sending, is Adam for the diffusion task and SGD otherwise)."""
        recipe = self.recipe
        return LocalOptimizer(lr=self.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay,
                              kind=optimizer_kind(self.cfg, recipe.local_optimizer),
                              clip_grad_norm=recipe.clip_grad_norm)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This round's K batches, in the order seeded by (seed, round, partition id)."""
        return tensor_batches(self.x, self.y, self.recipe.batch_size, self.num_steps,
                              [self.cfg.seed, self.server_round, self.partition_id])


@dataclass
class LocalResult:
    """What a client update rule reports: metrics and extra records for the reply."""

    train_loss: float
    num_steps: int
    outgoing: dict[str, ArrayRecord] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def local_step_count(num_examples: int, recipe: LocalTrainingSettings) -> int:
    """K = the recipe's local steps if set, else its local epochs' full passes of ceil(n / batch) batches (of a
    message's recipe, or of a run config: each is a value of the local training group)."""
    if recipe.local_steps > 0:
        return recipe.local_steps
    return recipe.local_epochs * max(1, -(-num_examples // recipe.batch_size))


def batch_indices(num_examples: int, cfg: RunConfig, server_round: int, partition_id: int) -> Iterator[np.ndarray]:
    """Index batches of one round (the order `LocalJob.batches` draws for the run config's recipe): seeded by
    (seed, round, partition)."""
    positions = torch.arange(num_examples)
    for index, _ in tensor_batches(positions, positions, cfg.batch_size, local_step_count(num_examples, cfg),
                                   [cfg.seed, server_round, partition_id]):
        yield index.numpy()


def plain_gradients(model: nn.Module, loss_fn: LossFn) -> GradientRule:
    """Plain gradient of the task's loss."""

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model, xb, yb)
        loss.backward()
        return loss.detach()

    return rule


def plain_rule(job: "LocalJob") -> GradientRule:
    """Plain gradient of the job's loss."""
    return plain_gradients(job.model, job.loss_fn)


def run_local_steps(job: LocalJob, rule: GradientRule, after_step: AfterStep | None = None) -> LocalResult:
    """Train `job.model` in place for this round's K seeded batches with the given gradient rule."""
    result = train_steps(job.model, job.batches(), rule, job.optimizer, after_step)
    return LocalResult(train_loss=result.train_loss, num_steps=result.num_steps)
