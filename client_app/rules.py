"""The local update rules as functions of a model, batches and plain parameters.

Every rule fedsynth's ClientApp runs has its core here, callable from any
Flower ClientApp with a torch model, an iterable of `(inputs, labels)`
batches (a `DataLoader`, or `client_app.training.tensor_batches`) and
numbers; `fedsynth.client` is the documented surface. fedsynth's own
ClientApp reaches these same functions through thin adapters
(client_app/updates.py, sam_family.py, decentralized.py) that read the run
config, the server's records and `Context.state`.

State that outlives a round (SCAFFOLD's `c_i`, FedDyn's `g_i`, FedSMOO's
`mu_i`, MOON's previous model) goes in as an argument and comes back in the
result; the caller keeps it (in `Context.state`). Weights are dicts of numpy
arrays keyed by parameter name (`model.named_parameters()`), as
`ArrayRecord.to_numpy_ndarrays` would not keep names.

Each train function trains `model` in place and returns a `TrainResult`
(or a subclass carrying the new state). `loss_fn(model, xb, yb)` is the
task's loss (cross-entropy by default); FedCOG's distillation and the
diffusion task replace it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client_app.training import (
    Batches,
    GradientRule,
    LocalOptimizer,
    LossFn,
    LossPlugin,
    TrainResult,
    classification_loss,
    model_device,
    plain_gradients,
    train_steps,
)
from common.algorithms.batch_statistics import frozen_batch_statistics
from common.algorithms.gossip import mix_with_own, neighbour_sum, ole_start
from common.algorithms.losses import moon_contrastive_loss, proximal_term, scaffold_client_control
from common.records import Weights, flat_norm, load_weights, model_weights, subtract
from common.algorithms.sam import current_gradients, fedsam_gradients, perturbed_gradients, sam_perturbation
from common.algorithms.synsam import cosine, mix_ascent, norm_ratio, step_statistics, synthetic_share

DEFAULT_OPTIMIZER = LocalOptimizer()


# ----- shared pieces -------------------------------------------------------------------


def parameter_tensors(model: nn.Module, weights: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
    """`weights` as float32 tensors on the model's device, in `model.parameters()` order."""
    device = model_device(model)
    return [torch.from_numpy(np.asarray(weights[name], dtype=np.float32)).to(device)
            for name, _ in model.named_parameters()]


def parameter_arrays(params: Sequence[torch.Tensor], names: Sequence[str]) -> Weights:
    """Tensors as numpy arrays on the CPU, by parameter name."""
    return {name: p.detach().cpu().numpy() for name, p in zip(names, params)}


def zero_parameters(model: nn.Module) -> Weights:
    """float32 zeros shaped like each parameter (a node's state before its first round)."""
    return {name: np.zeros(p.shape, dtype=np.float32) for name, p in model.named_parameters()}


