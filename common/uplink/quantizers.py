"""The uplink codec's quantisers (SPEC §3.5): bit packing, qsgd and top-k, as pure numpy math.

A client sends ``Q(Δ_i)`` with ``Δ_i = w_local − w_global`` instead of the raw
float32 update, to cut uplink bytes. This module holds the arithmetic of ``Q``
on one flat vector; which codec a run uses is ``common.algorithms.codec_settings``, and how
a whole update becomes a payload of named arrays is ``common.uplink.payloads``.

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
    A level count given directly overrides ``s`` (any count up to 65 535; level width
    ``ceil(log2(s + 1))``). The variance is bounded by
    ``E‖Q(v) − v‖² ≤ min(n/s², √n/s) ‖v‖²`` for a vector of n coordinates
    (Alistarh et al., Lemma 3.1), which is why one norm over a large vector
    (``model`` scope) is noisier than per-tensor or per-bucket norms.
``topk``
    Keep the ``ceil(ratio · n)`` largest-magnitude coordinates; send their
    float32 values and their indices. Biased, so usually paired with error
    feedback.

Bit packing
-----------
Payloads must survive a Flower ``ArrayRecord``, which only round-trips
float16/32/64, int8/16/32/64, uint8 and bool, so every integer field travels
as a bit-packed uint8 stream (see :func:`pack_bits`). Top-k indices are packed
at ``ceil(log2 n)`` bits rather than the next unsigned dtype: a tensor with
more than 65 536 coordinates would otherwise pay 32 bits per index, and top-k
at 10 % would save only 5× instead of ~6.2× (20-bit indices for 1M floats).

All functions are pure; randomness comes only from the ``rng`` argument.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = [
    "index_bits",
    "pack_bits",
    "packed_length",
    "qsgd_dequantize_tensor",
    "qsgd_quantize_buckets",
    "qsgd_quantize_tensor",
    "qsgd_variance_bound",
    "topk_count",
    "topk_tensor",
    "unpack_bits",
]

FloatArray = npt.NDArray[np.float32]
ByteArray = npt.NDArray[np.uint8]
UIntArray = npt.NDArray[np.unsignedinteger]


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
