"""The node's half of keeping its state equal to the server's after bounded influence clipped its update.

SCAFFOLD's c_i (also FedGamma's and FedLESAM-S's) and FedDyn's g_i (FedLESAM-D, FedSMOO) change each round by a
part that follows the node's update. The server tells a node whose update it scaled by s the scale and the round
in its next train message (common/algorithms/accepted_scale.py); the node keeps the update's part of its last state
change with its round, and before it trains applies `state + (s - 1) part` when the rounds match.

The kept part lives in the node's `Context.state` beside the state itself, under `<state key>-update-part` and
`<state key>-update-round`.
"""

from __future__ import annotations

from client_app.training import LocalJob
from common.algorithms.accepted_scale import accepted_scale, rescaled_state
from common.algorithms.gossip import record_round, round_record
from common.records import Weights, from_record, to_record


def _part_key(state_key: str) -> str:
    return f"{state_key}-update-part"


def _round_key(state_key: str) -> str:
    return f"{state_key}-update-round"


def apply_accepted_scale(job: LocalJob, state_key: str) -> None:
    """Before this round's training: scale the node's last state change (under `state_key`) as the server
    scaled the update it came with, if this round's message says so for the round the node kept; else nothing.

    ValueError names the setting when the message's notice is malformed (common/algorithms/accepted_scale.py).
    """
    notice = accepted_scale(job.settings)
    state = job.state
    if notice is None or state_key not in state.array_records or _part_key(state_key) not in state.array_records:
        return
    scale, clipped_round = notice
    stamp = state.array_records.get(_round_key(state_key))
    if stamp is None or record_round(stamp) != clipped_round:
        return  # applied already, or the node trained since: the notice is not about the part it keeps
    current = from_record(state.array_records[state_key])
    part = from_record(state.array_records[_part_key(state_key)])
    if set(part) != set(current) or any(part[n].shape != current[n].shape for n in current):
        raise ValueError(f"node state {_part_key(state_key)!r} does not match {state_key!r}: its arrays differ")
    state[state_key] = to_record(rescaled_state(current, part, scale))
    del state[_part_key(state_key)]
    del state[_round_key(state_key)]


def keep_update_part(job: LocalJob, state_key: str, part: Weights) -> None:
    """After training: keep the update's part of the state change just made, with this round, for a notice."""
    job.state[_part_key(state_key)] = to_record(part)
    job.state[_round_key(state_key)] = round_record(job.server_round)