def loss_without_statistics(model: nn.Module, loss_fn: LossFn, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """A further forward pass of the same step: BatchNorm normalises by the batch but keeps its running statistics.

    Every rule moves BatchNorm's running statistics once per local batch, in the step's first
    forward pass (at w, as davda54/sam's reference SAM does); the step's other passes (SAM's at
    w + e, FedSynSAM's synthetic batch) go through here. Without BatchNorm this is `loss_fn`.
    """
    with frozen_batch_statistics(model):
        return loss_fn(model, xb, yb)


def sam_gradients(model: nn.Module, loss_fn: LossFn, rho: float) -> GradientRule:
    """FedSAM's gradient: ascent along the local mini-batch gradient, descent along grad L(w + e).

    BatchNorm's running statistics move in the pass at w only (davda54/sam's reference SAM).
    """
    params = list(model.parameters())

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return fedsam_gradients(params, lambda: loss_fn(model, xb, yb), rho,
                                perturbed_loss_fn=lambda: loss_without_statistics(model, loss_fn, xb, yb))

    return rule


def fixed_direction_gradients(model: nn.Module, loss_fn: LossFn, direction: list[torch.Tensor] | None,
                              rho: float) -> GradientRule:
    """SAM with an ascent direction fixed for the round (FedLESAM); plain gradients without one or with rho = 0.

    A step makes one forward pass, at w + e (FedLESAM computes no gradient at w), and
    BatchNorm's running statistics move in it: once per batch, as in every rule.
    """
    if direction is None or rho == 0:
        return plain_gradients(model, loss_fn)
    params = list(model.parameters())

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return perturbed_gradients(params, lambda: loss_fn(model, xb, yb), direction, rho)

    return rule


def fedlesam_direction(model: nn.Module, previous_update: Mapping[str, np.ndarray] | None) -> list[torch.Tensor] | None:
    """`w^{t-1} - w^t` per parameter from the previous global update `w^t - w^{t-1}` (None in round 1)."""
    if previous_update is None:
        return None
    return [-t for t in parameter_tensors(model, previous_update)]


# ----- FedAvg, FedProx, FedSAM, MoFedSAM, FedLESAM ---------------------------------------


def train_sgd(model: nn.Module, batches: Batches, *, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
              loss_fn: LossFn = classification_loss) -> TrainResult:
    """FedAvg's (and DFedAvg's, D-PSGD's) local update: one optimizer step on the loss per batch."""
    return train_steps(model, batches, plain_gradients(model, loss_fn), optimizer)


def train_fedprox(model: nn.Module, batches: Batches, *, mu: float, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
                  loss_fn: LossFn = classification_loss) -> TrainResult:
    """FedProx: loss + (mu / 2) ||w - w_start||^2, w_start the model this call starts from (the global model)."""
    params = list(model.parameters())
    anchor = [p.detach().clone() for p in params]

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model, xb, yb)
        (loss + proximal_term(params, anchor, mu)).backward()
        return loss.detach()

    return train_steps(model, batches, rule, optimizer)


def train_fedsam(model: nn.Module, batches: Batches, *, rho: float, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
                 loss_fn: LossFn = classification_loss) -> TrainResult:
    """FedSAM (and DFedSAM): each step descends along grad L(w + e), e = rho g / ||g|| with g the batch gradient."""
    return train_steps(model, batches, sam_gradients(model, loss_fn, rho), optimizer)


def train_mofedsam(model: nn.Module, batches: Batches, *, rho: float, alpha: float,
                   previous_update: Mapping[str, np.ndarray] | None, num_steps: int | None = None,
                   optimizer: LocalOptimizer = DEFAULT_OPTIMIZER, loss_fn: LossFn = classification_loss) -> TrainResult:
    """MoFedSAM: each step mixes a local SAM step (weight alpha) with 1/K of the previous global update.

    Every step: w <- w + alpha * (the optimizer's SAM step) + (1 - alpha) * previous_update / K, with
    `previous_update = w^t - w^{t-1}` by parameter name and K = `num_steps` (default: `len(batches)`).
    With plain SGD that is Qu et al.'s descent along alpha * grad L(w + e) + (1 - alpha) * m with
    m = -previous_update / (K lr). The two are mixed as moves, not as gradients, because Adam (the
    diffusion task's optimizer) normalises the gradient it is given: m fed into Adam swamps the real
    gradient, and the fedddpm cpu preset ended at FID 657 against FedAvg's 194. So alpha = 0 moves
    the model by exactly the previous global update over the K steps, and alpha = 1 is FedSAM.
    Without a previous update (round 1) this is FedSAM.
    """
    if previous_update is None:
        return train_fedsam(model, batches, rho=rho, optimizer=optimizer, loss_fn=loss_fn)
    steps = num_steps if num_steps is not None else len(batches)  # type: ignore[arg-type]
    params = list(model.parameters())
    device = model_device(model)
    per_step = [torch.from_numpy(np.asarray(previous_update[name]) / steps).to(device)
                for name, _ in model.named_parameters()]
    before: list[torch.Tensor] = []
    sam = sam_gradients(model, loss_fn, rho)

    def sam_step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        before[:] = [p.detach().clone() for p in params]
        return sam(xb, yb)

    @torch.no_grad()
    def mix_moves() -> None:
        for p, start, shift in zip(params, before, per_step):
            p.sub_(start).mul_(alpha).add_(start).add_(shift, alpha=1 - alpha)

    return train_steps(model, batches, sam_step, optimizer, after_step=mix_moves)


