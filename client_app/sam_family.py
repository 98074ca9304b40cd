"""Client rules of the SAM family beyond FedSAM, all on common/sam.py's one SAM step (SPEC 3.4, 4.1, 4.3).

Each rule differs only in the ascent direction `g` of `e = rho * g / ||g||`
(one L2 norm over all parameters together) and in what it adds to the descent:

- `fedlesam`: `g = w^{t-1} - w^t`, the negated previous global update the
  server sends (PREVIOUS_UPDATE). It is fixed for the round, so a step costs
  one gradient, at `w + e`. Round 1 has no previous update: plain SGD. The
  public FedLESAM code normalises the flat update per tensor; we normalise it
  as one vector, as the paper's rule is written.
- `fedsynsam`: FedSAM until the node holds the server's synthetic set D_syn
  (sent once after round R, kept in `Context.state`); from then on each step
  draws a local batch xi and a synthetic batch zeta,
  `g = beta * grad F(w; xi) + (1 - beta) * grad F(w; zeta)`, and descends
  along `grad F(w + e; xi)` (FedSynSAM, Algorithm 1). `synsam-mix =
  "normalized"` (an ablation, not the paper's) mixes the unit gradients
  instead (common/synsam.py). Each step also measures the mini-batch norm
  ratio `||grad F(w; zeta)|| / ||grad F(w; xi)||`, the synthetic share of the
  ascent direction and the cosine of the two gradients; their means over the
  steps go up as `stat-synsam-*` metrics.
- `fedgamma` (FedSAM) and `fedlesam-s` (FedLESAM) with SCAFFOLD's control-variate
  correction after each step; their `c_i+ - c_i` goes up as a second record.
- `fedlesam-d`: FedLESAM with FedDyn's dynamic regulariser
  `- <g_i, w> + (alpha/2)||w - w^t||^2`; the node keeps `g_i` in its state and
  sends `g_i+ - g_i` (DYNAMIC_CORRECTION), which the server averages into its
  `h`. Sending it costs a second uplink record, as the FedSynSAM paper counts
  for its 2x baselines, and keeps the server's `h` consistent with the nodes'
  `g_i` when the model update is compressed.
- `fedsmoo` (Sun et al., 2023): the ascent direction `g - mu_i - s` is
  corrected by the server's global perturbation `s` and the node's dual
  `mu_i` (`mu_i += e - s` after each step); the descent gets the same dynamic
  regulariser as `fedlesam-d`; the node sends `mu_i - e_last`
  (PERTURBATION_DUAL), from which the server forms the next `s` (2x uplink).

All rules compute losses through `job.loss_fn`, so other tasks and plug-ins
keep working.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.training import GradientRule, LocalJob, LocalResult, plain_rule, run_local_steps
from common.datasets import run_dataset_info
from common.losses import scaffold_client_control
from common.protocol import (
    CLIENT_STAT_PREFIX,
    DYNAMIC_CORRECTION,
    GLOBAL_PERTURBATION,
    PERTURBATION_DUAL,
    PREVIOUS_UPDATE,
    SCAFFOLD_CONTROL,
    SCAFFOLD_CONTROL_DELTA,
    STATE_DYN_GRADIENT,
    STATE_SCAFFOLD_CONTROL,
    SYNTHETIC_DATA,
)
from common.records import Weights, from_record, to_record
from common.sam import current_gradients, fedsam_gradients, perturbed_gradients, sam_perturbation
from common.synsam import cosine, mix_ascent, norm_ratio, synthetic_share

# Keys in Context.state.
STATE_SYNTHETIC = "fedsynsam-synthetic-data"   # D_syn as received from the server: {"x", "y"}
STATE_SMOO_MU = "fedsmoo-mu"                    # FedSMOO's perturbation dual mu_i


# ----- pieces shared by the rules ------------------------------------------------


def _state_weights(state: RecordDict, key: str) -> Weights | None:
    record = state.array_records.get(key)
    return from_record(record) if record is not None else None


def parameter_names(job: LocalJob) -> list[str]:
    """Names of the trainable parameters, in `model.parameters()` order."""
    return [name for name, _ in job.model.named_parameters()]


def as_parameter_tensors(job: LocalJob, weights: Weights) -> list[torch.Tensor]:
    """Per-parameter tensors on the job's device, in `model.parameters()` order."""
    return [torch.from_numpy(np.asarray(weights[name], dtype=np.float32)).to(job.device) for name in parameter_names(job)]


