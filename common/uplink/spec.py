"""Which uplink codec a client uses and its parameters (SPEC §3.5): ``CompressionSpec``.

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

The methods (``none``, ``qsgd``, ``topk``) are described in
``common.uplink.quantizers``; the payloads they produce in ``common.uplink.payloads``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.uplink.quantizers import _is_int

__all__ = [
    "METHODS",
    "SCOPES",
    "CompressionSpec",
    "paper_levels",
]

METHODS: tuple[str, ...] = ("none", "qsgd", "topk")
SCOPES: tuple[str, ...] = ("tensor", "model", "bucket")

# qsgd levels are held one per uint8 (uint16 above 255 levels) between quantising and packing.
_MAX_LEVEL_BITS = 16
# `bits` keeps its b-bits-on-the-wire meaning (1 sign + b − 1 level bits) up to 8 level bits.
_MAX_WIRE_LEVEL_BITS = 8


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
