"""The uplink codec a run config's strategy sends its nodes, as fedsynth's ClientApp reads it back, for the codec tests.

fedsynth's ClientApp encodes with the codec its train message names (client_app/train_reply.py
`uplink_codec_of`), never with its run config's keys: these helpers take that same path, from the run config's
codec value (`codec_of`) through the train config the strategy sends (`codec_settings`) to the node's reading.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord

from client_app.train_reply import uplink_codec_of, uplink_records
from common.run.client_settings import codec_settings
from common.run.codecs import codec_of, codec_spec
from common.run.config import RunConfig
from common.uplink.spec import CompressionSpec


def run_codec(cfg: RunConfig) -> tuple[CompressionSpec, bool]:
    """(codec, error feedback) the node reads from a train message of the run `cfg`."""
    codec = codec_of(cfg)
    return uplink_codec_of(codec_settings(codec_spec(codec), bool(codec is not None and codec.error_feedback)))


def run_uplink_records(cfg: RunConfig, *args: Any, **kwargs: Any) -> dict[str, ArrayRecord]:
    """`uplink_records` with the codec of `run_codec(cfg)` and the run's seed."""
    return uplink_records(*run_codec(cfg), cfg.seed, *args, **kwargs)