def fedsam_rule(job: LocalJob) -> GradientRule:
    """FedSAM: ascent along the local mini-batch gradient."""
    params = list(job.model.parameters())

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return fedsam_gradients(params, lambda: job.loss_fn(job.model, xb, yb), job.cfg.sam_rho)

    return rule


def fedlesam_direction(job: LocalJob) -> list[torch.Tensor] | None:
    """`w^{t-1} - w^t` per parameter, or None when the server sent no previous update (round 1)."""
    record = job.incoming.array_records.get(PREVIOUS_UPDATE)
    if record is None:
        return None
    return [-t for t in as_parameter_tensors(job, from_record(record))]


def fixed_direction_rule(job: LocalJob, direction: list[torch.Tensor] | None) -> GradientRule:
    """SAM with an ascent direction fixed for the round (FedLESAM); plain gradients without one."""
    if direction is None or job.cfg.sam_rho == 0:
        return plain_rule(job)
    params = list(job.model.parameters())

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return perturbed_gradients(params, lambda: job.loss_fn(job.model, xb, yb), direction, job.cfg.sam_rho)

    return rule


# ----- FedLESAM --------------------------------------------------------------------


def fedlesam_update(job: LocalJob) -> LocalResult:
    """FedLESAM client: SAM along the previous global update, one gradient per step."""
    return run_local_steps(job, fixed_direction_rule(job, fedlesam_direction(job)))


# ----- FedSynSAM -------------------------------------------------------------------


def check_synthetic(x: np.ndarray, y: np.ndarray, job: LocalJob) -> None:
    """Refuse a synthetic set that does not fit the run's data (shape, dtype, labels, finiteness)."""
    info = run_dataset_info(job.cfg)
    if x.dtype != np.float32 or x.ndim != 4 or tuple(x.shape[1:]) != info.shape:
        raise ValueError(f"synthetic data: x has dtype {x.dtype} and shape {x.shape}, expected float32 (n, {info.shape})")
    if y.dtype != np.int64 or y.shape != (x.shape[0],):
        raise ValueError(f"synthetic data: y has dtype {y.dtype} and shape {y.shape}, expected int64 ({x.shape[0]},)")
    if len(y) == 0 or y.min() < 0 or y.max() >= info.num_classes:
        raise ValueError(f"synthetic data: labels must be in 0..{info.num_classes - 1}")
    if not np.isfinite(x).all():
        raise ValueError("synthetic data: x has non-finite values")


def receive_synthetic(job: LocalJob) -> tuple[torch.Tensor, torch.Tensor] | None:
    """D_syn as tensors: the copy arriving with this message is checked and kept in node state.

    Returns None while this node has not received it yet.
    """
    incoming = job.incoming.array_records.get(SYNTHETIC_DATA)
    if incoming is not None:
        arrays = from_record(incoming)
        if set(arrays) != {"x", "y"}:
            raise ValueError(f"synthetic data: expected arrays 'x' and 'y', got {sorted(arrays)}")
        check_synthetic(arrays["x"], arrays["y"], job)
        job.state[STATE_SYNTHETIC] = incoming
    stored = _state_weights(job.state, STATE_SYNTHETIC)
    if stored is None:
        return None
    return torch.from_numpy(stored["x"]).to(job.device), torch.from_numpy(stored["y"]).to(job.device)


def synthetic_batches(num_examples: int, batch_size: int, seed: int, server_round: int, partition_id: int) -> Iterator[np.ndarray]:
    """Endless seeded batches over the synthetic set (epoch permutations cut into batches)."""
    rng = np.random.default_rng([seed, server_round, partition_id, 5])
    size = min(batch_size, num_examples)
    while True:
        order = rng.permutation(num_examples)
        for start in range(0, num_examples - size + 1, size):
            yield order[start:start + size]


