"""Conversions between model parameters, numpy arrays and Flower records.

Models travel as `ArrayRecord`s keyed by state-dict name. The server keeps the
global model as a dict of numpy arrays (`Weights`), which is what the
aggregation math works on; clients load it into torch modules. Node state in
`Context.state` uses the same records, so nothing in state needs pickling.

Every array keeps its dtype and shape end to end: a model's state dict holds
more than float32 parameters (BatchNorm's float running statistics and its 0-d
int64 `num_batches_tracked`), and `load_state_dict` on a node, like the reply
checks on the server, refuses an array whose shape changed. Which arrays are
trainable parameters and which are buffers is the module's knowledge
(`named_parameters`); where only the arrays are at hand, `parameter_names`
applies torch's naming of normalisation statistics (see there).

The conversions between arrays and records are numpy's alone, and torch is imported only by the
functions that take a torch module: the server's aggregation runs without loading torch
(`import fedsynth.strategies` does not load it, tests/test_light_import.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict

if TYPE_CHECKING:
    from torch import nn

Weights = dict[str, np.ndarray]


def model_weights(model: nn.Module) -> Weights:
    """A model's state dict as numpy copies on the CPU, each in its own dtype and shape."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def load_weights(model: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Load numpy weights into a model, strictly (names and shapes must match)."""
    import torch

    state = OrderedDict((name, torch.from_numpy(np.asarray(arr))) for name, arr in weights.items())
    model.load_state_dict(state, strict=True)


def to_record(weights: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Named numpy arrays -> ArrayRecord (keys, dtypes and shapes kept, 0-d arrays included).

    `np.require(..., "C")`, not `np.ascontiguousarray`: the latter returns at least
    one dimension, so a 0-d array (BatchNorm's `num_batches_tracked`) would come
    back with shape (1,) and no longer load into its module.
    """
    return ArrayRecord({name: Array(np.require(arr, requirements="C")) for name, arr in weights.items()})


def from_record(record: ArrayRecord) -> Weights:
    """ArrayRecord -> named numpy arrays."""
    return {name: array.numpy() for name, array in record.items()}


def message_array_bytes(message: Message) -> int:
    """Bytes of all ArrayRecords in a message's content, as Flower serialises them."""
    if message.has_error():
        return 0
    return record_dict_array_bytes(message.content)


def record_dict_array_bytes(content: RecordDict) -> int:
    """Bytes of all ArrayRecords in a RecordDict."""
    return sum(record.count_bytes() for record in content.array_records.values())


# The buffers torch's normalisation layers (`_NormBase`: BatchNorm, InstanceNorm with running
# statistics, SyncBatchNorm) put in a state dict, by the last part of their names.
NORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def module_parameter_names(model: nn.Module) -> list[str]:
    """The trainable arrays of a module: its `named_parameters`, in state-dict order."""
    return [name for name, _ in model.named_parameters()]


def parameter_names(weights: Mapping[str, np.ndarray]) -> list[str]:
    """The arrays of a state dict that are trainable parameters, judged from the arrays alone.

    A floating array is a parameter unless its name ends in one of torch's
    normalisation statistics (NORM_STATISTICS); a non-floating array (an integer
    counter) never is, since torch parameters are floating. Exact for torch's
    and torchvision's layers; a module's own buffers need `module_parameter_names`.
    """
    return [name for name, arr in weights.items()
            if np.issubdtype(arr.dtype, np.floating) and name.rsplit(".", 1)[-1] not in NORM_STATISTICS]


def weights_like(template: Mapping[str, np.ndarray], value: float = 0.0) -> Weights:
    """Arrays of the template's shapes filled with a value (float32)."""
    return {name: np.full(arr.shape, value, dtype=np.float32) for name, arr in template.items()}


def subtract(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> Weights:
    """a - b per tensor."""
    return {name: a[name] - b[name] for name in a}


def flat_norm(weights: Mapping[str, np.ndarray]) -> float:
    """Global L2 norm over all tensors."""
    return float(np.sqrt(sum(float(np.sum(np.square(w, dtype=np.float64))) for w in weights.values())))


def check_weights(received: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], what: str) -> str | None:
    """Why `received` cannot stand in for `expected` (names, shapes, dtypes, finiteness), or None."""
    missing = sorted(set(expected) - set(received))
    extra = sorted(set(received) - set(expected))
    if missing or extra:
        return f"{what}: missing arrays {missing[:3]}, unexpected arrays {extra[:3]}"
    for name, ref in expected.items():
        arr = received[name]
        if arr.shape != ref.shape:
            return f"{what}: array '{name}' has shape {arr.shape}, expected {ref.shape}"
        if arr.dtype != ref.dtype:
            return f"{what}: array '{name}' has dtype {arr.dtype}, expected {ref.dtype}"
        if not np.all(np.isfinite(arr)):
            return f"{what}: array '{name}' has non-finite values"
    return None
