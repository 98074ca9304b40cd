"""The uplink codec keys: how a client compresses its update before sending it (SPEC 3.5).

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by the
codec (common/uplink/: the spec from these keys in common/run/client_settings.py, the client's encoding in
client_app/train_reply.py, the server's decoding in server_app/strategies/fedavg.py) on every centralized
algorithm. That
a decentralized run sends full models spans parts: `RunConfig` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.keys import BOTH, check_choice, check_text, key, require


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
        check_choice("compression", self.compression, ("none", "qsgd", "topk"))
        require(2 <= self.bits <= 9, "bits", self.bits, "an integer in 2..9 (1 sign bit + 1..8 level bits)")
        require(0 <= self.levels <= 65535, "levels", self.levels, "an integer in 0..65535 (0: from bits)")
        check_choice("qsgd-scope", self.qsgd_scope, ("tensor", "model", "bucket"))
        require(self.qsgd_bucket >= 1, "qsgd-bucket", self.qsgd_bucket, "an integer >= 1")
        require(0 < self.topk_ratio <= 1, "topk-ratio", self.topk_ratio, "a number in (0, 1]")