def synsam_rule(job: LocalJob, x_syn: torch.Tensor, y_syn: torch.Tensor, stats: dict[str, list[float]]) -> GradientRule:
    """Ascent along the mix of grad F(w; xi) and grad F(w; zeta) (`synsam-mix`); descent along grad F(w + e; xi).

    Appends each step's norm ratio, synthetic share and local/synthetic
    cosine to `stats`.
    """
    model, cfg = job.model, job.cfg
    params = list(model.parameters())
    beta = cfg.synsam_beta
    batches = synthetic_batches(len(y_syn), cfg.batch_size, cfg.seed, job.server_round, job.partition_id)

    def gradient(loss: torch.Tensor) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        loss.backward()
        return current_gradients(params)

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        index = torch.from_numpy(next(batches)).to(job.device)
        g_local = gradient(job.loss_fn(model, xb, yb))
        g_syn = gradient(job.loss_fn(model, x_syn[index], y_syn[index]))
        stats["norm-ratio"].append(norm_ratio(g_local, g_syn))
        stats["share"].append(synthetic_share(g_local, g_syn, beta, cfg.synsam_mix))
        stats["cos"].append(cosine(g_local, g_syn))
        direction = mix_ascent(g_local, g_syn, beta, cfg.synsam_mix)
        return perturbed_gradients(params, lambda: job.loss_fn(model, xb, yb), direction, cfg.sam_rho)

    return rule


def fedsynsam_update(job: LocalJob) -> LocalResult:
    """FedSynSAM client: FedSAM until D_syn arrives, then SAM along the local/synthetic gradient mix."""
    synthetic = receive_synthetic(job)
    if synthetic is None:
        result = run_local_steps(job, fedsam_rule(job))
        result.metrics["synthetic-examples"] = 0
        return result
    stats: dict[str, list[float]] = {"norm-ratio": [], "share": [], "cos": []}
    result = run_local_steps(job, synsam_rule(job, *synthetic, stats))
    result.metrics["synthetic-examples"] = int(len(synthetic[1]))
    for key, values in stats.items():
        if values:
            result.metrics[f"{CLIENT_STAT_PREFIX}synsam-{key}"] = float(np.mean(values))
    return result


# ----- SCAFFOLD-corrected SAM: FedGAMMA, FedLESAM-S --------------------------------


def scaffold_corrected(job: LocalJob, rule: GradientRule) -> LocalResult:
    """Run `rule` with SCAFFOLD's correction `w <- w - lr (c - c_i)` after each step (option-II c_i update).

    Uses the same node-state key and records as `scaffold`, so the SCAFFOLD
    server strategy (and its resume support) serves these rules unchanged.
    """
    names = parameter_names(job)
    c_global = from_record(job.incoming.array_records[SCAFFOLD_CONTROL])
    c_local = _state_weights(job.state, STATE_SCAFFOLD_CONTROL)
    if c_local is None:
        c_local = {name: np.zeros_like(c_global[name]) for name in names}
    correction = as_parameter_tensors(job, {name: c_global[name] - c_local[name] for name in names})
    params = list(job.model.parameters())
    lr = job.lr

    def after_step() -> None:
        with torch.no_grad():
            for p, c in zip(params, correction):
                p.sub_(lr * c)

    w_global = {name: g.detach().cpu().numpy() for name, g in zip(names, job.global_params)}
    result = run_local_steps(job, rule, after_step)
    w_local = {name: p.detach().cpu().numpy() for name, p in zip(names, params)}
    c_new = scaffold_client_control(c_local, c_global, w_global, w_local, result.num_steps, lr)
    job.state[STATE_SCAFFOLD_CONTROL] = to_record(c_new)
    result.outgoing[SCAFFOLD_CONTROL_DELTA] = to_record({name: c_new[name] - c_local[name] for name in names})
    return result


def fedgamma_update(job: LocalJob) -> LocalResult:
    """FedGAMMA client: FedSAM + SCAFFOLD correction."""
    return scaffold_corrected(job, fedsam_rule(job))


def fedlesam_s_update(job: LocalJob) -> LocalResult:
    """FedLESAM-S client: FedLESAM + SCAFFOLD correction."""
    return scaffold_corrected(job, fixed_direction_rule(job, fedlesam_direction(job)))


# ----- FedDyn-regularised FedLESAM: FedLESAM-D --------------------------------------


def feddyn_gradient_update(g_local: Weights, w_global: Weights, w_local: Weights, alpha: float) -> Weights:
    """FedDyn's node state after training: g_i+ = g_i - alpha (w_i - w^t)."""
    return {name: (g_local[name] - alpha * (w_local[name] - w_global[name])).astype(np.float32) for name in g_local}


