"""Uplink compression codecs for model updates (SPEC §3.5).

A client sends ``Q(Δ_i)`` with ``Δ_i = w_local − w_global`` instead of the raw
float32 update, to cut uplink bytes.

Scopes (qsgd)
-------------
``tensor``
    Every named tensor is flattened and quantised with its own norm (one
    payload of three arrays per tensor).
``model``
    The FedSynSAM paper's eq. 3: all tensors, in sorted name order, form one
    vector with one L2 norm and one payload. The paper's "b-bit" quantiser
    has ``a = 2^b + 1`` levels (:func:`paper_levels`: 17 at b = 4, 257 at
    b = 8), which need ``1 + ceil(log2(a + 1))`` bits per coordinate on the
    wire (6 and 10): results name the level count and those bits, never the
    nominal b alone.
``bucket``
    The model vector (as in ``model``) cut into buckets of ``bucket_size``
    coordinates, one norm per bucket, as public QSGD implementations do (far
    lower variance, one float32 norm per bucket).

Methods
-------
``none``
    The payload is the float32 tensors themselves (the baseline).
``qsgd``
    Stochastic quantisation (Alistarh et al., 2017). With ``s`` levels,
    ``Q(v)_j = ‖v‖₂ · sign(v_j) · ξ_j`` where ``ξ_j ∈ {l/s, (l+1)/s}``,
    ``l = floor(s·|v_j|/‖v‖)``, rounding up with probability ``s·|v_j|/‖v‖ − l``
    so that ``E[Q(v)] = v``. ``bits = b`` means b bits per coordinate on the
    wire: 1 sign bit plus ``b − 1`` level bits, hence ``s = 2^(b−1) − 1``.
    ``levels`` overrides ``s`` directly (any count up to 65 535; level width
    ``ceil(log2(s + 1))``). The variance is bounded by
    ``E‖Q(v) − v‖² ≤ min(n/s², √n/s) ‖v‖²`` for a vector of n coordinates
    (Alistarh et al., Lemma 3.1), which is why one norm over a large vector
    (``model`` scope) is noisier than per-tensor or per-bucket norms.
``topk``
    Keep the ``ceil(ratio · n)`` largest-magnitude coordinates; send their
    float32 values and their indices. Biased, so usually paired with error
    feedback.

Wire format
-----------
Payloads must survive a Flower ``ArrayRecord``, which only round-trips
float16/32/64, int8/16/32/64, uint8 and bool, so every integer field travels
as a bit-packed uint8 stream (see :func:`pack_bits`). Top-k indices are packed
at ``ceil(log2 n)`` bits rather than the next unsigned dtype: a tensor with
more than 65 536 coordinates would otherwise pay 32 bits per index, and top-k
at 10 % would save only 5× instead of ~6.2× (20-bit indices for 1M floats).
Payload keys per tensor ``name``:

* ``none``: ``name`` (float32, original shape)
* ``qsgd``, scope ``tensor``: ``name::norm`` (float32, shape (1,)),
  ``name::signs`` (uint8, 1 bit per coordinate, 1 = negative),
  ``name::levels`` (uint8, ``spec.level_bits`` bits per coordinate)
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
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = [
    "KEY_SEPARATOR",
    "METHODS",
    "SCOPES",
    "CompressionSpec",
    "apply_error_feedback",
    "decode_update",
    "encode_update",
    "expected_payload_nbytes",
    "float32_nbytes",
    "index_bits",
    "pack_bits",
    "packed_length",
    "payload_keys",
    "payload_nbytes",
    "paper_levels",
    "qsgd_dequantize_tensor",
    "qsgd_quantize_buckets",
    "qsgd_quantize_tensor",
    "qsgd_variance_bound",
    "topk_count",
    "topk_tensor",
    "unpack_bits",
    "vector_keys",
]

METHODS: tuple[str, ...] = ("none", "qsgd", "topk")
SCOPES: tuple[str, ...] = ("tensor", "model", "bucket")
KEY_SEPARATOR = "::"

# qsgd levels are held one per uint8 (uint16 above 255 levels) between quantising and packing.
_MAX_LEVEL_BITS = 16
# `bits` keeps its b-bits-on-the-wire meaning (1 sign + b − 1 level bits) up to 8 level bits.
_MAX_WIRE_LEVEL_BITS = 8

FloatArray = npt.NDArray[np.float32]
ByteArray = npt.NDArray[np.uint8]
UIntArray = npt.NDArray[np.unsignedinteger]


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class CompressionSpec:
    """Which codec a client uses and its parameters.

    Errors name the run-config key (``compression``, ``bits``, ``levels``,
    ``topk-ratio``, ``qsgd-scope``, ``qsgd-bucket``) so a misconfigured run
    points at the setting to fix.
    ``bits``/``levels`` only matter for ``qsgd`` and ``topk_ratio`` only for
    ``topk``, but all are validated so that a bad value never hides.
    """

    method: str = "none"
    bits: int = 4
    levels: int | None = None
    topk_ratio: float = 0.1
    scope: str = "tensor"
    bucket_size: int = 512

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"compression: unknown method {self.method!r}, expected one of {METHODS}"
            )
        if not _is_int(self.bits) or not 2 <= self.bits <= _MAX_WIRE_LEVEL_BITS + 1:
            raise ValueError(
                f"bits: must be an integer in [2, {_MAX_WIRE_LEVEL_BITS + 1}] "
                f"(1 sign bit + up to {_MAX_WIRE_LEVEL_BITS} level bits), got {self.bits!r}"
            )
        max_levels = 2**_MAX_LEVEL_BITS - 1
        if self.levels is not None and (
            not _is_int(self.levels) or not 1 <= self.levels <= max_levels
        ):
            raise ValueError(
                f"levels: must be an integer in [1, {max_levels}], got {self.levels!r}"
            )
        ratio = self.topk_ratio
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, (int, float))
            or not math.isfinite(ratio)
            or not 0.0 < ratio <= 1.0
        ):
            raise ValueError(f"topk-ratio: must be a number in (0, 1], got {ratio!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"qsgd-scope: unknown scope {self.scope!r}, expected one of {SCOPES}")
        if not _is_int(self.bucket_size) or self.bucket_size < 1:
            raise ValueError(f"qsgd-bucket: must be an integer >= 1, got {self.bucket_size!r}")

    @property
    def qsgd_levels(self) -> int:
        """Number of quantisation levels ``s`` (the override, else ``2^(bits−1) − 1``)."""
        return self.levels if self.levels is not None else 2 ** (self.bits - 1) - 1

    @property
    def level_bits(self) -> int:
        """Bits per coordinate for a qsgd level: ``ceil(log2(s + 1))``."""
        return self.qsgd_levels.bit_length()

    @property
    def coordinate_bits(self) -> int:
        """qsgd bits per coordinate on the wire: 1 sign bit plus the level bits."""
        return 1 + self.level_bits

    @property
    def whole_vector(self) -> bool:
        """True when qsgd quantises the concatenated update (``model`` or ``bucket`` scope)."""
        return self.method == "qsgd" and self.scope != "tensor"

    def describe(self) -> str:
        """What the codec is, for logs and reports: the scope, level count and wire bits of qsgd."""
        if self.method == "none":
            return "none (float32)"
        if self.method == "topk":
            return f"top-k {self.topk_ratio} per tensor (float32 values + packed indices)"
        scope = f"bucket scope ({self.bucket_size})" if self.scope == "bucket" else f"{self.scope} scope"
        return (f"qsgd, {scope}, {self.qsgd_levels} levels "
                f"({self.coordinate_bits} bits per coordinate: 1 sign + {self.level_bits} level)")


def paper_levels(bits: int) -> int:
    """The FedSynSAM paper's level count for its "b-bit" quantiser (eq. 3): ``a = 2^b + 1``."""
    return 2**bits + 1


