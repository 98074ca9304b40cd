"""The uplink codec's payloads (SPEC §3.5): an update's named tensors <-> the named arrays a client sends.

``encode_update`` turns an update into a payload under a codec (a ``CodecSettings``,
``common.algorithms.codec_settings``) with the quantisers of ``common.uplink.quantizers``;
``decode_update`` checks an untrusted payload and rebuilds the update; the
size functions give a payload's bytes on the wire.

Payload keys per tensor ``name``:

* ``none``: ``name`` (float32, original shape)
* ``qsgd``, scope ``tensor``: ``name::norm`` (float32, shape (1,)),
  ``name::signs`` (uint8, 1 bit per coordinate, 1 = negative),
  ``name::levels`` (uint8, ``codec.level_bits`` bits per coordinate)
* ``qsgd``, scope ``model``: one payload for the whole update,
  ``::model::norm`` (float32, shape (1,)), ``::model::signs``,
  ``::model::levels`` over the concatenation of the tensors in sorted name
  order
* ``qsgd``, scope ``bucket``: ``::bucket-B::norm`` (float32, one per bucket of
  B coordinates), ``::bucket-B::signs``, ``::bucket-B::levels``; B is in the
  key, so a payload of another scope or bucket length never decodes
* ``topk``: ``name::values`` (float32, shape (k,)), ``name::indices`` (uint8,
  ``index_bits(n)`` bits per kept coordinate, strictly increasing)

``decode_update`` treats the payload as untrusted input from a client: every
structural problem raises ``ValueError`` naming the tensor and the fault.
All functions are pure; randomness comes only from the ``rng`` argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from common.uplink.quantizers import (
    FloatArray,
    index_bits,
    pack_bits,
    packed_length,
    qsgd_dequantize_tensor,
    qsgd_quantize_buckets,
    qsgd_quantize_tensor,
    topk_count,
    topk_tensor,
    unpack_bits,
)
from common.algorithms.codec_settings import CodecSettings

__all__ = [
    "KEY_SEPARATOR",
    "decode_update",
    "encode_update",
    "expected_payload_nbytes",
    "float32_nbytes",
    "payload_keys",
    "payload_nbytes",
    "vector_keys",
]

KEY_SEPARATOR = "::"
# a qsgd payload's three arrays, by their names on the wire: the norms, the packed signs and the packed levels
QSGD_PARTS: tuple[str, str, str] = ("norm", "signs", "levels")


# ---------------------------------------------------------------- payload structure


def payload_keys(name: str, codec: CodecSettings) -> tuple[str, ...]:
    """Payload keys that carry tensor ``name`` under ``codec`` (per-tensor payloads only)."""
    if codec.compression == "none":
        return (name,)
    if not name or KEY_SEPARATOR in name:
        # Otherwise keys of different tensors could collide or be misattributed.
        raise ValueError(f"tensor {name!r}: name must be non-empty and not contain {KEY_SEPARATOR!r}")
    parts = QSGD_PARTS if codec.compression == "qsgd" else ("values", "indices")
    return tuple(f"{name}{KEY_SEPARATOR}{part}" for part in parts)


def vector_keys(codec: CodecSettings) -> tuple[str, str, str]:
    """The three keys of a whole-update qsgd payload (``model`` or ``bucket`` scope).

    They start with the separator, so no per-tensor key (whose tensor name is
    non-empty) can equal one, and the bucket length is part of them.
    """
    tag = "model" if codec.qsgd_scope == "model" else f"bucket-{codec.qsgd_bucket}"
    return tuple(f"{KEY_SEPARATOR}{tag}{KEY_SEPARATOR}{part}" for part in QSGD_PARTS)  # type: ignore[return-value]


def expected_payload_nbytes(sizes: Mapping[str, int], codec: CodecSettings) -> int:
    """Bytes of array data ``encode_update`` produces for tensors of these element counts.

    The hand-computable wire size of each codec: per-tensor qsgd pays a
    float32 norm and two bit-packed streams per tensor, whole-update qsgd one
    set for the concatenation (one norm per bucket in ``bucket`` scope).
    """
    if codec.compression == "none":
        return 4 * sum(sizes.values())
    if codec.compression == "topk":
        return sum(
            4 * (k := topk_count(n, codec.topk_ratio)) + packed_length(k, index_bits(n)) for n in sizes.values()
        )
    def qsgd_bytes(n: int, norms: int) -> int:
        return 4 * norms + packed_length(n, 1) + packed_length(n, codec.level_bits)
    if codec.qsgd_scope == "tensor":
        return sum(qsgd_bytes(n, 1) for n in sizes.values())
    total = sum(sizes.values())
    norms = 1 if codec.qsgd_scope == "model" else -(-total // codec.qsgd_bucket)
    return qsgd_bytes(total, norms)


def payload_nbytes(payload: Mapping[str, np.ndarray]) -> int:
    """Bytes of array data in a payload (what compression is judged by)."""
    return sum(int(array.nbytes) for array in payload.values())


def float32_nbytes(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Bytes the same tensors take as raw float32 (the uncompressed baseline)."""
    return sum(4 * math.prod(shape) for shape in shapes.values())