def with_dynamic_regulariser(job: LocalJob, rule: GradientRule, g_local: list[torch.Tensor]) -> GradientRule:
    """Add FedDyn's regulariser gradient `- g_i + alpha (w - w^t)` to whatever `rule` computed."""
    params, alpha = list(job.model.parameters()), job.cfg.dyn_alpha

    def regularised(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = rule(xb, yb)
        with torch.no_grad():
            for p, g, w0 in zip(params, g_local, job.global_params):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.sub_(g).add_(p.detach() - w0, alpha=alpha)
        return loss

    return regularised


def fedlesam_d_update(job: LocalJob) -> LocalResult:
    """FedLESAM-D client: FedLESAM + FedDyn dynamic regulariser; sends g_i+ - g_i."""
    names = parameter_names(job)
    g_local = _state_weights(job.state, STATE_DYN_GRADIENT)
    if g_local is None:
        g_local = {name: np.zeros(p.shape, dtype=np.float32) for name, p in job.model.named_parameters()}
    rule = with_dynamic_regulariser(
        job, fixed_direction_rule(job, fedlesam_direction(job)), as_parameter_tensors(job, g_local)
    )
    result = run_local_steps(job, rule)
    w_global = {name: g.detach().cpu().numpy() for name, g in zip(names, job.global_params)}
    w_local = {name: p.detach().cpu().numpy() for name, p in job.model.named_parameters()}
    g_new = feddyn_gradient_update(g_local, w_global, w_local, job.cfg.dyn_alpha)
    job.state[STATE_DYN_GRADIENT] = to_record(g_new)
    result.outgoing[DYNAMIC_CORRECTION] = to_record({name: g_new[name] - g_local[name] for name in names})
    return result



# ----- FedSMOO ----------------------------------------------------------------------------


def fedsmoo_update(job: LocalJob) -> LocalResult:
    """FedSMOO client: SAM along `g - mu_i - s` with the dynamic regulariser; sends `mu_i - e_last`.

    Keeps `mu_i` and the weight dual `g_i` in node state. The server derives
    its own weight dual from the model updates (FedDyn), so only the
    perturbation correction is a second uplink record.
    """
    names = parameter_names(job)
    params = list(job.model.parameters())
    zeros = {name: np.zeros(p.shape, dtype=np.float32) for name, p in job.model.named_parameters()}
    record = job.incoming.array_records.get(GLOBAL_PERTURBATION)
    s_global = as_parameter_tensors(job, from_record(record) if record is not None else zeros)
    mu = as_parameter_tensors(job, _state_weights(job.state, STATE_SMOO_MU) or zeros)
    g_local = _state_weights(job.state, STATE_DYN_GRADIENT) or zeros
    last_perturbation = [torch.zeros_like(p) for p in params]

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        for p in params:
            p.grad = None
        job.loss_fn(job.model, xb, yb).backward()
        direction = [g - m - s for g, m, s in zip(current_gradients(params), mu, s_global)]
        loss = perturbed_gradients(params, lambda: job.loss_fn(job.model, xb, yb), direction, job.cfg.sam_rho)
        perturbation = sam_perturbation(direction, job.cfg.sam_rho)
        for m, e, s in zip(mu, perturbation, s_global):
            m.add_(e - s)
        last_perturbation[:] = perturbation
        return loss

    result = run_local_steps(job, with_dynamic_regulariser(job, rule, as_parameter_tensors(job, g_local)))
    w_global = {name: g.detach().cpu().numpy() for name, g in zip(names, job.global_params)}
    w_local = {name: p.detach().cpu().numpy() for name, p in zip(names, params)}
    job.state[STATE_DYN_GRADIENT] = to_record(feddyn_gradient_update(g_local, w_global, w_local, job.cfg.dyn_alpha))
    mu_np = {name: m.detach().cpu().numpy().astype(np.float32) for name, m in zip(names, mu)}
    job.state[STATE_SMOO_MU] = to_record(mu_np)
    result.outgoing[PERTURBATION_DUAL] = to_record(
        {name: (mu_np[name] - e.detach().cpu().numpy()).astype(np.float32) for name, e in zip(names, last_perturbation)}
    )
    return result
