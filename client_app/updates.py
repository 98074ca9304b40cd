"""Client update rules of the centralized baselines, and the client-side registry.

Each rule trains `job.model` in place for one round and returns a LocalResult.
Adding an algorithm on the client side means adding one function here and one
entry in CLIENT_UPDATES. Node state that must outlive the round (SCAFFOLD's
`c_i`, MOON's previous model) is kept in the node's `Context.state`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.decentralized import (
    dfedavg_update, dfedavgm_update, dfedsam_update, dpsgd_update, oledfl_sam_update, oledfl_sgd_update,
)
from client_app.sam_family import (
    fedgamma_update, fedlesam_d_update, fedlesam_s_update, fedlesam_update, fedsmoo_update, fedsynsam_update,
)
from client_app.fedcog import with_cog
from client_app.training import LocalJob, LocalResult, plain_rule, run_local_steps
from common.protocol import (
    PREVIOUS_UPDATE, SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA, STATE_MOON_PREVIOUS_MODEL, STATE_SCAFFOLD_CONTROL,
)
from common.losses import moon_contrastive_loss, proximal_term, scaffold_client_control
from common.records import Weights, from_record, load_weights, model_weights, to_record
from common.sam import fedsam_gradients

ClientUpdate = Callable[[LocalJob], LocalResult]


def read_state_weights(state: RecordDict, key: str) -> Weights | None:
    """Weights kept in node state under `key`, or None on the node's first round."""
    record = state.array_records.get(key)
    return from_record(record) if record is not None else None


def write_state_weights(state: RecordDict, key: str, weights: Weights) -> None:
    """Keep weights in node state for the next round this node takes part in."""
    state[key] = to_record(weights)


def named_parameter_weights(model: torch.nn.Module) -> Weights:
    """Trainable parameters as numpy copies, by name."""
    return {name: p.detach().cpu().numpy().copy() for name, p in model.named_parameters()}


def fedavg_update(job: LocalJob) -> LocalResult:
    """FedAvg / FedAvgM client: K steps of SGD on cross-entropy."""
    return run_local_steps(job, plain_rule(job))


def fedprox_update(job: LocalJob) -> LocalResult:
    """FedProx client: cross-entropy + (mu/2)||w - w_global||^2."""
    model, mu = job.model, job.cfg.proximal_mu
    params = list(model.parameters())

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = job.loss_fn(model, xb, yb)
        (loss + proximal_term(params, job.global_params, mu)).backward()
        return loss.detach()

    return run_local_steps(job, rule)


def scaffold_update(job: LocalJob) -> LocalResult:
    """SCAFFOLD client: after each step w <- w - lr (c - c_i); option-II control update."""
    model = job.model
    names = [name for name, _ in model.named_parameters()]
    c_global = from_record(job.incoming.array_records[SCAFFOLD_CONTROL])
    c_local = read_state_weights(job.state, STATE_SCAFFOLD_CONTROL)
    if c_local is None:
        c_local = {name: np.zeros_like(c_global[name]) for name in names}
    correction = [
        torch.from_numpy(c_global[name] - c_local[name]).to(job.device) for name in names
    ]
    params = list(model.parameters())
    lr = job.lr

    def after_step() -> None:
        with torch.no_grad():
            for p, c in zip(params, correction):
                p.sub_(lr * c)

    w_global = {name: g.cpu().numpy() for name, g in zip(names, job.global_params)}
    result = run_local_steps(job, plain_rule(job), after_step)
    w_local = named_parameter_weights(model)
    c_new = scaffold_client_control(c_local, c_global, w_global, w_local, result.num_steps, lr)
    write_state_weights(job.state, STATE_SCAFFOLD_CONTROL, c_new)
    result.outgoing[SCAFFOLD_CONTROL_DELTA] = to_record(
        {name: c_new[name] - c_local[name] for name in names}
    )
    return result


def moon_update(job: LocalJob) -> LocalResult:
    """MOON client: CE + mu * contrastive(z, z_global, z_previous)."""
    model, cfg = job.model, job.cfg
    global_model = copy.deepcopy(model).eval()
    previous_model = copy.deepcopy(model).eval()
    previous = read_state_weights(job.state, STATE_MOON_PREVIOUS_MODEL)
    if previous is not None:
        load_weights(previous_model, previous)
    for frozen in (global_model, previous_model):
        frozen.requires_grad_(False)

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        z = model.features(xb)
        loss = job.plugged_loss(model, F.cross_entropy(model.head(z), yb))  # FedCOG: KD term
        with torch.no_grad():
            z_global, z_previous = global_model.features(xb), previous_model.features(xb)
        (loss + cfg.moon_mu * moon_contrastive_loss(z, z_global, z_previous, cfg.moon_tau)).backward()
        return loss.detach()

    result = run_local_steps(job, rule)
    write_state_weights(job.state, STATE_MOON_PREVIOUS_MODEL, model_weights(model))
    return result


