"""The arithmetic of decentralized (gossip) rounds, shared by the relay and the nodes.

In decentralized FL node i starts round t from x_i = sum_j W_ij z_j, the
mix of the models its neighbours (and itself) produced in round t-1. The
ServerApp is only a relay: it either passes the neighbours' models on, or
(`relay-mixing`) sums them for the node. Either way the node adds its own
term W_ii z_i from its own state, so the two modes must round identically:
both call `neighbour_sum` on the same models in the same (partition) order
and then `mix_with_own`. All sums run in float64 and are cast to the model's
dtype once, at the same points, which makes the two modes bitwise equal.

OledFL's Ole restart, the average model x-bar, the consensus distance and
"rounds to target accuracy" are small pure functions here too, so they are
unit-tested against hand-computed values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord

from common.algorithm_table import ALGORITHMS
from common.records import Weights
from common.algorithms.topology import renormalize_present

# The algorithms whose ServerApp is a relay (server_app/strategies/relay.py), from common/algorithm_table.py's table.
DECENTRALIZED_ALGORITHMS: tuple[str, ...] = tuple(name for name, algorithm in ALGORITHMS.items() if algorithm.decentralized)


def dropout_mixing(w: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The round's mixing matrix when some nodes sent no model last round.

    Present rows are `renormalize_present`'s: each present node averages the
    models it actually receives, in W's proportions. For an absent node we
    differ from `renormalize_present` (which keeps it on its own model): the
    node is usually alive again (it failed or timed out once) and holds its
    own, older model, so it averages that with its present neighbours' fresh
    models, renormalized over them and itself. Isolating it instead would make
    it fall a round further behind everyone it could have caught up with.
    Every row is non-negative and sums to 1.
    """
    present = np.asarray(present, dtype=bool)
    out = renormalize_present(w, present)
    for absent in np.flatnonzero(~present):
        with_self = present.copy()
        with_self[absent] = True
        out[absent] = renormalize_present(w, with_self)[absent]
    return out


def _is_float(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.floating)


def neighbour_sum(models: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> Weights | None:
    """sum_j weights_j * models_j, accumulated in float64 in the given order, cast back.

    None when there is nothing to sum (a node without present neighbours).
    Non-float arrays (integer buffers) are not averaged; they are left out and
    the node keeps its own.
    """
    if len(models) != len(weights):
        raise ValueError(f"{len(models)} models but {len(weights)} weights")
    if not models:
        return None
    out: Weights = {}
    for name, first in models[0].items():
        if not _is_float(first):
            continue
        total = np.zeros(first.shape, dtype=np.float64)
        for model, weight in zip(models, weights):
            total += float(weight) * model[name].astype(np.float64)
        out[name] = total.astype(first.dtype)
    return out


def mix_with_own(own: Mapping[str, np.ndarray], self_weight: float, partial: Mapping[str, np.ndarray] | None) -> Weights:
    """x_i = W_ii z_i + sum_{j != i} W_ij z_j from the node's own model and the neighbours' sum."""
    out: Weights = {}
    for name, mine in own.items():
        if not _is_float(mine):
            out[name] = mine.copy()
            continue
        total = float(self_weight) * mine.astype(np.float64)
        if partial is not None:
            total += partial[name].astype(np.float64)
        out[name] = total.astype(mine.dtype)
    return out


def ole_start(mixed: Mapping[str, np.ndarray], own_previous: Mapping[str, np.ndarray], beta: float) -> Weights:
    """OledFL's start point x_i + beta (x_i - z_i^{t-1}) (Eq. 3 of the paper).

    With beta = 0 this returns x_i exactly (x + 0 is exact in float64 and the
    cast back is lossless), which is why OledFL-SGD with beta = 0 is DFedAvg.
    """
    out: Weights = {}
    for name, x in mixed.items():
        if not _is_float(x):
            out[name] = x.copy()
            continue
        x64 = x.astype(np.float64)
        out[name] = (x64 + beta * (x64 - own_previous[name].astype(np.float64))).astype(x.dtype)
    return out


def average_model(models: Sequence[Mapping[str, np.ndarray]]) -> Weights:
    """x-bar = (1/m) sum_i z_i in float64, cast to each array's dtype (integers: the first node's)."""
    if not models:
        raise ValueError("no models to average")
    out: Weights = {}
    for name, first in models[0].items():
        if not _is_float(first):
            out[name] = first.copy()
            continue
        total = np.zeros(first.shape, dtype=np.float64)
        for model in models:
            total += model[name].astype(np.float64)
        out[name] = (total / len(models)).astype(first.dtype)
    return out


def consensus_distance(models: Sequence[Mapping[str, np.ndarray]], mean: Mapping[str, np.ndarray]) -> float:
    """(1/m) sum_i ||z_i - x-bar||^2 over all float arrays (SPEC 3.6)."""
    total = 0.0
    for model in models:
        for name, ref in mean.items():
            if _is_float(ref):
                diff = model[name].astype(np.float64) - ref.astype(np.float64)
                total += float(np.sum(diff * diff))
    return total / len(models)


def parse_targets(text: str) -> tuple[float, ...]:
    """'0.7, 0.75' -> (0.7, 0.75); raises ValueError for anything else or a value outside (0, 1]."""
    targets = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        value = float(item)
        if not 0 < value <= 1:
            raise ValueError(f"target accuracy {value} is not in (0, 1]")
        targets.append(value)
    return tuple(targets)


def rounds_to_targets(accuracy_by_round: Sequence[tuple[int, float]], targets: Sequence[float]) -> dict[str, int | None]:
    """First round whose accuracy reaches each target (None: never), keyed by the target as text.

    Rounds are taken in increasing order; only evaluated rounds are given.
    """
    ordered = sorted(accuracy_by_round)
    out: dict[str, int | None] = {}
    for target in targets:
        out[f"{target:g}"] = next((rnd for rnd, acc in ordered if acc >= target), None)
    return out


def round_record(server_round: int) -> ArrayRecord:
    """A round number as an ArrayRecord, the form of node state the relay can re-send after a resume."""
    return ArrayRecord({"round": Array(np.array([server_round], dtype=np.int64))})


def record_round(record: ArrayRecord) -> int:
    """The round number stored by `round_record`."""
    return int(record["round"].numpy()[0])
