"""The settings a node's update rule needs, carried in each train message's config as FedProx sends `proximal-mu`.

A Flower ClientApp knows only its message and its own `Context`. Whatever the
server's algorithm asks of the node (the round's learning rate, the uplink
codec, SAM's radius rho, FedSynSAM's mix beta, FedCOG's settings, OledFL's
beta, ...) therefore travels in the train message's `"config"` record under the
run-config key's name, and a node reads it from there (`config_value`,
`compression_from_config`, `require_settings`), so a node never repeats the
server's settings by hand and the two cannot disagree. (The decentralized mixing
weights travel in the `gossip` record of each node's own message.)

`client_keys` names what a node running an algorithm reads from its message;
the server's strategies send exactly those (server_app/strategies/, and
server_app/registry.py for FedCOG's settings on an `X+cog` row). No reader here
has a fallback value: a message that lacks a key is refused naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.algorithm_table import ALGORITHMS
from common.algorithms.accepted_scale import ACCEPTED_SCALE_KEYS  # noqa: F401 - the optional per-node keys
from common.algorithms.cog_settings import COG_KEYS
from common.keys import config_value, require_settings  # noqa: F401 - the readers, re-exported
from common.uplink.spec import CompressionSpec

# run-config keys of the uplink codec: every centralized rule may compress its update
CODEC_KEYS = ("compression", "bits", "levels", "qsgd-scope", "qsgd-bucket", "topk-ratio", "error-feedback")
# what every round's train message carries, whatever the algorithm: the round and its local learning rate
ROUND_KEYS = ("server-round", "lr")

# algorithm -> the run-config keys its client rule reads besides the codec (common/algorithm_table.py's table)
RULE_KEYS: dict[str, tuple[str, ...]] = {
    name: algorithm.client_keys for name, algorithm in ALGORITHMS.items() if algorithm.client_keys
}


def optional_client_keys(algorithm: str) -> tuple[str, ...]:
    """The settings a train message to a node running `algorithm` may carry beside `client_keys`, sent to one node
    alone: under bounded influence, the scale the server took of that node's last clipped update and its round
    (`ACCEPTED_SCALE_KEYS`, for the rows whose node state follows their update, `state_follows_update`)."""
    row = ALGORITHMS.get(algorithm)
    return ACCEPTED_SCALE_KEYS if row is not None and row.state_follows_update else ()


def client_keys(algorithm: str, decentralized: bool = False, cog: bool = False) -> tuple[str, ...]:
    """The run-config keys a node running `algorithm` reads from its train message's config, beside `ROUND_KEYS`.

    The codec's (centralized algorithms only: the relay refuses compression), the rule's own (the table's
    `client_keys`) and, on a run with FedCOG plugged in (`cog`), FedCOG's (`COG_KEYS`).
    """
    keys = (() if decentralized else CODEC_KEYS) + RULE_KEYS.get(algorithm, ())
    return keys + tuple(key for key in COG_KEYS if cog and key not in keys)


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


def compression_from_config(config: Mapping[str, Any]) -> CompressionSpec:
    """The uplink codec the server asked for in a train message's config ("none" when it names none).

    A message without `compression` asks for none (Flower's own strategies and the decentralized relay send no
    codec); one that names a codec must carry that codec's keys (qsgd: `bits`, `levels`, `qsgd-scope`,
    `qsgd-bucket`; topk: `topk-ratio`): KeyError names a missing one.
    """
    if "compression" not in config:
        return CompressionSpec("none")
    method = str(config["compression"])
    if method == "qsgd":
        return uplink_codec(method, bits=int(config_value(config, "bits")), levels=int(config_value(config, "levels")),
                            qsgd_scope=str(config_value(config, "qsgd-scope")),
                            qsgd_bucket=int(config_value(config, "qsgd-bucket")))
    if method == "topk":
        return uplink_codec(method, topk_ratio=float(config_value(config, "topk-ratio")))
    return uplink_codec(method)