def _is_int(value: object) -> bool:
    """True for ints (numpy ints included) but not bools, which are ints in Python."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# --------------------------------------------------------------------- bit packing


def pack_bits(values: npt.ArrayLike, width: int) -> ByteArray:
    """Pack non-negative integers of ``width`` bits (1..64) into a uint8 stream.

    The layout is bit-planar: plane ``p`` holds bit ``width − 1 − p`` (most
    significant first) of every value, packed 8 values per byte by
    ``np.packbits``, and the planes are concatenated. That costs at most
    ``width − 1`` padding bytes over a fully interleaved stream but needs only
    contiguous whole-array operations, an order of magnitude faster in numpy
    than gathering each value's bits. Values outside ``[0, 2^width)`` would
    lose bits silently, so they raise ValueError.
    """
    _check_width(width)
    flat = np.asarray(values).ravel()
    if flat.dtype.kind not in "biu":
        raise ValueError(f"pack_bits: expected integers or bools, got {flat.dtype}")
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= 1 << width):
        raise ValueError(f"pack_bits: values must lie in [0, 2^{width})")
    flat = flat.astype(_container_dtype(width), copy=False)
    planes = [
        np.packbits(((flat >> shift) & 1).astype(np.uint8, copy=False))
        for shift in range(width - 1, -1, -1)
    ]
    return np.concatenate(planes)


def unpack_bits(packed: npt.NDArray[np.uint8], width: int, count: int) -> UIntArray:
    """Inverse of :func:`pack_bits`: read ``count`` values of ``width`` bits.

    Returns the narrowest unsigned dtype that holds ``width`` bits. Padding bits
    are ignored; a stream whose length is not ``packed_length(count, width)``
    raises ValueError.
    """
    _check_width(width)
    if count < 0:
        raise ValueError(f"unpack_bits: count must be >= 0, got {count}")
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"unpack_bits: expected uint8, got {packed.dtype}")
    if packed.size != packed_length(count, width):
        raise ValueError(
            f"unpack_bits: {packed.size} bytes, expected {packed_length(count, width)} "
            f"for {count} values of {width} bits"
        )
    container = _container_dtype(width)
    planes = packed.reshape(width, -1)
    out = np.zeros(count, dtype=container)
    for plane, shift in zip(planes, range(width - 1, -1, -1)):
        bits = np.unpackbits(plane, count=count).astype(container, copy=False)
        bits <<= shift
        out |= bits
    return out


def packed_length(count: int, width: int) -> int:
    """Bytes that :func:`pack_bits` produces for ``count`` values of ``width`` bits."""
    return width * -(-count // 8)


def _container_dtype(width: int) -> np.dtype:
    """Narrowest unsigned dtype with at least ``width`` bits."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if width <= 8 * np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    raise ValueError(f"bit width must be at most 64, got {width}")