def fedsam_update(job: LocalJob) -> LocalResult:
    """FedSAM client: SAM with the local gradient as ascent direction."""
    model, rho = job.model, job.cfg.sam_rho
    params = list(model.parameters())

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return fedsam_gradients(params, lambda: job.loss_fn(model, xb, yb), rho)

    return run_local_steps(job, rule)


def mofedsam_update(job: LocalJob) -> LocalResult:
    """MoFedSAM client: each step mixes a local SAM step (weight alpha) with the global momentum.

    Every step: w <- w + alpha * (the local optimizer's SAM step) + (1 - alpha) * prev_update / K.
    With plain SGD that is Qu et al.'s descent along alpha * grad L(w + e) + (1 - alpha) * m with
    m = -prev_update / (K lr) (weight decay, being part of the optimizer's step, is weighted by alpha
    too). The two are mixed as moves, like SCAFFOLD's correction, not as gradients, because Adam (the
    diffusion task's optimizer) normalises the gradient it is given: m fed into Adam swamps the real
    gradient, and the fedddpm cpu preset ended at FID 657 against FedAvg's 194. So alpha = 0 moves
    the model by exactly the previous global update over the K steps, and alpha = 1 is FedSAM.

    In round 1 there is no previous global update, so the step is plain FedSAM.
    """
    model, cfg = job.model, job.cfg
    params = list(model.parameters())
    record = job.incoming.array_records.get(PREVIOUS_UPDATE)
    if record is None:
        return fedsam_update(job)
    previous_update = from_record(record)
    alpha = cfg.mofedsam_alpha
    per_step = [torch.from_numpy(previous_update[name] / job.num_steps).to(job.device)
                for name, _ in model.named_parameters()]
    before: list[torch.Tensor] = []

    def sam_step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        before[:] = [p.detach().clone() for p in params]
        return fedsam_gradients(params, lambda: job.loss_fn(model, xb, yb), cfg.sam_rho)

    @torch.no_grad()
    def mix_moves() -> None:
        for p, start, shift in zip(params, before, per_step):
            p.sub_(start).mul_(alpha).add_(start).add_(shift, alpha=1 - alpha)

    return run_local_steps(job, sam_step, after_step=mix_moves)


CLIENT_UPDATES: dict[str, ClientUpdate] = {
    "fedavg": fedavg_update,
    "fedavgm": fedavg_update,
    "fedprox": fedprox_update,
    "scaffold": scaffold_update,
    "moon": moon_update,
    "fedsam": fedsam_update,
    "mofedsam": mofedsam_update,
    # decentralized FL (issue 6): mix the neighbours' models, then these rules
    "dpsgd": dpsgd_update,
    "dfedavg": dfedavg_update,
    "dfedavgm": dfedavgm_update,
    "dfedsam": dfedsam_update,
    "oledfl-sgd": oledfl_sgd_update,
    "oledfl-sam": oledfl_sam_update,
    # FedSynSAM (issue 3): the SAM family and the baselines of the FedSynSAM paper
    "fedlesam": fedlesam_update,
    "fedsynsam": fedsynsam_update,
    "dynafed": fedavg_update,
    "fedgamma": fedgamma_update,
    "fedlesam-s": fedlesam_s_update,
    "fedlesam-d": fedlesam_d_update,
    "fedsmoo": fedsmoo_update,
    # FedCOG (issue 4): generation + KD plugged into the base's own rule ("fedcog" = "fedavg+cog")
    "fedcog": with_cog(fedavg_update),
    "fedavg+cog": with_cog(fedavg_update),
    "fedavgm+cog": with_cog(fedavg_update),
    "fedprox+cog": with_cog(fedprox_update),
    "scaffold+cog": with_cog(scaffold_update),
    "moon+cog": with_cog(moon_update),
    # FedDDPM (issue 5): clients run FedAvg's rule on the DDPM loss; the warmup and the
    # server's correction are in client_app/diffusion.py and server_app/strategies/fedddpm.py
    "fedddpm": fedavg_update,
    "fedddpm+": fedavg_update,
}
