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


def client_settings(cfg: Any) -> dict[str, Any]:
    """The config entries of `cfg`'s client rule: {run-config key: value} for a train message's ConfigRecord.

    `cfg` is a `common.run.config.RunConfig`; keys it lacks are left out. Values are the ConfigRecord's types
    (int, float, str, bool).
    """
    algorithm = ALGORITHMS.get(cfg.algorithm)
    out: dict[str, Any] = {}
    for key in client_keys(cfg.algorithm, algorithm is not None and algorithm.decentralized):
        name = key.replace("-", "_")
        if hasattr(cfg, name):
            out[key] = getattr(cfg, name)
    return out


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
    levels = int(config.get("levels", 0))
    return CompressionSpec(str(config["compression"]), bits=int(config.get("bits", 4)), levels=levels or None,
                           topk_ratio=float(config.get("topk-ratio", 0.1)), scope=str(config.get("qsgd-scope", "tensor")),
                           bucket_size=int(config.get("qsgd-bucket", 512)))


def compression_spec(cfg: RunConfig) -> CompressionSpec:
    """The codec a run's config asks for (`levels = 0` means: derive from `bits`)."""
    return CompressionSpec(cfg.compression, bits=cfg.bits, levels=cfg.levels or None, topk_ratio=cfg.topk_ratio,
                           scope=cfg.qsgd_scope, bucket_size=cfg.qsgd_bucket)