def _check_width(width: int) -> None:
    """Reject bit widths that pack_bits cannot represent."""
    if not _is_int(width) or not 1 <= width <= 64:
        raise ValueError(f"bit width must be an integer in [1, 64], got {width!r}")


# ---------------------------------------------------------------------------- qsgd


def qsgd_quantize_buckets(
    flat: FloatArray, levels: int, bucket: int, rng: np.random.Generator
) -> tuple[FloatArray, npt.NDArray[np.bool_], UIntArray]:
    """Stochastically quantise a 1-D float32 vector, one L2 norm per bucket of ``bucket`` coordinates.

    Returns ``(norms, negative, level)`` with ``norms[b] = ‖v_b‖₂`` (float32,
    one per bucket; the last bucket may be shorter), ``negative[j] = v_j < 0``
    and ``level[j] ∈ [0, levels]`` such that ``norm · ±level / levels`` is an
    unbiased estimate of ``v``. A zero bucket gives norm 0 and zero levels.
    The levels are uint8 up to 255 levels, uint16 above. Non-finite input
    raises ValueError. ``rng`` draws one float32 per coordinate, whatever the
    bucket length.
    """
    n = flat.size
    count = -(-n // bucket) if n else 0
    level_dtype = np.uint8 if levels <= 255 else np.uint16
    negative = flat < 0
    if n == 0:
        return np.zeros(0, dtype=np.float32), negative, np.zeros(0, dtype=level_dtype)
    if count * bucket == n:
        magnitude = np.abs(flat)
    else:  # pad to whole buckets with zeros: they add nothing to a norm and are cut off again
        magnitude = np.zeros(count * bucket, dtype=np.float32)
        np.abs(flat, out=magnitude[:n])
    rows = magnitude.reshape(count, bucket)
    peak = rows.max(axis=1)
    if not np.isfinite(peak).all():
        raise ValueError("non-finite values")
    nonzero = peak > 0
    # Normalise by the peak before squaring: a float32 sum of squares
    # overflows above ~1e19 and underflows below ~1e-23, the ratios cannot.
    # (A zero bucket is divided by 1 and stays zero.)
    rows /= np.where(nonzero, peak, np.float32(1))[:, None]
    # A float64 pairwise sum along each row rather than np.dot: a BLAS dot
    # product may split the sum over as many threads as the process has, so
    # the same update could encode differently in another process; numpy's
    # pairwise sum depends only on the data.
    ratio = np.sqrt(np.add.reduce(np.square(rows, dtype=np.float64), axis=1))
    norms = (peak.astype(np.float64) * ratio).astype(np.float32)
    if not np.isfinite(norms).all():
        raise ValueError("the norm exceeds the float32 range")
    # r_j = s·|v_j|/‖v_b‖, using the float32 norm the decoder will multiply by.
    scale = np.zeros(count, dtype=np.float64)
    scale[nonzero] = levels * peak[nonzero].astype(np.float64) / norms[nonzero].astype(np.float64)
    rows *= scale.astype(np.float32)[:, None]
    magnitude = magnitude[:n]
    # floor(r + u), u ~ U[0, 1), rounds r up exactly when u ≥ 1 − frac(r), i.e.
    # with probability frac(r): the unbiased rounding QSGD needs. Truncating
    # astype is floor here because everything is non-negative.
    magnitude += rng.random(n, dtype=np.float32)
    level = magnitude.astype(level_dtype)
    # r can exceed s by an ulp and r + u can round up across s; clamp both.
    np.minimum(level, level_dtype(levels), out=level)
    return norms, negative, level


def qsgd_quantize_tensor(
    flat: FloatArray, levels: int, rng: np.random.Generator
) -> tuple[np.float32, npt.NDArray[np.bool_], UIntArray]:
    """:func:`qsgd_quantize_buckets` with one bucket: ``(norm, negative, level)`` for the whole vector."""
    norms, negative, level = qsgd_quantize_buckets(flat, levels, max(flat.size, 1), rng)
    return (norms[0] if norms.size else np.float32(0.0)), negative, level


def qsgd_variance_bound(n: int, levels: int) -> float:
    """QSGD's bound on ``E‖Q(v) − v‖² / ‖v‖²`` for one norm over n coordinates: ``min(n/s², √n/s)``."""
    return min(n / levels**2, math.sqrt(n) / levels)


def qsgd_dequantize_tensor(
    norm: float | npt.NDArray[np.float32], negative: npt.NDArray[np.bool_], level: UIntArray, levels: int,
    bucket: int | None = None,
) -> FloatArray:
    """Rebuild ``norm · sign · level / levels`` as a 1-D float32 vector.

    ``norm`` is one number, or one per bucket of ``bucket`` coordinates.
    """
    sign = np.int8(1) - np.int8(2) * negative.view(np.int8)
    out = level.astype(np.float32)
    if bucket is None:
        out *= np.float32(norm) / np.float32(levels)
    else:
        step = np.asarray(norm, dtype=np.float32) / np.float32(levels)
        out *= np.repeat(step, bucket)[: out.size]
    out *= sign
    return out


# ---------------------------------------------------------------------------- topk


def topk_count(n: int, ratio: float) -> int:
    """``ceil(ratio · n)`` for the ratio as written in the config, never above ``n``.

    Binary floats miss decimal ratios slightly in either direction (``0.3 · 10``
    gives ``3.0000000000000004``; the float ``0.1`` lies just above 1/10), and
    a ceiling turns that into one extra coordinate. Reading the ratio as its
    shortest decimal form (``repr``) and multiplying exactly keeps ``0.1`` of
    10 coordinates at 1.
    """
    return min(n, math.ceil(Fraction(repr(float(ratio))) * n))


def topk_tensor(flat: FloatArray, k: int) -> tuple[npt.NDArray[np.intp], FloatArray]:
    """Select the ``k`` largest-magnitude coordinates of a 1-D vector.

    Returns ``(indices, values)`` with indices strictly increasing. Ties at the
    threshold go to the lowest indices, so the choice is deterministic.
    """
    n = flat.size
    if k <= 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
    if k >= n:
        keep = np.arange(n)
    else:
        magnitude = np.abs(flat)
        # A value partition is cheaper than argpartition, and a mask yields
        # indices already sorted; only threshold ties need explicit handling.
        threshold = np.partition(magnitude, n - k)[n - k]
        mask = magnitude > threshold
        n_missing = k - int(np.count_nonzero(mask))
        mask[np.flatnonzero(magnitude == threshold)[:n_missing]] = True
        keep = np.flatnonzero(mask)
    return keep, flat[keep]


def index_bits(n: int) -> int:
    """Bits per top-k index for an ``n``-vector: enough for ``n − 1``, at least 1."""
    return max(1, (n - 1).bit_length())


# ---------------------------------------------------------------- payload structure


def payload_keys(name: str, spec: CompressionSpec) -> tuple[str, ...]:
    """Payload keys that carry tensor ``name`` under ``spec`` (per-tensor payloads only)."""
    if spec.method == "none":
        return (name,)
    if not name or KEY_SEPARATOR in name:
        # Otherwise keys of different tensors could collide or be misattributed.
        raise ValueError(f"tensor {name!r}: name must be non-empty and not contain {KEY_SEPARATOR!r}")
    parts = ("norm", "signs", "levels") if spec.method == "qsgd" else ("values", "indices")
    return tuple(f"{name}{KEY_SEPARATOR}{part}" for part in parts)


def vector_keys(spec: CompressionSpec) -> tuple[str, str, str]:
    """The three keys of a whole-update qsgd payload (``model`` or ``bucket`` scope).

    They start with the separator, so no per-tensor key (whose tensor name is
    non-empty) can equal one, and the bucket length is part of them.
    """
    tag = "model" if spec.scope == "model" else f"bucket-{spec.bucket_size}"
    return tuple(f"{KEY_SEPARATOR}{tag}{KEY_SEPARATOR}{part}" for part in ("norm", "signs", "levels"))  # type: ignore[return-value]


def expected_payload_nbytes(sizes: Mapping[str, int], spec: CompressionSpec) -> int:
    """Bytes of array data ``encode_update`` produces for tensors of these element counts.

    The hand-computable wire size of each codec: per-tensor qsgd pays a
    float32 norm and two bit-packed streams per tensor, whole-update qsgd one
    set for the concatenation (one norm per bucket in ``bucket`` scope).
    """
    if spec.method == "none":
        return 4 * sum(sizes.values())
    if spec.method == "topk":
        return sum(
            4 * (k := topk_count(n, spec.topk_ratio)) + packed_length(k, index_bits(n)) for n in sizes.values()
        )
    def qsgd_bytes(n: int, norms: int) -> int:
        return 4 * norms + packed_length(n, 1) + packed_length(n, spec.level_bits)
    if spec.scope == "tensor":
        return sum(qsgd_bytes(n, 1) for n in sizes.values())
    total = sum(sizes.values())
    norms = 1 if spec.scope == "model" else -(-total // spec.bucket_size)
    return qsgd_bytes(total, norms)


def payload_nbytes(payload: Mapping[str, np.ndarray]) -> int:
    """Bytes of array data in a payload (what compression is judged by)."""
    return sum(int(array.nbytes) for array in payload.values())


def float32_nbytes(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Bytes the same tensors take as raw float32 (the uncompressed baseline)."""
    return sum(4 * math.prod(shape) for shape in shapes.values())


# ------------------------------------------------------------------------ encoding


def encode_update(
    delta: Mapping[str, np.ndarray], spec: CompressionSpec, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Compress ``delta`` under ``spec``: tensor by tensor, or as one vector for whole-update qsgd.

    Per-tensor codecs visit the tensors in ``delta``'s order, which fixes how
    ``rng`` is consumed; whole-update qsgd concatenates them in sorted name
    order, the order :func:`decode_update` rebuilds. The input is never
    modified. Non-finite values raise ValueError naming the tensor: they would
    poison the server's aggregate.
    """
    if spec.whole_vector:
        return _encode_vector(delta, spec, rng)
    payload: dict[str, np.ndarray] = {}
    for name, tensor in delta.items():
        keys = payload_keys(name, spec)
        flat = np.asarray(tensor, dtype=np.float32).ravel()
        try:
            arrays = _encode_flat(flat, spec, rng)
        except ValueError as err:
            raise ValueError(f"tensor {name!r}: {err}") from None
        if spec.method == "none":
            arrays = (arrays[0].reshape(np.shape(tensor)),)
        payload.update(zip(keys, arrays))
    return payload


def _encode_vector(
    delta: Mapping[str, np.ndarray], spec: CompressionSpec, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Whole-update qsgd: the tensors in sorted name order as one vector, one payload."""
    names = sorted(delta)
    for name in names:
        payload_keys(name, CompressionSpec("qsgd"))  # the same name rules as per-tensor payloads
        if not np.isfinite(np.asarray(delta[name], dtype=np.float32)).all():
            raise ValueError(f"tensor {name!r}: non-finite values")
    parts = [np.asarray(delta[name], dtype=np.float32).ravel() for name in names]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    bucket = max(flat.size, 1) if spec.scope == "model" else spec.bucket_size
    norms, negative, level = qsgd_quantize_buckets(flat, spec.qsgd_levels, bucket, rng)
    arrays = (norms, pack_bits(negative, 1), pack_bits(level, spec.level_bits))
    return dict(zip(vector_keys(spec), arrays))


def _encode_flat(
    flat: FloatArray, spec: CompressionSpec, rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    """Encode one flattened tensor into its payload arrays, in payload_keys order."""
    if spec.method == "qsgd":
        norm, negative, level = qsgd_quantize_tensor(flat, spec.qsgd_levels, rng)
        return (
            np.array([norm], dtype=np.float32),
            pack_bits(negative, 1),
            pack_bits(level, spec.level_bits),
        )
    if not np.isfinite(flat).all():
        raise ValueError("non-finite values")
    if spec.method == "topk":
        indices, values = topk_tensor(flat, topk_count(flat.size, spec.topk_ratio))
        return values, pack_bits(indices, index_bits(flat.size))
    return (flat.copy(),)


# ------------------------------------------------------------------------ decoding


def decode_update(
    payload: Mapping[str, np.ndarray],
    shapes: Mapping[str, tuple[int, ...]],
    spec: CompressionSpec,
) -> dict[str, np.ndarray]:
    """Rebuild float32 tensors of the given ``shapes`` from an untrusted payload.

    Raises ValueError, naming the tensor, for missing or unexpected keys, wrong
    dtypes or lengths, non-finite or negative norms, non-finite values,
    out-of-range levels and out-of-range or unsorted indices. A payload of
    another qsgd scope (or bucket length) has other keys and is refused.
    """
    if spec.whole_vector:
        return _decode_vector(payload, shapes, spec)
    expected = {name: payload_keys(name, spec) for name in shapes}
    known = {key for keys in expected.values() for key in keys}
    unexpected = sorted(set(payload) - known)
    if unexpected:
        raise ValueError(f"unexpected payload keys {unexpected} for {spec.describe()}")
    result: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        missing = [key for key in expected[name] if key not in payload]
        if missing:
            raise ValueError(f"tensor {name!r}: missing payload keys {missing}")
        arrays = [payload[key] for key in expected[name]]
        try:
            flat = _decode_flat(arrays, math.prod(shape), spec)
        except ValueError as err:
            raise ValueError(f"tensor {name!r}: {err}") from None
        result[name] = flat.reshape(shape)
    return result


def _decode_vector(
    payload: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], spec: CompressionSpec
) -> dict[str, np.ndarray]:
    """Validate and decode a whole-update qsgd payload into the tensors of ``shapes``."""
    keys = vector_keys(spec)
    unexpected = sorted(set(payload) - set(keys))
    if unexpected:
        raise ValueError(f"unexpected payload keys {unexpected[:5]} for {spec.describe()}")
    missing = [key for key in keys if key not in payload]
    if missing:
        raise ValueError(f"missing payload keys {missing} for {spec.describe()}")
    names = sorted(shapes)
    sizes = [math.prod(shapes[name]) for name in names]
    n = sum(sizes)
    bucket = max(n, 1) if spec.scope == "model" else spec.bucket_size
    count = -(-n // bucket) if n else 0
    norm, signs, levels = (payload[key] for key in keys)
    s, width = spec.qsgd_levels, spec.level_bits
    _check_array(norm, "norm", np.dtype(np.float32), count)
    _check_array(signs, "signs", np.dtype(np.uint8), packed_length(n, 1))
    _check_array(levels, "levels", np.dtype(np.uint8), packed_length(n, width))
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


def _decode_flat(arrays: list[np.ndarray], n: int, spec: CompressionSpec) -> FloatArray:
    """Validate and decode one tensor's payload arrays into a 1-D float32 vector."""
    if spec.method == "qsgd":
        return _decode_qsgd(*arrays, n=n, spec=spec)
    if spec.method == "topk":
        return _decode_topk(*arrays, n=n, spec=spec)
    (values,) = arrays
    _check_array(values, "values", np.dtype(np.float32), n)
    if not np.isfinite(values).all():
        raise ValueError("non-finite values")
    return values.ravel().copy()


def _decode_qsgd(
    norm: np.ndarray, signs: np.ndarray, levels: np.ndarray, *, n: int, spec: CompressionSpec
) -> FloatArray:
    """Validate and dequantise one qsgd-encoded tensor."""
    s, width = spec.qsgd_levels, spec.level_bits
    _check_array(norm, "norm", np.dtype(np.float32), 1)
    _check_array(signs, "signs", np.dtype(np.uint8), packed_length(n, 1))
    _check_array(levels, "levels", np.dtype(np.uint8), packed_length(n, width))
    norm_value = norm.reshape(())[()]
    if not np.isfinite(norm_value) or norm_value < 0:
        raise ValueError(f"norm must be finite and >= 0, got {norm_value}")
    negative = unpack_bits(signs.ravel(), 1, n).view(np.bool_)
    level = unpack_bits(levels.ravel(), width, n)
    if n and int(level.max()) > s:
        raise ValueError(f"level {int(level.max())} exceeds the {s} qsgd levels")
    return qsgd_dequantize_tensor(norm_value, negative, level, s)


def _decode_topk(
    values: np.ndarray, indices: np.ndarray, *, n: int, spec: CompressionSpec
) -> FloatArray:
    """Validate and scatter one top-k-encoded tensor."""
    k = topk_count(n, spec.topk_ratio)
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


def _check_array(array: np.ndarray, part: str, dtype: np.dtype, size: int) -> None:
    """Reject a payload array that is not an ndarray of ``dtype`` with ``size`` elements."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{part} must be a numpy array, got {type(array).__name__}")
    if array.dtype != dtype:
        raise ValueError(f"{part} has dtype {array.dtype}, expected {dtype}")
    if array.size != size:
        raise ValueError(f"{part} has {array.size} elements, expected {size}")


# ------------------------------------------------------------------ error feedback


def apply_error_feedback(
    delta: Mapping[str, np.ndarray],
    residual: Mapping[str, np.ndarray] | None,
    spec: CompressionSpec,
    rng: np.random.Generator,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Compress ``delta + residual`` and return ``(payload, new_residual)``.

    Error feedback re-injects what compression dropped last round, so biased
    compressors such as top-k still deliver every coordinate eventually.
    ``new_residual = (delta + residual) − decode(payload)``, in float32. A
    ``None`` residual or a missing tensor counts as zero (the first round).
    """
    residual = residual or {}
    extra = sorted(set(residual) - set(delta))
    if extra:
        raise ValueError(f"residual has tensors not in delta: {extra}")
    corrected: dict[str, np.ndarray] = {}
    for name, tensor in delta.items():
        value = np.asarray(tensor, dtype=np.float32)
        if name in residual:
            carried = np.asarray(residual[name], dtype=np.float32)
            if carried.shape != value.shape:
                raise ValueError(
                    f"tensor {name!r}: residual shape {carried.shape} != delta shape {value.shape}"
                )
            value = value + carried
        corrected[name] = value
    payload = encode_update(corrected, spec, rng)
    decoded = decode_update(payload, {k: v.shape for k, v in corrected.items()}, spec)
    new_residual = {name: corrected[name] - decoded[name] for name in corrected}
    return payload, new_residual
