"""Client rules of the SAM family beyond FedSAM, all on common/algorithms/sam.py's one SAM step (SPEC 3.4, 4.1, 4.3).

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
  along `grad F(w + e; xi)` (FedSynSAM, Algorithm 1). The mix "normalized"
  (`SynSAMRuleSettings`; an ablation, not the paper's) mixes the unit gradients
  instead (common/algorithms/synsam.py). Each step also measures the mini-batch norm
  ratio `||grad F(w; zeta)|| / ||grad F(w; xi)||`, the synthetic share of the
  ascent direction and the cosine of the two gradients; they go up as
  `stat-synsam-*` metrics (the ratio as its median over the steps,
  common/algorithms/synsam.py `step_statistics`).
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
keep working. The rules themselves are plain functions in client_app/rules.py
(`fedsynth.client`); this module reads what they need from the train message
(the rule's settings in its config, `LocalJob.setting`; the server's records)
and `Context.state`, and writes back what they return.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.rules import (
    fixed_direction_gradients,
    parameter_tensors,
    sam_gradients,
    train_fedlesam_d,
    train_fedlesam_s,
    train_fedgamma,
    train_fedsmoo,
    train_fedsynsam,
    endless_batches,
    ScaffoldResult,
)
from client_app.accepted_scale import apply_accepted_scale, keep_update_part
from client_app.training import GradientRule, LocalJob, LocalResult, run_local_steps
from common.algorithms.scaffold_control import scaffold_update_part
from common.data.datasets import run_dataset_info
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
from common.algorithms.rule_settings import FedDynSAMSettings, SAMSettings
from common.algorithms.synsam_settings import SynSAMRuleSettings

# Keys in Context.state.
STATE_SYNTHETIC = "fedsynsam-synthetic-data"   # D_syn as received from the server: {"x", "y"}
STATE_SMOO_MU = "fedsmoo-mu"                    # FedSMOO's perturbation dual mu_i


# ----- pieces shared by the rules ------------------------------------------------


def _state_weights(state: RecordDict, key: str) -> Weights | None:
    record = state.array_records.get(key)
    return from_record(record) if record is not None else None


def _incoming_weights(job: LocalJob, key: str) -> Weights | None:
    record = job.incoming.array_records.get(key)
    return from_record(record) if record is not None else None


def fedsam_rule(job: LocalJob) -> GradientRule:
    """FedSAM: ascent along the local mini-batch gradient."""
    return sam_gradients(job.model, job.loss_fn, job.rule_settings(SAMSettings).sam_rho)


def fedlesam_direction(job: LocalJob) -> list[torch.Tensor] | None:
    """`w^{t-1} - w^t` per parameter, or None when the server sent no previous update (round 1)."""
    previous = _incoming_weights(job, PREVIOUS_UPDATE)
    return None if previous is None else [-t for t in parameter_tensors(job.model, previous)]


def fixed_direction_rule(job: LocalJob, direction: list[torch.Tensor] | None) -> GradientRule:
    """SAM with an ascent direction fixed for the round (FedLESAM); plain gradients without one."""
    return fixed_direction_gradients(job.model, job.loss_fn, direction, job.rule_settings(SAMSettings).sam_rho)


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
    """Endless seeded batches over the synthetic set, seeded by (seed, round, partition)."""
    return endless_batches(num_examples, batch_size, [seed, server_round, partition_id, 5])


def fedsynsam_update(job: LocalJob) -> LocalResult:
    """FedSynSAM client: FedSAM until D_syn arrives, then SAM along the local/synthetic gradient mix."""
    synthetic = receive_synthetic(job)
    if synthetic is None:
        result = run_local_steps(job, fedsam_rule(job))
        result.metrics["synthetic-examples"] = 0
        return result
    cfg = job.cfg
    rule = job.rule_settings(SynSAMRuleSettings)
    trained = train_fedsynsam(
        job.model, job.batches(), synthetic_x=synthetic[0], synthetic_y=synthetic[1], rho=rule.sam_rho, beta=rule.synsam_beta,
        mix=rule.synsam_mix, synthetic_batch_size=job.batch_size,
        synthetic_seed=[cfg.seed, job.server_round, job.partition_id, 5], optimizer=job.optimizer,
        loss_fn=job.loss_fn,
    )
    metrics = {"synthetic-examples": int(len(synthetic[1]))}
    metrics.update({CLIENT_STAT_PREFIX + key: value for key, value in trained.metrics.items()})
    return LocalResult(trained.train_loss, trained.num_steps, metrics=metrics)


# ----- SCAFFOLD-corrected SAM: FedGAMMA, FedLESAM-S --------------------------------


def scaffold_inputs(job: LocalJob) -> dict:
    """SCAFFOLD's inputs of a round: the server's c and this node's c_i (None before its first round), scaled
    first where the server clipped the update it came with (client_app/accepted_scale.py)."""
    apply_accepted_scale(job, STATE_SCAFFOLD_CONTROL)
    return {"c_global": from_record(job.incoming.array_records[SCAFFOLD_CONTROL]),
            "c_local": _state_weights(job.state, STATE_SCAFFOLD_CONTROL)}


def scaffold_outputs(job: LocalJob, result: ScaffoldResult) -> LocalResult:
    """Keep c_i+ (and its change's update part) in node state and send c_i+ - c_i (the same key and record as
    `scaffold`)."""
    job.state[STATE_SCAFFOLD_CONTROL] = to_record(result.control)
    c_global = from_record(job.incoming.array_records[SCAFFOLD_CONTROL])
    keep_update_part(job, STATE_SCAFFOLD_CONTROL, scaffold_update_part(result.control_delta, c_global))
    return LocalResult(result.train_loss, result.num_steps,
                       outgoing={SCAFFOLD_CONTROL_DELTA: to_record(result.control_delta)}, metrics=result.metrics)


def fedgamma_update(job: LocalJob) -> LocalResult:
    """FedGAMMA client: FedSAM + SCAFFOLD correction."""
    result = train_fedgamma(job.model, job.batches(), rho=job.rule_settings(SAMSettings).sam_rho,
                            optimizer=job.optimizer, loss_fn=job.loss_fn, **scaffold_inputs(job))
    return scaffold_outputs(job, result)


def fedlesam_s_update(job: LocalJob) -> LocalResult:
    """FedLESAM-S client: FedLESAM + SCAFFOLD correction."""
    result = train_fedlesam_s(job.model, job.batches(), rho=job.rule_settings(SAMSettings).sam_rho,
                              previous_update=_incoming_weights(job, PREVIOUS_UPDATE), optimizer=job.optimizer,
                              loss_fn=job.loss_fn, **scaffold_inputs(job))
    return scaffold_outputs(job, result)


# ----- FedDyn-regularised FedLESAM: FedLESAM-D --------------------------------------


def fedlesam_d_update(job: LocalJob) -> LocalResult:
    """FedLESAM-D client: FedLESAM + FedDyn dynamic regulariser; sends g_i+ - g_i."""
    apply_accepted_scale(job, STATE_DYN_GRADIENT)
    dyn = job.rule_settings(FedDynSAMSettings)
    result = train_fedlesam_d(
        job.model, job.batches(), rho=dyn.sam_rho, alpha=dyn.dyn_alpha,
        previous_update=_incoming_weights(job, PREVIOUS_UPDATE),
        dyn_gradient=_state_weights(job.state, STATE_DYN_GRADIENT), optimizer=job.optimizer, loss_fn=job.loss_fn,
    )
    job.state[STATE_DYN_GRADIENT] = to_record(result.dyn_gradient)
    keep_update_part(job, STATE_DYN_GRADIENT, result.correction)  # g_i+ - g_i = -alpha (w_i - w): all of it
    return LocalResult(result.train_loss, result.num_steps,
                       outgoing={DYNAMIC_CORRECTION: to_record(result.correction)}, metrics=result.metrics)


# ----- FedSMOO ----------------------------------------------------------------------------


def fedsmoo_update(job: LocalJob) -> LocalResult:
    """FedSMOO client: SAM along `g - mu_i - s` with the dynamic regulariser; sends `mu_i - e_last`.

    Keeps `mu_i` and the weight dual `g_i` in node state. The server derives
    its own weight dual from the model updates (FedDyn), so only the
    perturbation correction is a second uplink record.
    """
    apply_accepted_scale(job, STATE_DYN_GRADIENT)
    dyn = job.rule_settings(FedDynSAMSettings)
    result = train_fedsmoo(
        job.model, job.batches(), rho=dyn.sam_rho, alpha=dyn.dyn_alpha,
        global_perturbation=_incoming_weights(job, GLOBAL_PERTURBATION),
        mu=_state_weights(job.state, STATE_SMOO_MU), dyn_gradient=_state_weights(job.state, STATE_DYN_GRADIENT),
        optimizer=job.optimizer, loss_fn=job.loss_fn,
    )
    job.state[STATE_DYN_GRADIENT] = to_record(result.dyn_gradient)
    keep_update_part(job, STATE_DYN_GRADIENT, result.correction)  # g_i+ - g_i = -alpha (w_i - w): all of it
    job.state[STATE_SMOO_MU] = to_record(result.mu)
    return LocalResult(result.train_loss, result.num_steps,
                       outgoing={PERTURBATION_DUAL: to_record(result.perturbation_dual)}, metrics=result.metrics)