# ------------------------------------------------------------------------ encoding


def encode_update(
    delta: Mapping[str, np.ndarray], codec: CodecSettings, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Compress ``delta`` under ``codec``: tensor by tensor, or as one vector for whole-update qsgd.

    Per-tensor codecs visit the tensors in ``delta``'s order, which fixes how
    ``rng`` is consumed; whole-update qsgd concatenates them in sorted name
    order, the order :func:`decode_update` rebuilds. The input is never
    modified. Non-finite values raise ValueError naming the tensor: they would
    poison the server's aggregate.
    """
    if codec.whole_vector:
        return _encode_vector(delta, codec, rng)
    payload: dict[str, np.ndarray] = {}
    for name, tensor in delta.items():
        keys = payload_keys(name, codec)
        flat = np.asarray(tensor, dtype=np.float32).ravel()
        try:
            arrays = _encode_flat(flat, codec, rng)
        except ValueError as err:
            raise ValueError(f"tensor {name!r}: {err}") from None
        if codec.compression == "none":
            arrays = (arrays[0].reshape(np.shape(tensor)),)
        payload.update(zip(keys, arrays))
    return payload


def _encode_vector(
    delta: Mapping[str, np.ndarray], codec: CodecSettings, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Whole-update qsgd: the tensors in sorted name order as one vector, one payload."""
    names = sorted(delta)
    for name in names:
        payload_keys(name, CodecSettings("qsgd"))  # the same name rules as per-tensor payloads
        if not np.isfinite(np.asarray(delta[name], dtype=np.float32)).all():
            raise ValueError(f"tensor {name!r}: non-finite values")
    parts = [np.asarray(delta[name], dtype=np.float32).ravel() for name in names]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    bucket = max(flat.size, 1) if codec.qsgd_scope == "model" else codec.qsgd_bucket
    norms, negative, level = qsgd_quantize_buckets(flat, codec.qsgd_levels, bucket, rng)
    arrays = (norms, pack_bits(negative, 1), pack_bits(level, codec.level_bits))
    return dict(zip(vector_keys(codec), arrays))


def _encode_flat(
    flat: FloatArray, codec: CodecSettings, rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    """Encode one flattened tensor into its payload arrays, in payload_keys order."""
    if codec.compression == "qsgd":
        norm, negative, level = qsgd_quantize_tensor(flat, codec.qsgd_levels, rng)
        return (
            np.array([norm], dtype=np.float32),
            pack_bits(negative, 1),
            pack_bits(level, codec.level_bits),
        )
    if not np.isfinite(flat).all():
        raise ValueError("non-finite values")
    if codec.compression == "topk":
        indices, values = topk_tensor(flat, topk_count(flat.size, codec.topk_ratio))
        return values, pack_bits(indices, index_bits(flat.size))
    return (flat.copy(),)


# ------------------------------------------------------------------------ decoding


def decode_update(
    payload: Mapping[str, np.ndarray],
    shapes: Mapping[str, tuple[int, ...]],
    codec: CodecSettings,
) -> dict[str, np.ndarray]:
    """Rebuild float32 tensors of the given ``shapes`` from an untrusted payload.

    Raises ValueError, naming the tensor, for missing or unexpected keys, wrong
    dtypes or lengths, non-finite or negative norms, non-finite values,
    out-of-range levels and out-of-range or unsorted indices. A payload of
    another qsgd scope (or bucket length) has other keys and is refused.
    """
    if codec.whole_vector:
        return _decode_vector(payload, shapes, codec)
    expected = {name: payload_keys(name, codec) for name in shapes}
    known = {key for keys in expected.values() for key in keys}
    unexpected = sorted(set(payload) - known)
    if unexpected:
        raise ValueError(f"unexpected payload keys {unexpected} for {codec.describe()}")
    result: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        missing = [key for key in expected[name] if key not in payload]
        if missing:
            raise ValueError(f"tensor {name!r}: missing payload keys {missing}")
        arrays = [payload[key] for key in expected[name]]
        try:
            flat = _decode_flat(arrays, math.prod(shape), codec)
        except ValueError as err:
            raise ValueError(f"tensor {name!r}: {err}") from None
        result[name] = flat.reshape(shape)
    return result


def _decode_vector(
    payload: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], codec: CodecSettings
) -> dict[str, np.ndarray]:
    """Validate and decode a whole-update qsgd payload into the tensors of ``shapes``."""
    keys = vector_keys(codec)
    unexpected = sorted(set(payload) - set(keys))
    if unexpected:
        raise ValueError(f"unexpected payload keys {unexpected[:5]} for {codec.describe()}")
    missing = [key for key in keys if key not in payload]
    if missing:
        raise ValueError(f"missing payload keys {missing} for {codec.describe()}")
    names = sorted(shapes)
    sizes = [math.prod(shapes[name]) for name in names]
    n = sum(sizes)
    bucket = max(n, 1) if codec.qsgd_scope == "model" else codec.qsgd_bucket
    count = -(-n // bucket) if n else 0
    norm, signs, levels = (payload[key] for key in keys)
    s, width = codec.qsgd_levels, codec.level_bits
    _check_qsgd_arrays((norm, signs, levels), count, n, width)
    norms = norm.ravel()
    if not np.isfinite(norms).all() or (norms < 0).any():
        raise ValueError("norms must be finite and >= 0")
    negative = unpack_bits(signs.ravel(), 1, n).view(np.bool_)
    level = unpack_bits(levels.ravel(), width, n)
    if n and int(level.max()) > s:
        raise ValueError(f"level {int(level.max())} exceeds the {s} qsgd levels")
    flat = qsgd_dequantize_tensor(norms, negative, level, s, bucket=bucket)
    result: dict[str, np.ndarray] = {}
    offset = 0
    for name, size in zip(names, sizes):
        result[name] = flat[offset:offset + size].reshape(shapes[name])
        offset += size
    return {name: result[name] for name in shapes}


def _decode_flat(arrays: list[np.ndarray], n: int, codec: CodecSettings) -> FloatArray:
    """Validate and decode one tensor's payload arrays into a 1-D float32 vector."""
    if codec.compression == "qsgd":
        return _decode_qsgd(*arrays, n=n, codec=codec)
    if codec.compression == "topk":
        return _decode_topk(*arrays, n=n, codec=codec)
    (values,) = arrays
    _check_array(values, "values", np.dtype(np.float32), n)
    if not np.isfinite(values).all():
        raise ValueError("non-finite values")
    return values.ravel().copy()


def _decode_qsgd(
    norm: np.ndarray, signs: np.ndarray, levels: np.ndarray, *, n: int, codec: CodecSettings
) -> FloatArray:
    """Validate and dequantise one qsgd-encoded tensor."""
    s, width = codec.qsgd_levels, codec.level_bits
    _check_qsgd_arrays((norm, signs, levels), 1, n, width)
    norm_value = norm.reshape(())[()]
    if not np.isfinite(norm_value) or norm_value < 0:
        raise ValueError(f"norm must be finite and >= 0, got {norm_value}")
    negative = unpack_bits(signs.ravel(), 1, n).view(np.bool_)
    level = unpack_bits(levels.ravel(), width, n)
    if n and int(level.max()) > s:
        raise ValueError(f"level {int(level.max())} exceeds the {s} qsgd levels")
    return qsgd_dequantize_tensor(norm_value, negative, level, s)


def _decode_topk(
    values: np.ndarray, indices: np.ndarray, *, n: int, codec: CodecSettings
) -> FloatArray:
    """Validate and scatter one top-k-encoded tensor."""
    k = topk_count(n, codec.topk_ratio)
    _check_array(values, "values", np.dtype(np.float32), k)
    _check_array(indices, "indices", np.dtype(np.uint8), packed_length(k, index_bits(n)))
    if not np.isfinite(values).all():
        raise ValueError("non-finite values")
    positions = unpack_bits(indices.ravel(), index_bits(n), k)
    if k and int(positions.max()) >= n:
        raise ValueError(f"index {int(positions.max())} out of range for {n} coordinates")
    # Duplicates would make the scatter ambiguous; the encoder emits sorted indices.
    if k > 1 and not (positions[1:] > positions[:-1]).all():
        raise ValueError("indices must be strictly increasing")
    out = np.zeros(n, dtype=np.float32)
    out[positions] = values.ravel()
    return out


def _check_qsgd_arrays(arrays: tuple[np.ndarray, ...], norms: int, n: int, width: int) -> None:
    """Reject qsgd payload arrays (`QSGD_PARTS`) of another dtype or length: `norms` float32 norms, then the
    packed signs of `n` coordinates and their packed levels of `width` bits."""
    for array, part, dtype, size in zip(arrays, QSGD_PARTS, (np.float32, np.uint8, np.uint8),
                                        (norms, packed_length(n, 1), packed_length(n, width))):
        _check_array(array, part, np.dtype(dtype), size)


def _check_array(array: np.ndarray, part: str, dtype: np.dtype, size: int) -> None:
    """Reject a payload array that is not an ndarray of ``dtype`` with ``size`` elements."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{part} must be a numpy array, got {type(array).__name__}")
    if array.dtype != dtype:
        raise ValueError(f"{part} has dtype {array.dtype}, expected {dtype}")
    if array.size != size:
        raise ValueError(f"{part} has {array.size} elements, expected {size}")
