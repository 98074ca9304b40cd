"""Client update rules of the centralized baselines.

Each rule trains `job.model` in place for one round and returns a LocalResult;
the rules' cores are the plain functions of client_app/rules.py (`fedsynth.client`),
which these adapters feed from the train message (its config: the rule's settings group, e.g.
`SAMSettings`, read with `LocalJob.rule_settings`; its records), the node's run config (the local
recipe: client_app/training.py) and node state.
common/algorithm_table.py's rows name these functions by import path (`client`), and
client_app/registry.py resolves them. Node state that must outlive the round (SCAFFOLD's
`c_i`, MOON's previous model) is kept in the node's `Context.state`.
"""

from __future__ import annotations

from flwr.app import RecordDict

from client_app.accepted_scale import apply_accepted_scale, keep_update_part
from client_app.rules import train_fedprox, train_fedsam, train_mofedsam, train_moon, train_scaffold
from client_app.training import LocalJob, LocalResult, TrainResult, plain_rule, run_local_steps
from common.protocol import (
    PREVIOUS_UPDATE, SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA, STATE_MOON_PREVIOUS_MODEL, STATE_SCAFFOLD_CONTROL,
)
from common.algorithms.scaffold_control import scaffold_update_part
from common.records import Weights, from_record, to_record
from common.algorithms.rule_settings import FedProxSettings, MOONSettings, MoFedSAMSettings, SAMSettings


def read_state_weights(state: RecordDict, key: str) -> Weights | None:
    """Weights kept in node state under `key`, or None on the node's first round."""
    record = state.array_records.get(key)
    return from_record(record) if record is not None else None


def write_state_weights(state: RecordDict, key: str, weights: Weights) -> None:
    """Keep weights in node state for the next round this node takes part in."""
    state[key] = to_record(weights)


def fedavg_update(job: LocalJob) -> LocalResult:
    """FedAvg / FedAvgM client: K steps of SGD on cross-entropy."""
    return run_local_steps(job, plain_rule(job))


def _local(result: TrainResult, outgoing: dict | None = None) -> LocalResult:
    return LocalResult(result.train_loss, result.num_steps, outgoing=outgoing or {}, metrics=result.metrics)


def fedprox_update(job: LocalJob) -> LocalResult:
    """FedProx client: cross-entropy + (mu/2)||w - w_global||^2."""
    return _local(train_fedprox(job.model, job.batches(), mu=job.rule_settings(FedProxSettings).proximal_mu,
                                optimizer=job.optimizer, loss_fn=job.loss_fn))


def scaffold_update(job: LocalJob) -> LocalResult:
    """SCAFFOLD client: after each step w <- w - lr (c - c_i); option-II control update. A c_i whose update the
    server clipped is first scaled as the server scaled it (client_app/accepted_scale.py)."""
    apply_accepted_scale(job, STATE_SCAFFOLD_CONTROL)
    c_global = from_record(job.incoming.array_records[SCAFFOLD_CONTROL])
    result = train_scaffold(
        job.model, job.batches(), c_global=c_global,
        c_local=read_state_weights(job.state, STATE_SCAFFOLD_CONTROL), optimizer=job.optimizer, loss_fn=job.loss_fn,
    )
    write_state_weights(job.state, STATE_SCAFFOLD_CONTROL, result.control)
    keep_update_part(job, STATE_SCAFFOLD_CONTROL, scaffold_update_part(result.control_delta, c_global))
    return _local(result, {SCAFFOLD_CONTROL_DELTA: to_record(result.control_delta)})


def moon_update(job: LocalJob) -> LocalResult:
    """MOON client: CE + mu * contrastive(z, z_global, z_previous)."""
    moon = job.rule_settings(MOONSettings)
    result = train_moon(
        job.model, job.batches(), mu=moon.moon_mu, tau=moon.moon_tau,
        previous_model=read_state_weights(job.state, STATE_MOON_PREVIOUS_MODEL), optimizer=job.optimizer,
        loss_plugins=job.loss_plugins,  # FedCOG: KD term
    )
    write_state_weights(job.state, STATE_MOON_PREVIOUS_MODEL, result.previous_model)
    return _local(result)


def fedsam_update(job: LocalJob) -> LocalResult:
    """FedSAM client: SAM with the local gradient as ascent direction."""
    return _local(train_fedsam(job.model, job.batches(), rho=job.rule_settings(SAMSettings).sam_rho,
                               optimizer=job.optimizer, loss_fn=job.loss_fn))


def mofedsam_update(job: LocalJob) -> LocalResult:
    """MoFedSAM client: a local SAM step (weight alpha) mixed with the global momentum (client_app/rules.py)."""
    record = job.incoming.array_records.get(PREVIOUS_UPDATE)
    mofedsam = job.rule_settings(MoFedSAMSettings)
    return _local(train_mofedsam(
        job.model, job.batches(), rho=mofedsam.sam_rho, alpha=mofedsam.mofedsam_alpha,
        previous_update=from_record(record) if record is not None else None, num_steps=job.num_steps,
        optimizer=job.optimizer, loss_fn=job.loss_fn,
    ))

