"""The uplink codec a strategy asks its nodes for, as one value: `QSGD(...)`, `TopK(...)`, or None (no compression).

A strategy takes the codec as one parameter (`FedAvg(codec=QSGD(bits=4, scope="bucket", bucket=512))`)
instead of the run config's seven keys (`compression`, `bits`, `levels`, `qsgd-scope`, `qsgd-bucket`,
`topk-ratio`, `error-feedback`, common/algorithms/codec_settings.py). Each value object holds only what its
method reads, checks its values when it is built with the run config's checks and messages
(common/run/config.py `check_parameters`), and gives the `CompressionSpec` the server decodes with (`spec`).
`codec_of` is the one place where fedsynth's app turns the run-config keys into one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from common.run.config import RunConfig, check_parameters
from common.uplink.spec import CompressionSpec


@dataclass(frozen=True)
class QSGD:
    """QSGD (Alistarh et al., 2017): each update quantised to `bits` bits per coordinate.

    bits : bits per coordinate on the wire (1 sign bit + bits-1 level bits), run-config key `bits`.
    levels : the number of levels s, overriding bits (0: s = 2^(bits-1) - 1), `levels`.
    scope : one norm per "tensor", per "model" (FedSynSAM eq. 3) or per "bucket" of `bucket` coordinates,
        `qsgd-scope`.
    bucket : coordinates per bucket with scope "bucket", `qsgd-bucket`.
    error_feedback : compress the update plus last round's compression error (kept in node state),
        `error-feedback`.
    """

    bits: int = 4
    levels: int = 0
    scope: str = "tensor"
    bucket: int = 512
    error_feedback: bool = False

    def __post_init__(self) -> None:
        check_parameters("QSGD", {"bits": self.bits, "levels": self.levels, "qsgd_scope": self.scope,
                                  "qsgd_bucket": self.bucket, "error_feedback": self.error_feedback})
        self.spec()  # the codec's own checks (common/uplink/spec.py)

    def spec(self) -> CompressionSpec:
        """The codec's `CompressionSpec` (`levels = 0`: derived from `bits`)."""
        return CompressionSpec("qsgd", bits=self.bits, levels=self.levels or None, scope=self.scope,
                               bucket_size=self.bucket)


@dataclass(frozen=True)
class TopK:
    """Top-k sparsification: each tensor keeps its `ratio` largest-magnitude coordinates.

    ratio : fraction of each tensor's coordinates kept, in (0, 1], run-config key `topk-ratio`.
    error_feedback : compress the update plus last round's compression error (kept in node state),
        `error-feedback`.
    """

    ratio: float = 0.1
    error_feedback: bool = False

    def __post_init__(self) -> None:
        check_parameters("TopK", {"topk_ratio": self.ratio, "error_feedback": self.error_feedback})
        self.spec()

    def spec(self) -> CompressionSpec:
        """The codec's `CompressionSpec`."""
        return CompressionSpec("topk", topk_ratio=self.ratio)


Codec = Union[QSGD, TopK]


def codec_spec(codec: Codec | None) -> CompressionSpec:
    """The `CompressionSpec` of `codec` (None: no compression)."""
    return CompressionSpec("none") if codec is None else codec.spec()


def codec_of(cfg: RunConfig) -> Codec | None:
    """The codec a run config's keys name: None with `compression = "none"`."""
    if cfg.compression == "qsgd":
        return QSGD(bits=cfg.bits, levels=cfg.levels, scope=cfg.qsgd_scope, bucket=cfg.qsgd_bucket,
                    error_feedback=cfg.error_feedback)
    if cfg.compression == "topk":
        return TopK(ratio=cfg.topk_ratio, error_feedback=cfg.error_feedback)
    return None


def codec_keys(codec: Codec | None) -> dict[str, Any]:
    """The run-config keys (dashes) that name `codec`, e.g. for a test's or a benchmark's run config."""
    if isinstance(codec, QSGD):
        return {"compression": "qsgd", "bits": codec.bits, "levels": codec.levels, "qsgd-scope": codec.scope,
                "qsgd-bucket": codec.bucket, "error-feedback": codec.error_feedback}
    if isinstance(codec, TopK):
        return {"compression": "topk", "topk-ratio": codec.ratio, "error-feedback": codec.error_feedback}
    return {"compression": "none"}