def train_fedlesam(model: nn.Module, batches: Batches, *, rho: float, previous_update: Mapping[str, np.ndarray] | None,
                   optimizer: LocalOptimizer = DEFAULT_OPTIMIZER, loss_fn: LossFn = classification_loss) -> TrainResult:
    """FedLESAM: SAM along the negated previous global update (one gradient per step); plain SGD without one.

    `previous_update = w^t - w^{t-1}` by parameter name, as the server sends it. It is
    normalised as one vector over all parameters, as the paper writes the rule.
    """
    rule = fixed_direction_gradients(model, loss_fn, fedlesam_direction(model, previous_update), rho)
    return train_steps(model, batches, rule, optimizer)


# ----- FedSynSAM ------------------------------------------------------------------------


def endless_batches(num_examples: int, batch_size: int, seed: int | Sequence[int]) -> Iterator[np.ndarray]:
    """Endless seeded index batches: epoch permutations cut into full batches of min(batch_size, n)."""
    rng = np.random.default_rng(seed)
    size = min(batch_size, num_examples)
    while True:
        order = rng.permutation(num_examples)
        for start in range(0, num_examples - size + 1, size):
            yield order[start:start + size]


def train_fedsynsam(model: nn.Module, batches: Batches, *, synthetic_x: torch.Tensor, synthetic_y: torch.Tensor,
                    rho: float, beta: float, mix: str = "paper", synthetic_batch_size: int = 32,
                    synthetic_seed: int | Sequence[int] = 0, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
                    loss_fn: LossFn = classification_loss) -> TrainResult:
    """FedSynSAM's mixed ascent: SAM along beta grad F(w; xi) + (1 - beta) grad F(w; zeta), descent at w + e on xi.

    xi is the local batch, zeta the next batch of the synthetic set (`synthetic_x`,
    `synthetic_y`, drawn with `synthetic_seed`). `mix = "normalized"` mixes the unit
    gradients instead (an ablation, common/algorithms/synsam.py). The result's metrics hold the
    medians over the local steps of the norm ratio and the synthetic share
    (`synsam-norm-ratio-median`, `synsam-share-median`) and the step means of
    `synsam-share` and `synsam-cos`. The ratio is a median, not a mean: on a
    one-class client a step where the local gradient is nearly 0 gives a ratio
    orders of magnitude above the others, and a mean is then that one step.
    BatchNorm's running statistics move once per step, in the local pass at w; the
    synthetic pass and the pass at w + e leave them alone (as davda54/sam's SAM does).
    """
    params = list(model.parameters())
    device = model_device(model)
    synthetic_x, synthetic_y = synthetic_x.to(device), synthetic_y.to(device)
    stats: dict[str, list[float]] = {"norm-ratio": [], "share": [], "cos": []}
    synthetic = endless_batches(len(synthetic_y), synthetic_batch_size, synthetic_seed)

    def gradient(loss: torch.Tensor) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        loss.backward()
        return current_gradients(params)

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        index = torch.from_numpy(next(synthetic)).to(device)
        g_local = gradient(loss_fn(model, xb, yb))
        g_syn = gradient(loss_without_statistics(model, loss_fn, synthetic_x[index], synthetic_y[index]))
        stats["norm-ratio"].append(norm_ratio(g_local, g_syn))
        stats["share"].append(synthetic_share(g_local, g_syn, beta, mix))
        stats["cos"].append(cosine(g_local, g_syn))
        direction = mix_ascent(g_local, g_syn, beta, mix)
        return perturbed_gradients(params, lambda: loss_without_statistics(model, loss_fn, xb, yb), direction, rho)

    result = train_steps(model, batches, rule, optimizer)
    result.metrics.update(step_statistics(stats))
    return result


