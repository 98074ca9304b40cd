"""The uplink codec a run config's strategy sends its nodes, as fedsynth's ClientApp reads it back, for the codec tests.

fedsynth's ClientApp encodes with the codec its train message names (common/run/client_settings.py
`message_codec`), never with its run config's keys: these helpers take that same path, from the run config's
codec value (`CodecSettings.of`) through the train config the strategy sends (`message_config`) to the node's
reading.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord

from client_app.train_reply import uplink_records
from common.algorithms.codec_settings import CodecSettings
from common.keys import message_config
from common.run.client_settings import message_codec
from common.run.config import RunConfig


def run_codec(cfg: RunConfig) -> CodecSettings:
    """The codec the node reads from a train message of the run `cfg`."""
    return message_codec(message_config(CodecSettings, CodecSettings.of(cfg)))


def run_uplink_records(cfg: RunConfig, *args: Any, **kwargs: Any) -> dict[str, ArrayRecord]:
    """`uplink_records` with the codec of `run_codec(cfg)` and the run's seed."""
    return uplink_records(run_codec(cfg), cfg.seed, *args, **kwargs)
