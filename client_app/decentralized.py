"""Node side of decentralized FL: mix the neighbours' models, then the node's update rule.

Round t on node i (SPEC 4.5, OledFL Algorithm 1):
1. mix: x_i = W_ii z_i^{t-1} + sum_{j != i} W_ij z_j^{t-1}. The neighbours'
   models come from the relay, either one by one or already summed
   (`relay-mixing`); the node's own last model z_i^{t-1} comes from its own
   `Context.state` (a node always holds its own model; it is the one copy
   that never has to cross the network). Before the node's first round it is
   the run's seeded initial model x^0, exactly as Algorithm 1 initialises
   z_i^{-1} = x^0.
2. update: `dpsgd` one SGD step; `dfedavg` K local steps of SGD; `dfedavgm`
   the same with its local momentum (`DFedAvgMSettings`); `dfedsam` SAM steps;
   `oledfl-sgd` / `oledfl-sam` first restart from x_i + beta (x_i - z_i^{t-1})
   (Ole), then DFedAvg / DFedSAM steps.
3. keep z_i^t in `Context.state` for the next round (mixing and Ole), with
   the round it was made in, and send it to the relay.

The rules' settings (their groups: `SAMSettings`, `OledFLSettings`, `DFedAvgMSettings`) and the round's
learning rate come from the relay's train message (`LocalJob.rule_settings`), as a centralized
rule's do; the relay sends no codec (decentralized nodes exchange full models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, RecordDict

from client_app.training import GradientRule, LocalJob, LocalResult, plain_rule, run_local_steps
from common.run.config import RunConfig
from client_app.rules import gossip_mix, ole_restart, sam_gradients
from common.algorithms.gossip import mix_with_own, record_round, round_record
from common.protocol import GOSSIP, GOSSIP_MIXED, GOSSIP_MODEL_PREFIX, STATE_OWN_MODEL, STATE_OWN_ROUND
from common.records import Weights, check_weights, from_record, load_weights, model_weights, to_record
from common.run.task import make_model
from common.algorithms.rule_settings import DFedAvgMSettings, OledFLSettings, SAMSettings


def is_gossip_round(content: RecordDict) -> bool:
    """Whether a train message is a decentralized round (it carries mixing weights)."""
    return GOSSIP in content.config_records


def own_model(state: RecordDict, cfg: RunConfig) -> tuple[Weights, int]:
    """(z_i^{t-1}, the round it is from); the seeded x^0 and round 0 before the node's first round."""
    record = state.array_records.get(STATE_OWN_MODEL)
    if record is None:
        return model_weights(make_model(cfg, seeded=True)), 0
    stamp = state.array_records.get(STATE_OWN_ROUND)
    own_round = record_round(stamp) if stamp is not None else 0
    return from_record(record), own_round


def keep_own_model(state: RecordDict, weights: Weights, server_round: int) -> None:
    """Store z_i^t and its round in the node's state."""
    state[STATE_OWN_MODEL] = to_record(weights)
    state[STATE_OWN_ROUND] = round_record(server_round)


def _checked(record: ArrayRecord, template: Weights, what: str) -> Weights:
    weights = from_record(record)
    problem = check_weights(weights, template, what)
    if problem:
        raise ValueError(problem)
    return weights


def gossip_start_weights(content: RecordDict, state: RecordDict, cfg: RunConfig) -> Weights:
    """x_i of this round from the relay's message and the node's own last model."""
    gossip = content.config_records[GOSSIP]
    own, _ = own_model(state, cfg)
    neighbours = [int(p) for p in gossip["neighbours"]]
    weights = [float(w) for w in gossip["weights"]]
    if gossip["relay-mixed"]:
        record = content.array_records.get(GOSSIP_MIXED)
        partial = _checked(record, own, "relay-mixed model") if record is not None else None
        if partial is None and neighbours:
            raise ValueError(f"the relay named neighbours {neighbours} but sent no '{GOSSIP_MIXED}' record")
    else:
        models = []
        for pid in neighbours:
            record = content.array_records.get(f"{GOSSIP_MODEL_PREFIX}{pid}")
            if record is None:
                raise ValueError(f"the relay named neighbour {pid} but sent no '{GOSSIP_MODEL_PREFIX}{pid}' record")
            models.append(_checked(record, own, f"model of neighbour {pid}"))
        return gossip_mix(own, float(gossip["self-weight"]), models, weights)
    return mix_with_own(own, float(gossip["self-weight"]), partial)


def gossip_start_model(content: RecordDict, state: RecordDict, cfg: RunConfig, device: torch.device) -> torch.nn.Module:
    """The node's model for a decentralized round: the mix x_i, on the node's device."""
    model = make_model(cfg)
    load_weights(model, gossip_start_weights(content, state, cfg))
    return model.to(device)


RuleFactory = Callable[[LocalJob], GradientRule]


def sam_rule(job: LocalJob) -> GradientRule:
    """SAM with the local gradient as ascent direction (DFedSAM, OledFL-SAM), radius SAM's `sam_rho` (`SAMSettings`)."""
    return sam_gradients(job.model, job.loss_fn, job.rule_settings(SAMSettings).sam_rho)


def decentralized_round(job: LocalJob, rule: RuleFactory, *, ole: bool = False, **recipe_changes) -> LocalResult:
    """Ole restart (optional), local steps with `rule`, then keep z_i^t in state.

    `recipe_changes` adjust the round's local training recipe for one rule (D-PSGD's single step, DFedAvgM's
    momentum) without touching what the message said.
    """
    own_previous, own_round = own_model(job.state, job.cfg)
    metrics: dict[str, float] = {"own-model-round": own_round}
    if ole:  # ||x_i - z_i^{t-1}||: the Ole direction before scaling by beta
        beta = job.rule_settings(OledFLSettings).ole_beta
        metrics["ole-direction-norm"] = ole_restart(job.model, own_previous, beta)
    if recipe_changes:
        job.recipe = dataclasses.replace(job.recipe, **recipe_changes)
    result = run_local_steps(job, rule(job))
    keep_own_model(job.state, model_weights(job.model), job.server_round)
    result.metrics.update(metrics)
    return result


def dpsgd_update(job: LocalJob) -> LocalResult:
    """D-PSGD: one SGD step (one mini-batch) from the mixed model."""
    return decentralized_round(job, plain_rule, local_steps=1)


def dfedavg_update(job: LocalJob) -> LocalResult:
    """DFedAvg: K local steps of SGD from the mixed model."""
    return decentralized_round(job, plain_rule)


def dfedavgm_update(job: LocalJob) -> LocalResult:
    """DFedAvgM: DFedAvg with local heavy-ball momentum (buffer reset every round)."""
    return decentralized_round(job, plain_rule, momentum=job.rule_settings(DFedAvgMSettings).dfedavgm_momentum)


def dfedsam_update(job: LocalJob) -> LocalResult:
    """DFedSAM: K local SAM steps from the mixed model."""
    return decentralized_round(job, sam_rule)


def oledfl_sgd_update(job: LocalJob) -> LocalResult:
    """OledFL-SGD: Ole restart, then DFedAvg's local steps."""
    return decentralized_round(job, plain_rule, ole=True)


def oledfl_sam_update(job: LocalJob) -> LocalResult:
    """OledFL-SAM: Ole restart, then DFedSAM's local steps."""
    return decentralized_round(job, sam_rule, ole=True)