# ----- SCAFFOLD and the SCAFFOLD-corrected SAM rules: FedGAMMA, FedLESAM-S ---------------


@dataclass
class ScaffoldResult(TrainResult):
    """SCAFFOLD's result: the node's new control variate c_i+ (keep it) and c_i+ - c_i (send it)."""

    control: Weights = field(default_factory=dict)
    control_delta: Weights = field(default_factory=dict)


def scaffold_corrected(model: nn.Module, batches: Batches, rule: GradientRule, c_global: Mapping[str, np.ndarray],
                       c_local: Mapping[str, np.ndarray] | None, optimizer: LocalOptimizer) -> ScaffoldResult:
    """Run `rule` with SCAFFOLD's correction `w <- w - lr (c - c_i)` after each step; option-II c_i update."""
    names = [name for name, _ in model.named_parameters()]
    if c_local is None:
        c_local = {name: np.zeros_like(c_global[name]) for name in names}
    correction = parameter_tensors(model, {name: c_global[name] - c_local[name] for name in names})
    params = list(model.parameters())
    lr = optimizer.lr

    def after_step() -> None:
        with torch.no_grad():
            for p, c in zip(params, correction):
                p.sub_(lr * c)

    w_global = parameter_arrays([p.detach().clone() for p in params], names)
    result = train_steps(model, batches, rule, optimizer, after_step)
    w_local = parameter_arrays(params, names)
    c_new = scaffold_client_control(c_local, c_global, w_global, w_local, result.num_steps, lr)
    return ScaffoldResult(result.train_loss, result.num_steps, result.metrics, control=c_new,
                          control_delta={name: c_new[name] - c_local[name] for name in names})


def train_scaffold(model: nn.Module, batches: Batches, *, c_global: Mapping[str, np.ndarray],
                   c_local: Mapping[str, np.ndarray] | None = None, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
                   loss_fn: LossFn = classification_loss) -> ScaffoldResult:
    """SCAFFOLD: SGD steps each followed by w <- w - lr (c - c_i); `c_local` None on the node's first round."""
    return scaffold_corrected(model, batches, plain_gradients(model, loss_fn), c_global, c_local, optimizer)


def train_fedgamma(model: nn.Module, batches: Batches, *, rho: float, c_global: Mapping[str, np.ndarray],
                   c_local: Mapping[str, np.ndarray] | None = None, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
                   loss_fn: LossFn = classification_loss) -> ScaffoldResult:
    """FedGAMMA: FedSAM steps with SCAFFOLD's correction."""
    return scaffold_corrected(model, batches, sam_gradients(model, loss_fn, rho), c_global, c_local, optimizer)


def train_fedlesam_s(model: nn.Module, batches: Batches, *, rho: float,
                     previous_update: Mapping[str, np.ndarray] | None, c_global: Mapping[str, np.ndarray],
                     c_local: Mapping[str, np.ndarray] | None = None, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
                     loss_fn: LossFn = classification_loss) -> ScaffoldResult:
    """FedLESAM-S: FedLESAM steps with SCAFFOLD's correction."""
    rule = fixed_direction_gradients(model, loss_fn, fedlesam_direction(model, previous_update), rho)
    return scaffold_corrected(model, batches, rule, c_global, c_local, optimizer)


# ----- FedDyn-regularised SAM: FedLESAM-D, FedSMOO --------------------------------------


@dataclass
class DynamicResult(TrainResult):
    """FedDyn's node state g_i+ (keep it) and the correction g_i+ - g_i (FedLESAM-D sends it)."""

    dyn_gradient: Weights = field(default_factory=dict)
    correction: Weights = field(default_factory=dict)


def feddyn_gradient_update(g_local: Weights, w_global: Weights, w_local: Weights, alpha: float) -> Weights:
    """FedDyn's node state after training: g_i+ = g_i - alpha (w_i - w^t)."""
    return {name: (g_local[name] - alpha * (w_local[name] - w_global[name])).astype(np.float32) for name in g_local}


