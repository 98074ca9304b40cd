"""The settings a node's update rule needs, carried in each train message's config as FedProx sends `proximal-mu`.

A Flower ClientApp knows only its message and its own `Context`. Whatever the
server's algorithm asks of the node (the uplink codec, SAM's radius rho,
FedSynSAM's mix beta, FedCOG's start round, OledFL's beta, ...) therefore
travels in the train message's `"config"` record under the run-config key's
name, and `fedsynth.client` reads it from there (`compression_from_config`,
`config_value`), so a node never repeats the server's settings by hand and the
two cannot disagree. (The decentralized mixing weights travel in the `gossip`
record of each node's own message.) The uplink codec is read from either side
of that message: `compression_spec` from the run config, `compression_from_config`
from the train message's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.algorithm_table import ALGORITHMS
from common.run.config import RunConfig
from common.uplink.spec import CompressionSpec

# run-config keys of the uplink codec: every centralized rule may compress its update
CODEC_KEYS = ("compression", "bits", "levels", "qsgd-scope", "qsgd-bucket", "topk-ratio", "error-feedback")

# algorithm -> the run-config keys its client rule reads besides the codec (common/algorithm_table.py's table)
RULE_KEYS: dict[str, tuple[str, ...]] = {
    name: algorithm.client_keys for name, algorithm in ALGORITHMS.items() if algorithm.client_keys
}


def client_keys(algorithm: str, decentralized: bool = False) -> tuple[str, ...]:
    """The run-config keys a node running `algorithm` reads from its train message's config."""
    return (() if decentralized else CODEC_KEYS) + RULE_KEYS.get(algorithm, ())


def uplink_codec(compression: str = "none", bits: int = 4, levels: int = 0, qsgd_scope: str = "tensor",
                 qsgd_bucket: int = 512, topk_ratio: float = 0.1) -> CompressionSpec:
    """The codec of the run-config keys `compression`, `bits`, `levels` (0: from `bits`), `qsgd-scope`,
    `qsgd-bucket` and `topk-ratio`; ValueError names the bad key."""
    return CompressionSpec(compression, bits=bits, levels=levels or None, topk_ratio=topk_ratio, scope=qsgd_scope,
                           bucket_size=qsgd_bucket)


def codec_settings(codec: CompressionSpec, error_feedback: bool) -> dict[str, Any]:
    """The uplink codec's entries of a train message's config, under the run-config keys (`CODEC_KEYS`)."""
    return {"compression": codec.method, "bits": codec.bits, "levels": codec.levels or 0,
            "qsgd-scope": codec.scope, "qsgd-bucket": codec.bucket_size, "topk-ratio": codec.topk_ratio,
            "error-feedback": error_feedback}


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """The setting `key` of a train message's config; KeyError naming the key and the server's duty when absent."""
    if key not in config:
        raise KeyError(f"the train message's config lacks {key!r}: the server's strategy sends it "
                       "(fedsynth.strategies does; a strategy of your own must put it in train_config)")
    return config[key]


def compression_from_config(config: Mapping[str, Any]) -> CompressionSpec:
    """The uplink codec the server asked for in a train message's config ("none" when it names none)."""
    if "compression" not in config:
        return CompressionSpec("none")
    return uplink_codec(str(config["compression"]), int(config.get("bits", 4)), int(config.get("levels", 0)),
                        str(config.get("qsgd-scope", "tensor")), int(config.get("qsgd-bucket", 512)),
                        float(config.get("topk-ratio", 0.1)))


def compression_spec(cfg: RunConfig) -> CompressionSpec:
    """The codec a run's config asks for (`levels = 0` means: derive from `bits`)."""
    return uplink_codec(cfg.compression, cfg.bits, cfg.levels, cfg.qsgd_scope, cfg.qsgd_bucket, cfg.topk_ratio)
