"""The compressed uplink on the wire, as both apps see it (SPEC 3.5): record names, encoding streams, checked decoding.

With a codec other than none, a client replies with the packed payload
of `Q(w_i - w)` in the COMPRESSED_UPDATE record instead of its full model in
MODEL, and the server aggregates `w + server_lr * mean_i Q(Delta_i)`. An
algorithm's extra uplink records that have the model's parameter shapes
(SCAFFOLD's and FedGAMMA's control-variate deltas, FedLESAM-D's correction)
travel through the same codec, as the FedSynSAM paper assumes for its 2x
baselines: each becomes a record named `compressed-update:<name>`, and the
server decodes it back into `<name>` before the strategy looks at it, so the
strategies never see the codec.

Under whole-update qsgd (the model or bucket scope) a payload's
keys no longer name its tensors, so a compressed extra record also carries
TENSOR_MASK: one bit per model tensor (sorted names), set for the tensors it
holds (a control variate may cover the parameters but not the buffers).

Only the model's trainable parameters go through the codec. Its buffers
(BatchNorm's running mean and variance, its integer `num_batches_tracked`) are
statistics, not updates: quantised, a running variance came back negative and
the loss NaN in round 1. A compressed reply therefore carries the buffers'
values as they are, in their own dtypes, in the MODEL_BUFFERS record (absent
for a model without buffers, so such models' replies are unchanged), and the
server averages them apart from the update (server_app/strategies/fedavg.py).

Everything here is pure. The client keeps its error feedback residual in its
`Context.state` (common/uplink/encoding.py); the server keeps nothing. Payloads are
untrusted: every decoding problem is a ValueError naming the record and the
fault, which the server turns into a dropped, logged reply.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict

from common.uplink.payloads import KEY_SEPARATOR, decode_update
from common.uplink.quantizers import pack_bits, packed_length, unpack_bits
from common.algorithms.codec_settings import CodecSettings
from common.protocol import COMPRESSED_UPDATE, MODEL
from common.records import Weights, check_weights, from_record, to_record

# Record of a compressed reply holding the model's buffers, uncompressed (absent when the model has none).
MODEL_BUFFERS = "model-buffers"
# A compressed extra record is named COMPRESSED_UPDATE + this + the original name.
EXTRA_SEPARATOR = ":"
# Key of the tensor mask in a whole-update compressed extra record (starts with the separator: no tensor's key).
TENSOR_MASK = f"{KEY_SEPARATOR}tensors"


def tensor_mask(names: Iterable[str], model: Mapping[str, np.ndarray]) -> np.ndarray:
    """TENSOR_MASK of a record holding tensors `names`: one bit per model tensor in sorted order."""
    held = set(names)
    return pack_bits(np.array([name in held for name in sorted(model)], dtype=bool), 1)


def masked_tensors(mask: np.ndarray, model: Mapping[str, np.ndarray]) -> set[str]:
    """The model tensors a TENSOR_MASK marks; ValueError for a mask of the wrong dtype or length."""
    order = sorted(model)
    if not isinstance(mask, np.ndarray) or mask.dtype != np.uint8 or mask.size != packed_length(len(order), 1):
        raise ValueError(f"'{TENSOR_MASK}' must be {packed_length(len(order), 1)} uint8 bytes")
    bits = unpack_bits(mask.ravel(), 1, len(order))
    return {name for name, bit in zip(order, bits) if bit}


def encoding_rng(seed: int, server_round: int, partition_id: int, stream: int) -> np.random.Generator:
    """The stochastic-rounding generator of one record of one reply; replies are reproducible."""
    return np.random.default_rng([seed, server_round, partition_id, 3, stream])


def compressed_name(name: str) -> str:
    """Record name under which an extra record travels compressed."""
    return f"{COMPRESSED_UPDATE}{EXTRA_SEPARATOR}{name}"


def is_compressed_record(name: str) -> bool:
    """True for the compressed model update and for compressed extra records."""
    return name == COMPRESSED_UPDATE or name.startswith(COMPRESSED_UPDATE + EXTRA_SEPARATOR)


def is_compressible(values: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray]) -> bool:
    """An extra record can use the codec when it holds float32 tensors named and shaped like model tensors."""
    return bool(values) and all(
        name in model and arr.dtype == np.float32 and arr.shape == model[name].shape and KEY_SEPARATOR not in name
        for name, arr in values.items()
    )


def decode_record(record: ArrayRecord, shapes: Mapping[str, tuple[int, ...]], codec: CodecSettings, what: str) -> Weights:
    """Decode one compressed record against the expected tensor shapes; ValueError names `what`."""
    try:
        return decode_update(from_record(record), shapes, codec)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None


def _payload_tensor_names(record: ArrayRecord) -> set[str]:
    return {key.split(KEY_SEPARATOR, 1)[0] for key in record.keys()}


def decode_compressed_extras(content: RecordDict, model: Mapping[str, np.ndarray], codec: CodecSettings) -> None:
    """Replace every `compressed-update:<name>` record of a reply by the decoded `<name>` record, in place.

    The tensors a payload carries are read from its keys and must all be model
    tensors; which tensors an algorithm expects is checked afterwards by the
    strategy (`check_extra_records`) on the decoded record.
    """
    prefix = COMPRESSED_UPDATE + EXTRA_SEPARATOR
    for name in [n for n in content.array_records if n.startswith(prefix)]:
        original = name[len(prefix):]
        record = content.array_records[name]
        if codec.whole_vector:
            payload = from_record(record)
            if TENSOR_MASK not in payload:
                raise ValueError(f"{name}: lacks '{TENSOR_MASK}' ({codec.describe()})")
            try:
                tensors = masked_tensors(payload.pop(TENSOR_MASK), model)
                decoded = decode_update(payload, {t: model[t].shape for t in model if t in tensors}, codec)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
            del content[name]
            content[original] = to_record(decoded)
            continue
        tensors = _payload_tensor_names(record)
        unknown = sorted(tensors - set(model))
        if unknown:
            raise ValueError(f"{name}: payload for unknown tensors {unknown[:3]}")
        decoded = decode_record(record, {t: model[t].shape for t in model if t in tensors}, codec, name)
        del content[name]
        content[original] = to_record(decoded)


def decode_reply(content: RecordDict, current: Mapping[str, np.ndarray], codec: CodecSettings,
                 parameters: Collection[str] | None = None) -> Weights:
    """A train reply's update `w_i - w` of the trainable `parameters`, checked; buffers' entries are zeros.

    `parameters` are the names of the global model's trainable arrays (None:
    every array). Compressed extra records are decoded in place first.
    Uncompressed: the MODEL record must match the global model's names, shapes
    and dtypes and be finite. Compressed: the COMPRESSED_UPDATE payload must
    decode over the parameters (right keys, dtypes, lengths, finite norms and
    values, levels and indices in range), and the buffers arrive in
    MODEL_BUFFERS (`reply_buffers`). Buffers are not an update: their entries
    are float32 zeros, so norms, clipping and server steps see no buffer
    change, and the server takes their new values from `reply_buffers`. Any
    fault raises ValueError naming it.
    """
    decode_compressed_extras(content, current, codec)
    buffers = buffer_names(current, parameters)
    zeros = {name: np.zeros(current[name].shape, dtype=np.float32) for name in buffers}
    if codec.compression == "none":
        record = content.array_records.get(MODEL)
        if record is None:
            raise ValueError(f"reply lacks the '{MODEL}' record (the model)")
        received = from_record(record)
        problem = check_weights(received, current, "model")
        if problem:
            raise ValueError(problem)
        return {name: zeros[name] if name in zeros else received[name] - current[name] for name in current}
    record = content.array_records.get(COMPRESSED_UPDATE)
    if record is None:
        raise ValueError(f"reply lacks the '{COMPRESSED_UPDATE}' record ({codec.compression} compression is on)")
    shapes = {name: arr.shape for name, arr in current.items() if name not in zeros}
    update = decode_record(record, shapes, codec, COMPRESSED_UPDATE)
    reply_buffers(content, current, codec, parameters)  # checked here, so that a bad reply is dropped before averaging
    return {name: zeros[name] if name in zeros else update[name] for name in current}


def measured_update_norm(content: RecordDict, codec: CodecSettings) -> float | None:
    """The L2 norm of a qsgd-compressed reply's update as its client measured it before quantising, or None.

    A qsgd payload carries the norm of every vector it quantised (one per tensor, per bucket or for the whole
    update), and those vectors partition the update, so the update's norm is the root of their squares' sum.
    The decoded vector's own norm is not it: stochastic rounding to few levels lengthens a vector (a unit update
    under whole-model qsgd at 17 levels decodes to norm 2 to 4, benchmarks/results/bounded-influence-codec.md),
    so a bound on that norm would clip quantiser noise. None for other codecs (top-k sends the kept values
    themselves, and `none` the model): their decoded update is what was measured. Call it after `decode_reply`
    checked the payload.
    """
    record = content.array_records.get(COMPRESSED_UPDATE)
    if codec.compression != "qsgd" or record is None:
        return None
    norms = [np.asarray(array.numpy(), dtype=np.float64).ravel() for key, array in record.items()
             if key.endswith(f"{KEY_SEPARATOR}norm")]
    return float(np.sqrt(sum(float(np.sum(np.square(n))) for n in norms)))


def buffer_names(current: Mapping[str, np.ndarray], parameters: Collection[str] | None) -> list[str]:
    """The global model's arrays that are not trainable parameters, in its order."""
    return [] if parameters is None else [name for name in current if name not in set(parameters)]