def with_dynamic_regulariser(model: nn.Module, rule: GradientRule, g_local: list[torch.Tensor],
                             w_start: list[torch.Tensor], alpha: float) -> GradientRule:
    """Add FedDyn's regulariser gradient `- g_i + alpha (w - w^t)` to whatever `rule` computed."""
    params = list(model.parameters())

    def regularised(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = rule(xb, yb)
        with torch.no_grad():
            for p, g, w0 in zip(params, g_local, w_start):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.sub_(g).add_(p.detach() - w0, alpha=alpha)
        return loss

    return regularised


def dynamic_regularised(model: nn.Module, batches: Batches, rule: GradientRule,
                        dyn_gradient: Mapping[str, np.ndarray] | None, alpha: float,
                        optimizer: LocalOptimizer) -> DynamicResult:
    """Train with `rule` plus FedDyn's regulariser; returns g_i+ and g_i+ - g_i."""
    names = [name for name, _ in model.named_parameters()]
    g_local = dict(dyn_gradient) if dyn_gradient is not None else zero_parameters(model)
    w_start = [p.detach().clone() for p in model.parameters()]
    regularised = with_dynamic_regulariser(model, rule, parameter_tensors(model, g_local), w_start, alpha)
    result = train_steps(model, batches, regularised, optimizer)
    g_new = feddyn_gradient_update(g_local, parameter_arrays(w_start, names),
                                   parameter_arrays(list(model.parameters()), names), alpha)
    return DynamicResult(result.train_loss, result.num_steps, result.metrics, dyn_gradient=g_new,
                         correction={name: g_new[name] - g_local[name] for name in names})


def train_fedlesam_d(model: nn.Module, batches: Batches, *, rho: float, alpha: float,
                     previous_update: Mapping[str, np.ndarray] | None,
                     dyn_gradient: Mapping[str, np.ndarray] | None = None,
                     optimizer: LocalOptimizer = DEFAULT_OPTIMIZER, loss_fn: LossFn = classification_loss) -> DynamicResult:
    """FedLESAM-D: FedLESAM with FedDyn's regulariser `- <g_i, w> + (alpha/2)||w - w^t||^2`."""
    rule = fixed_direction_gradients(model, loss_fn, fedlesam_direction(model, previous_update), rho)
    return dynamic_regularised(model, batches, rule, dyn_gradient, alpha, optimizer)


@dataclass
class SmooResult(DynamicResult):
    """FedSMOO's node state (mu_i+, g_i+: keep them) and `mu_i+ - e_last` (send it)."""

    mu: Weights = field(default_factory=dict)
    perturbation_dual: Weights = field(default_factory=dict)


def train_fedsmoo(model: nn.Module, batches: Batches, *, rho: float, alpha: float,
                  global_perturbation: Mapping[str, np.ndarray] | None = None,
                  mu: Mapping[str, np.ndarray] | None = None, dyn_gradient: Mapping[str, np.ndarray] | None = None,
                  optimizer: LocalOptimizer = DEFAULT_OPTIMIZER, loss_fn: LossFn = classification_loss) -> SmooResult:
    """FedSMOO (Sun et al., 2023): SAM along `g - mu_i - s` with FedDyn's regulariser; `mu_i += e - s` per step.

    `global_perturbation` is the server's `s` (zeros when None), `mu` and `dyn_gradient`
    the node's duals from its last round (zeros when None). BatchNorm's running statistics
    move in the pass at w only (davda54/sam's reference SAM).
    """
    names = [name for name, _ in model.named_parameters()]
    params = list(model.parameters())
    zeros = zero_parameters(model)
    s_global = parameter_tensors(model, global_perturbation if global_perturbation is not None else zeros)
    mu_tensors = parameter_tensors(model, mu if mu is not None else zeros)
    last_perturbation = [torch.zeros_like(p) for p in params]

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        for p in params:
            p.grad = None
        loss_fn(model, xb, yb).backward()
        direction = [g - m - s for g, m, s in zip(current_gradients(params), mu_tensors, s_global)]
        loss = perturbed_gradients(params, lambda: loss_without_statistics(model, loss_fn, xb, yb), direction, rho)
        perturbation = sam_perturbation(direction, rho)
        for m, e, s in zip(mu_tensors, perturbation, s_global):
            m.add_(e - s)
        last_perturbation[:] = perturbation
        return loss

    dyn = dynamic_regularised(model, batches, rule, dyn_gradient, alpha, optimizer)
    mu_new = {name: m.detach().cpu().numpy().astype(np.float32) for name, m in zip(names, mu_tensors)}
    dual = {name: (mu_new[name] - e.detach().cpu().numpy()).astype(np.float32)
            for name, e in zip(names, last_perturbation)}
    return SmooResult(dyn.train_loss, dyn.num_steps, dyn.metrics, dyn_gradient=dyn.dyn_gradient,
                      correction=dyn.correction, mu=mu_new, perturbation_dual=dual)


# ----- MOON -----------------------------------------------------------------------------


@dataclass
class MoonResult(TrainResult):
    """MOON's node state for the next round: this round's final model (keep it)."""

    previous_model: Weights = field(default_factory=dict)


def frozen_twin(model: nn.Module, weights: Mapping[str, np.ndarray] | None = None) -> nn.Module:
    """A copy of the model (optionally with other weights) in eval mode, without gradients."""
    twin = copy.deepcopy(model)
    if weights is not None:
        load_weights(twin, weights)
    twin.eval()
    twin.requires_grad_(False)
    return twin


def train_moon(model: nn.Module, batches: Batches, *, mu: float, tau: float,
               previous_model: Mapping[str, np.ndarray] | None, optimizer: LocalOptimizer = DEFAULT_OPTIMIZER,
               loss_plugins: Sequence[LossPlugin] = ()) -> MoonResult:
    """MOON: CE + mu * contrastive(z, z_global, z_previous), with tau its temperature.

    The model must have `features(x)` (the representation z, MOON's projection
    head included) and `head(z)` (the logits). `previous_model` is the state dict
    this node ended its last round with (None: the global model stands in).
    `loss_plugins` pass the CE term through FedCOG's KD (client_app/fedcog.py).
    """
    global_model = frozen_twin(model)
    previous = frozen_twin(model, previous_model)

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        z = model.features(xb)
        loss = F.cross_entropy(model.head(z), yb)
        for plugin in loss_plugins:
            loss = plugin(model, loss)
        with torch.no_grad():
            z_global, z_previous = global_model.features(xb), previous.features(xb)
        (loss + mu * moon_contrastive_loss(z, z_global, z_previous, tau)).backward()
        return loss.detach()

    result = train_steps(model, batches, rule, optimizer)
    return MoonResult(result.train_loss, result.num_steps, result.metrics, previous_model=model_weights(model))


# ----- decentralized FL: gossip mixing and OledFL's restart ------------------------------


def gossip_mix(own: Mapping[str, np.ndarray], self_weight: float, neighbours: Sequence[Mapping[str, np.ndarray]],
               weights: Sequence[float]) -> Weights:
    """x_i = W_ii z_i + sum_j W_ij z_j: a node's start model from its own last model and its neighbours'."""
    return mix_with_own(own, self_weight, neighbour_sum(list(neighbours), list(weights)))


def ole_restart(model: nn.Module, own_previous: Mapping[str, np.ndarray], beta: float) -> float:
    """OledFL's restart (Ole): load x_i + beta (x_i - z_i^{t-1}) into `model`, which holds the mix x_i.

    `own_previous` is the state dict this node ended its last round with (before its
    first round, the initial model). Returns ||x_i - z_i^{t-1}||, the direction's norm
    before scaling by beta. Then run the local steps (`train_sgd`, `train_fedsam`).
    """
    mixed = model_weights(model)
    load_weights(model, ole_start(mixed, own_previous, beta))
    return flat_norm(subtract(mixed, own_previous))
