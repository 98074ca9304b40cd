"""The uplink codec: how a client compresses its update before sending it (SPEC 3.5), one value on every layer.

`CodecSettings` is one part of the run config (common/run/config.py's `RunConfig` composes the parts) and the
codec itself: a strategy holds one (`FedAvg(codec=QSGD(bits=4))`, the public constructors of common/run/codecs.py),
its fields travel in every train message under their run-config keys, the node reads the same value back
(common/run/client_settings.py `message_codec`), and the codec's encoding and decoding (common/uplink/) read its
fields. Its run-config keys (`compression`, `bits`, `levels`, `qsgd-scope`, `qsgd-bucket`, `topk-ratio`,
`error-feedback`) are spelled here alone: every other module reads the value's fields.

Methods (their arithmetic: common/uplink/quantizers.py; their payloads: common/uplink/payloads.py)
-------
none
    The update travels as the float32 model.
qsgd
    Stochastic quantisation (Alistarh et al., 2017) at `bits` bits per coordinate, or `levels` levels.
topk
    Each tensor keeps its `topk_ratio` largest-magnitude coordinates.

Scopes (qsgd)
-------------
tensor
    Every named tensor is flattened and quantised with its own norm (one payload of three arrays per tensor).
model
    The FedSynSAM paper's eq. 3: all tensors, in sorted name order, form one vector with one L2 norm and one
    payload. The paper's "b-bit" quantiser has `a = 2^b + 1` levels (`paper_levels`: 17 at b = 4, 257 at b = 8),
    which need `1 + ceil(log2(a + 1))` bits per coordinate on the wire (6 and 10): results name the level count
    and those bits, never the nominal b alone.
bucket
    The model vector (as in model) cut into buckets of `qsgd_bucket` coordinates, one norm per bucket, as public
    QSGD implementations do (far lower variance, one float32 norm per bucket).

That a decentralized run sends full models spans parts: `RunConfig` checks it with `check_uncompressed`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.keys import BOTH, check_choice, check_text, key, require

# the run-config key that names the codec, for the files and reports that record it beside the algorithm
METHOD_KEY = "compression"
METHODS: tuple[str, ...] = ("none", "qsgd", "topk")
SCOPES: tuple[str, ...] = ("tensor", "model", "bucket")
# the fields each method reads besides its name: a codec asks its nodes for these, the others at their defaults
METHOD_FIELDS: dict[str, tuple[str, ...]] = {
    "none": (),
    "qsgd": ("bits", "levels", "qsgd_scope", "qsgd_bucket", "error_feedback"),
    "topk": ("topk_ratio", "error_feedback"),
}


def _integer(value: Any) -> bool:
    """An int (a numpy integer too), not a bool: a level count, a bit width, a bucket length."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class CodecSettings:
    """The uplink codec: none, QSGD or top-k, its parameters, and error feedback."""

    compression: str = key(
        "none", "Uplink codec for each client's update w_i - w: none, qsgd, topk (any centralized algorithm).",
        "SPEC 3.5", side=BOTH,
    )
    bits: int = key(4, "qsgd: bits per coordinate on the wire (1 sign bit + bits-1 level bits).", "FedSynSAM: 4, 8",
                    side=BOTH)
    levels: int = key(0, "qsgd: number of levels s, overriding bits (0: s = 2^(bits-1) - 1); the FedSynSAM paper's "
                      "b-bit form is 2^b + 1 (17: 6 bits per coordinate; 257: 10 bits).", "SPEC 3.5; FedSynSAM eq. 3",
                      side=BOTH)
    qsgd_scope: str = key("tensor", "qsgd: one norm per tensor, per model (the whole update, FedSynSAM eq. 3) "
                          "or per bucket of qsgd-bucket coordinates of the whole update.", "SPEC 3.5", side=BOTH)
    qsgd_bucket: int = key(512, "qsgd-scope = bucket: coordinates per bucket (one float32 norm each).", "SPEC 3.5",
                           side=BOTH)
    topk_ratio: float = key(0.1, "topk: fraction of each tensor's coordinates kept (largest magnitudes).",
                            "FedSynSAM: 0.1, 0.25", side=BOTH)
    error_feedback: bool = key(
        False, "Compress the update plus last round's compression error (kept in node state).", "SPEC 3.5", side=BOTH,
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, CodecSettings)
        check_choice("compression", self.compression, METHODS)
        require(_integer(self.bits) and 2 <= self.bits <= 9, "bits", self.bits,
                "an integer in 2..9 (1 sign bit + 1..8 level bits)")
        require(_integer(self.levels) and 0 <= self.levels <= 65535, "levels", self.levels,
                "an integer in 0..65535 (0: from bits)")
        check_choice("qsgd-scope", self.qsgd_scope, SCOPES)
        require(_integer(self.qsgd_bucket) and self.qsgd_bucket >= 1, "qsgd-bucket", self.qsgd_bucket,
                "an integer >= 1")
        require(_number(self.topk_ratio) and 0 < self.topk_ratio <= 1, "topk-ratio", self.topk_ratio,
                "a number in (0, 1]")

    def check_uncompressed(self, why: str) -> None:
        """Refuse any codec but none, naming the key: `why` says what sends full models (a decentralized run)."""
        require(self.compression == "none", "compression", self.compression, f"none {why}")

    @classmethod
    def of(cls, settings: Any) -> "CodecSettings":
        """The codec that `settings` (a run config, a codec: any object with the group's fields) asks its nodes
        for: its method and the fields that method reads (`METHOD_FIELDS`), the others at their defaults (a run
        config's top-k ratio is not sent with qsgd, nor error feedback without a codec)."""
        method = settings.compression
        return cls(method, **{name: getattr(settings, name) for name in METHOD_FIELDS.get(method, ())})

    @property
    def qsgd_levels(self) -> int:
        """Number of quantisation levels `s` (`levels`, else `2^(bits-1) - 1`)."""
        return self.levels or 2 ** (self.bits - 1) - 1

    @property
    def level_bits(self) -> int:
        """Bits per coordinate for a qsgd level: `ceil(log2(s + 1))`."""
        return self.qsgd_levels.bit_length()

    @property
    def coordinate_bits(self) -> int:
        """qsgd bits per coordinate on the wire: 1 sign bit plus the level bits."""
        return 1 + self.level_bits

    @property
    def whole_vector(self) -> bool:
        """True when qsgd quantises the concatenated update (model or bucket scope)."""
        return self.compression == "qsgd" and self.qsgd_scope != "tensor"

    def describe(self) -> str:
        """What the codec is, for logs and reports: the scope, level count and wire bits of qsgd."""
        if self.compression == "none":
            return "none (float32)"
        if self.compression == "topk":
            return f"top-k {self.topk_ratio} per tensor (float32 values + packed indices)"
        scope = f"bucket scope ({self.qsgd_bucket})" if self.qsgd_scope == "bucket" else f"{self.qsgd_scope} scope"
        return (f"qsgd, {scope}, {self.qsgd_levels} levels "
                f"({self.coordinate_bits} bits per coordinate: 1 sign + {self.level_bits} level)")


def names_a_codec(config: Mapping[str, Any]) -> bool:
    """Whether a train message's config asks for a codec at all: Flower's own strategies and the decentralized
    relay send none, and their nodes reply with the model."""
    return METHOD_KEY in config


def paper_levels(bits: int) -> int:
    """The FedSynSAM paper's level count for its "b-bit" quantiser (eq. 3): `a = 2^b + 1`."""
    return 2**bits + 1