def reply_buffers(content: RecordDict, current: Mapping[str, np.ndarray], codec: CodecSettings,
                  parameters: Collection[str] | None = None) -> Weights:
    """The node's buffers of a train reply, checked against the global model's (names, shapes, dtypes, finite).

    Uncompressed, they are the buffers of the MODEL record; compressed, the
    MODEL_BUFFERS record, which must hold exactly the model's buffers. A model
    without buffers gives an empty dict. Raises ValueError naming the fault.
    """
    names = buffer_names(current, parameters)
    if not names:
        return {}
    expected = {name: current[name] for name in names}
    if codec.compression == "none":
        received = from_record(content.array_records[MODEL])
        return {name: received[name] for name in names}
    record = content.array_records.get(MODEL_BUFFERS)
    if record is None:
        raise ValueError(f"reply lacks the '{MODEL_BUFFERS}' record (the model's buffers: {names[:3]}, ...)")
    received = from_record(record)
    problem = check_weights(received, expected, MODEL_BUFFERS)
    if problem:
        raise ValueError(problem)
    return received


def float32_equivalent_bytes(reply: Message, model_record_bytes: int) -> int:
    """Bytes the reply's arrays would take uncompressed.

    Uncompressed records count as they are; each compressed record counts as
    the float32 model record it replaces (`model_record_bytes`, e.g. the
    downlink model record's size), which is exact for the model update (its
    MODEL_BUFFERS record included) and for extras over all parameters.
    """
    if reply.has_error():
        return 0
    return sum(
        model_record_bytes if is_compressed_record(name) else record.count_bytes()
        for name, record in reply.content.array_records.items()
        if name != MODEL_BUFFERS  # the buffers are part of the model record counted for COMPRESSED_UPDATE
    )
