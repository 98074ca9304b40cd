"""The public constructors of the uplink codec: `QSGD(...)` and `TopK(...)`, each a checked `CodecSettings`.

A strategy takes the codec as one parameter (`FedAvg(codec=QSGD(bits=4, qsgd_scope="bucket", qsgd_bucket=512))`),
one value of the run config's codec part (common/algorithms/codec_settings.py), which its nodes read back from
the train message. `QSGD` and `TopK` take only the fields their method reads, under the part's own field names
and defaults, and check the value as the run config checks its keys, with the run config's messages
(common/run/config.py `check_parameters`) under their own name.
"""

from __future__ import annotations

import dataclasses

from common.algorithms.codec_settings import CodecSettings
from common.errors import ConfigError
from common.run.config import check_parameters

_DEFAULT = CodecSettings()


def checked_codec(owner: str, codec: CodecSettings) -> CodecSettings:
    """`codec`, refused as the run config refuses its keys: ConfigError naming `owner`, the key and the value."""
    check_parameters(owner, dataclasses.asdict(codec))
    try:
        codec.check()  # its own types too: a bit width of 4.0 passes the run config's coercion, not the codec
    except ConfigError as err:
        raise ConfigError(f"{owner}: {err}") from None
    return codec


def QSGD(bits: int = _DEFAULT.bits, levels: int = _DEFAULT.levels,  # noqa: N802 - a value's constructor
         qsgd_scope: str = _DEFAULT.qsgd_scope, qsgd_bucket: int = _DEFAULT.qsgd_bucket,
         error_feedback: bool = _DEFAULT.error_feedback) -> CodecSettings:
    """QSGD (Alistarh et al., 2017): each update quantised to a number of bits per coordinate (or of levels),
    one norm per tensor, per model or per bucket of `qsgd_bucket` coordinates (`qsgd_scope`), with or without
    error feedback. Each parameter means the run-config key of its name (docs/configuration.md)."""
    return checked_codec("QSGD", CodecSettings("qsgd", bits=bits, levels=levels, qsgd_scope=qsgd_scope,
                                               qsgd_bucket=qsgd_bucket, error_feedback=error_feedback))


def TopK(topk_ratio: float = _DEFAULT.topk_ratio,  # noqa: N802 - a value's constructor
         error_feedback: bool = _DEFAULT.error_feedback) -> CodecSettings:
    """Top-k sparsification: each tensor keeps its `topk_ratio` largest-magnitude coordinates, with or without
    error feedback. Each parameter means the run-config key of its name (docs/configuration.md)."""
    return checked_codec("TopK", CodecSettings("topk", topk_ratio=topk_ratio, error_feedback=error_feedback))
