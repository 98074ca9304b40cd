"""FedCOG on the client: complementary data generation and KD training, as a plug-in over a base rule.

FedCOG (Ye et al., 2024; SPEC 4.2) changes only what a client does locally, so
it wraps the client update of any base algorithm (`fedavg`, `fedavgm`,
`fedprox`, `scaffold`, `moon`) and leaves the base's client and server rules
as they are:

1. **Generate**: learnable inputs of the data's shape (channels from the
   node's own data), labelled by the client's complementary label allocation,
   optimised with Adam so that the frozen global model recognises them while
   the client's previous local model (kept in `Context.state`) disagrees.
   Copies of the lowest-loss step's inputs and global logits are kept. Both
   models are frozen copies in eval mode, so the generation leaves the model's
   BatchNorm statistics alone.
2. **Train**: the base rule runs as usual; its task loss on each real batch
   passes through a loss plug-in that returns
   `c_real * task loss + c_kd * KL(p_global(x_gen) || p_local(x_gen))` on the
   next generated batch.
3. **Upload** what the base uploads. The generated set lives only in this
   function call: it never enters a reply or the node state.

Rounds before the first FedCOG round run the base rule unchanged; the model
each round ends with is kept in node state for the next disagreement term.

`fedcog_distillation` (steps 1 and the plug-in of 2) and `train_fedcog` (one
round on FedAvg's update) take plain parameters and FedCOG's one settings object,
the run config's part `CogSettings` (common/algorithms/cog_settings.py), for any
Flower ClientApp (`fedsynth.client`); `plug_in` feeds the first from the train
message: the server sends FedCOG's settings in its config, with its first round already
resolved to the first FedCOG round, and the node reads them back as the group
(`LocalJob.rule_settings`: a missing, mistyped or out-of-range value is refused naming its key).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from logging import WARNING
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common.logger import log
from torch import nn

from client_app.rules import frozen_twin, train_sgd
from client_app.training import (
    Batches, LocalJob, LocalOptimizer, LocalResult, LossFn, TrainResult, classification_loss, model_device,
    with_loss_plugin,
)
from common.run.config import RunConfig
from common.algorithms.plugins import algorithm_of
from common.algorithms.cog_settings import CogSettings
from common.data.datasets import normalization, run_dataset_info
from common.algorithms.fedcog import complementary_labels, generation_loss, kd_coefficients, kd_loss
from common.algorithms.optimizers import Adam
from common.protocol import CLIENT_STAT_PREFIX, STATE_COG_PREVIOUS_MODEL
from common.records import from_record, model_weights, to_record

ClientUpdate = Callable[[LocalJob], LocalResult]

# SPEC 4.2: Adam betas of the input optimisation, as in the reference code.
GEN_BETAS = (0.5, 0.9)
GRID_FILE = "fedcog-generated.png"
# Reply metrics the server averages per round (mean and -max over clients).
STAT = CLIENT_STAT_PREFIX + "cog-"
GRID_COLUMNS = 8


def client_algorithm(cfg: RunConfig) -> str:
    """The client registry entry to run: `cog = true` turns base X into `X+cog`."""
    if cfg.cog and not algorithm_of(cfg.algorithm).with_cog:
        return f"{cfg.algorithm}+cog"
    return cfg.algorithm


frozen_copy = frozen_twin  # a frozen copy of a model, optionally with other weights


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers (run seed, round, partition, purpose)."""
    return int(np.random.SeedSequence([abs(int(p)) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


@dataclass
class GeneratedSet:
    """The generated inputs of one round on one client, and how their optimisation went."""

    inputs: torch.Tensor          # (N, C, H, W), the lowest-loss step's inputs (a copy)
    global_logits: torch.Tensor   # (N, classes), the global model's logits on them (a copy)
    targets: torch.Tensor         # (N,), the complementary labels they were optimised for
    losses: list[float] = field(default_factory=list)  # generation loss at each step
    best_step: int = 0
    seconds: float = 0.0


def generate(
    global_model: nn.Module,
    local_model: nn.Module | None,
    targets: torch.Tensor,
    input_shape: tuple[int, ...],
    steps: int,
    lr: float,
    lambda_dis: float,
    seed: int,
) -> GeneratedSet:
    """Optimise inputs for `steps` Adam steps on CE(global) + lambda_dis (1 - JS(global, local)).

    Both models must be frozen and in eval mode. With `steps = 0` the inputs
    stay Gaussian noise (Table 5's ablation 1). The inputs and global logits
    of the step with the lowest loss are cloned at that step: the reference
    code keeps `inputs.data`, a view that the following Adam steps overwrite.
    """
    start = time.perf_counter()
    device = targets.device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    inputs = torch.randn((len(targets), *input_shape), generator=generator).to(device).requires_grad_(True)
    if steps == 0:
        with torch.no_grad():
            logits = global_model(inputs)
        return GeneratedSet(inputs.detach().clone(), logits.clone(), targets, [], 0, time.perf_counter() - start)
    optimizer = Adam([inputs], lr=lr, betas=GEN_BETAS)
    use_local = local_model is not None and lambda_dis > 0
    best_loss, best_inputs, best_logits, best_step = float("inf"), inputs.detach().clone(), None, 0
    losses: list[float] = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        global_logits = global_model(inputs)
        local_logits = local_model(inputs) if use_local else None
        loss = generation_loss(global_logits, targets, local_logits, lambda_dis)
        value = float(loss.detach())
        losses.append(value)
        if value < best_loss:
            best_loss, best_step = value, step
            best_inputs = inputs.detach().clone()
            best_logits = global_logits.detach().clone()
        loss.backward()
        optimizer.step()
    if best_logits is None:  # every step's loss was NaN: keep the noise rather than fail the round
        with torch.no_grad():
            best_logits = global_model(best_inputs)
    return GeneratedSet(best_inputs, best_logits, targets, losses, best_step, time.perf_counter() - start)


def generated_batches(num_samples: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """Endless seeded shuffled passes over the generated set, cut into batches."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(num_samples)
        for begin in range(0, num_samples, batch_size):
            yield order[begin:begin + batch_size]


class KnowledgeDistillation:
    """The loss plug-in of FedCOG's training step (paper eq. 3).

    Each call takes the next generated batch: `c_real * task_loss + c_kd *
    KL(p_global || p_local)`, or with `hard_label` the cross-entropy against the
    global model's argmax (Table 5's ablation 3, as the reference code does).
    `disagreement` records whether the generation used the previous local model.
    The generated batch's forward pass runs in train mode and moves BatchNorm's running statistics after the real
    batch's, as the reference code's step does (rui-ye/FedCOG fedcog.py `local_train_fedgen`: `net.train()`, then
    `net(x)` on the real batch and `net(images)` on the generated one): a FedCOG step counts two batches.
    """

    def __init__(self, generated: GeneratedSet, c_real: float, c_kd: float, batch_size: int, seed: int,
                 hard_label: bool = False, disagreement: bool = False) -> None:
        self.generated = generated
        self.c_real, self.c_kd = c_real, c_kd
        self.hard_label = hard_label
        self.disagreement = disagreement
        self.batches = generated_batches(len(generated.targets), batch_size, seed)
        self.hard_targets = generated.global_logits.argmax(dim=1)

    def __call__(self, model: nn.Module, task_loss: torch.Tensor) -> torch.Tensor:
        index = torch.from_numpy(next(self.batches)).to(self.generated.inputs.device)
        student = model(self.generated.inputs[index])  # in train mode: BatchNorm tracks it too, as the reference
        if self.hard_label:
            extra = F.cross_entropy(student, self.hard_targets[index])
        else:
            extra = kd_loss(student, self.generated.global_logits[index])
        return self.c_real * task_loss + self.c_kd * extra

    def stats(self) -> dict[str, float]:
        """How the generation went: set size, seconds, c_kd, whether it used the local model, first and best loss."""
        generated = self.generated
        stats = {
            "generated": float(len(generated.targets)),
            "gen-seconds": generated.seconds,
            "c-kd": self.c_kd,
            "disagreement": 1.0 if self.disagreement else 0.0,
        }
        if generated.losses:
            stats["gen-loss-first"] = generated.losses[0]
            stats["gen-loss-best"] = min(generated.losses)
        return stats


def fedcog_distillation(
    model: nn.Module,
    label_counts: np.ndarray,
    *,
    previous_model: dict[str, np.ndarray] | None,
    input_shape: tuple[int, ...],
    settings: CogSettings = CogSettings(),
    batch_size: int = 32,
    generation_seed: int = 0,
    distillation_seed: int = 1,
) -> KnowledgeDistillation | None:
    """FedCOG's generation step and the KD loss plug-in built on its result (None for a balanced node).

    `model` holds the global model of the round (it is copied and frozen, not
    changed); `label_counts` is the node's label histogram (`np.bincount`); the
    generated inputs (shape `input_shape`, e.g. (1, 28, 28)) take the labels the
    node lacks (budget G split by `complementary_labels`). `previous_model` is
    the state dict the node ended its last round with (None: no disagreement
    term). `settings` is FedCOG's (its ablation applied: `generation_steps`, `disagreement_weight`,
    `hard_label`); `batch_size` the generated examples per KD batch. Add the plug-in to the training loss with
    `with_loss_plugin`.
    """
    labels = complementary_labels(np.asarray(label_counts), settings.gen_budget)
    if len(labels) == 0:  # a perfectly balanced node has nothing to complement
        return None
    c_real, c_kd = kd_coefficients(label_counts, settings.kd_weighting, settings.lambda_kd)
    steps, lambda_dis = settings.generation_steps, settings.disagreement_weight
    use_local = previous_model is not None and lambda_dis > 0 and steps > 0
    local_model = frozen_copy(model, previous_model) if use_local else None
    generated = generate(
        frozen_copy(model), local_model, torch.from_numpy(labels).to(model_device(model)), tuple(input_shape),
        steps, settings.gen_lr, lambda_dis, generation_seed,
    )
    return KnowledgeDistillation(generated, c_real, c_kd, batch_size, distillation_seed,
                                 hard_label=settings.hard_label, disagreement=local_model is not None)


def plug_in(job: LocalJob, settings: CogSettings) -> dict[str, float]:
    """Generate this round's complementary set and add FedCOG's KD term to the job's loss.

    `settings` are the ones the server sent; the KD batch is the recipe's batch size (`job.batch_size`). Returns
    the per-client statistics reported in the reply's metrics.
    """
    cfg = job.cfg
    num_classes = run_dataset_info(cfg).num_classes
    previous = job.state.array_records.get(STATE_COG_PREVIOUS_MODEL)
    plugin = fedcog_distillation(
        job.model, np.bincount(job.y.cpu().numpy(), minlength=num_classes),
        previous_model=from_record(previous) if previous is not None else None, input_shape=tuple(job.x.shape[1:]),
        settings=settings, batch_size=job.batch_size,
        generation_seed=derived_seed(cfg.seed, job.server_round, job.partition_id, 1),
        distillation_seed=derived_seed(cfg.seed, job.server_round, job.partition_id, 2),
    )
    if plugin is None:
        return {STAT + "generated": 0.0}
    job.add_loss_plugin(plugin)
    if job.partition_id == settings.cog_grid_partition:
        save_grid(plugin.generated, cfg, job.server_round, job.partition_id)
    return {STAT + key: value for key, value in plugin.stats().items()}


@dataclass
class FedCogResult(TrainResult):
    """FedCOG's node state for the next round: this round's final model (keep it), and the generation stats."""

    previous_model: dict[str, np.ndarray] = field(default_factory=dict)


def train_fedcog(
    model: nn.Module,
    batches: Batches,
    *,
    label_counts: np.ndarray,
    previous_model: dict[str, np.ndarray] | None,
    input_shape: tuple[int, ...],
    settings: CogSettings = CogSettings(),
    batch_size: int = 32,
    seed: int = 0,
    optimizer: LocalOptimizer = LocalOptimizer(),
    loss_fn: LossFn = classification_loss,
) -> FedCogResult:
    """One FedCOG round on FedAvg's local update: generate, then SGD on the real batches plus the KD term.

    The metrics hold the generation's `stats()` (empty set: `generated` = 0).
    Keep `previous_model` of the result for the next round's disagreement term.
    """
    plugin = fedcog_distillation(
        model, label_counts, previous_model=previous_model, input_shape=input_shape, settings=settings,
        batch_size=batch_size, generation_seed=derived_seed(seed, 1), distillation_seed=derived_seed(seed, 2),
    )
    plugged = with_loss_plugin(loss_fn, plugin) if plugin is not None else loss_fn
    result = train_sgd(model, batches, optimizer=optimizer, loss_fn=plugged)
    stats = plugin.stats() if plugin is not None else {"generated": 0.0}
    return FedCogResult(result.train_loss, result.num_steps, {**result.metrics, **stats},
                        previous_model=model_weights(model))


def with_cog(base: ClientUpdate) -> ClientUpdate:
    """The base client update with FedCOG plugged in from the first FedCOG round."""

    def update(job: LocalJob) -> LocalResult:
        settings = job.rule_settings(CogSettings)  # the server's; its start round is the first round
        stats = plug_in(job, settings) if job.server_round >= settings.cog_start_round else {}
        result = base(job)
        # Kept in every round, so that the first FedCOG round already has a
        # previous local model for its disagreement term (as in the reference code).
        job.state[STATE_COG_PREVIOUS_MODEL] = to_record(model_weights(job.model))
        result.metrics.update(stats)
        return result

    update.__name__ = f"{base.__name__}_with_cog"
    update.__doc__ = f"FedCOG plugged into {base.__name__}: {base.__doc__}"
    return update


def grid_image(generated: GeneratedSet, dataset: str, columns: int = GRID_COLUMNS) -> tuple[np.ndarray, list[int]]:
    """An (rows*H, columns*W, C) image in [0, 1]: up to `columns` generated inputs per generated class."""
    mean, std = (np.asarray(v, dtype=np.float32)[None, :, None, None] for v in normalization(dataset, generated.inputs.shape[1]))
    images = np.clip(generated.inputs.detach().cpu().numpy() * std + mean, 0.0, 1.0)
    targets = generated.targets.cpu().numpy()
    classes = [int(c) for c in np.unique(targets)]
    columns = min(columns, int(np.bincount(targets).max()))
    _, channels, height, width = images.shape
    grid = np.ones((len(classes) * height, columns * width, channels), dtype=np.float32)
    for row, label in enumerate(classes):
        for col, index in enumerate(np.flatnonzero(targets == label)[:columns]):
            grid[row * height:(row + 1) * height, col * width:(col + 1) * width] = images[index].transpose(1, 2, 0)
    return grid, classes


def save_grid(generated: GeneratedSet, cfg: RunConfig, server_round: int, partition_id: int) -> Path | None:
    """Write the grid of generated inputs (paper Figure 5) to the run's results folder on this node.

    Overwritten every FedCOG round, so the file shows the last one. The images
    stay on the node that generated them: in a deployment they land in that
    host's results folder. Needs `run-name` to know the folder.
    """
    if not cfg.run_name:
        log(WARNING, "FedCOG: run-name is empty, so the grid of generated inputs is not written")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.run.results import results_root

    grid, classes = grid_image(generated, cfg.dataset)
    folder = results_root(cfg.results_dir) / cfg.run_name
    folder.mkdir(parents=True, exist_ok=True)
    height, width = grid.shape[0] // max(len(classes), 1), grid.shape[1]
    fig, ax = plt.subplots(figsize=(max(width / height, 4) * 0.9 + 1.2, len(classes) * 0.9 + 0.6))
    ax.imshow(grid[..., 0] if grid.shape[2] == 1 else grid, cmap="gray", vmin=0.0, vmax=1.0)
    ax.set_yticks([height * (i + 0.5) for i in range(len(classes))], [f"class {c}" for c in classes])
    ax.set_xticks([])
    ax.set_title(f"FedCOG generated inputs, partition {partition_id}, round {server_round}", fontsize=9)
    fig.tight_layout()
    path = folder / GRID_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
