"""The settings a node's update rule needs, carried in each train message's config as FedProx sends its weight mu.

A Flower ClientApp knows only its message and its own `Context`. Whatever the
server's algorithm asks of the node (the round's learning rate, the uplink
codec, SAM's radius rho, FedSynSAM's mix beta, FedCOG's settings, OledFL's
beta, ...) therefore travels in the train message's `"config"` record under the
run-config key's name, and a node reads it from there (`config_value`,
`message_codec`, `require_settings`), so a node never repeats the
server's settings by hand and the two cannot disagree. (The decentralized mixing
weights travel in the `gossip` record of each node's own message.)

`client_keys` names what a node running an algorithm reads from its message;
the server's strategies send exactly those (server_app/strategies/, and
server_app/registry.py for FedCOG's settings on an `X+cog` row, and the local
training recipe, common/algorithms/local_training_settings.py's `recipe_config`,
on every run). No reader here has a fallback
value: a message that lacks a key is refused naming it.

The schema of a train message is the run config's own: the keys whose `side`
is `NODE` or `BOTH` (common/keys.py; `MESSAGE_KEYS`), each with its type,
default, meaning and the check of the part that declares it. The node checks
what it received with that same check before it trains (`check_train_settings`):
a missing, mistyped, NaN or infinite, or out-of-range value is refused naming
the key, as the run config refuses it, so a server cannot make a node train
with `lr = -1` or a negative SAM radius.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from common.algorithm_table import ALGORITHMS
from common.algorithms.accepted_scale import ACCEPTED_SCALE_KEYS  # noqa: F401 - the optional per-node keys
from common.algorithms.codec_settings import CodecSettings, names_a_codec
from common.algorithms.plugins import rule_keys
from common.algorithms.cog_settings import COG_KEYS
from common.algorithms.local_training_settings import ROUND_LR_KEY, recipe_fields
from common.errors import ConfigError
from common.keys import (  # noqa: F401 - readers
    check_group, config_value, key_name, node_fields, require_settings, sent_to_nodes, shown,
)
from common.run.config import RunConfig, check_parameters, coerce_value, config_fields
from common.run.own_settings import check_message, message_keys

# run-config keys of the uplink codec (its part's keys): every centralized rule may compress its update
CODEC_KEYS: tuple[str, ...] = tuple(key_name(f.name) for f in dataclasses.fields(CodecSettings))
# the run-config keys a train message may carry: those the node reads (side NODE or BOTH, common/keys.py)
MESSAGE_KEYS: tuple[str, ...] = tuple(key_name(f.name) for f in config_fields() if sent_to_nodes(f))


# the local training recipe's keys (common/algorithms/local_training_settings.py `recipe_fields`): every train
# message of fedsynth's app carries them, and the node reads them with the round's rate as the group's value
# (`rule_settings(config, LocalTrainingSettings)`)
RECIPE_KEYS: tuple[str, ...] = tuple(key_name(f.name) for f in recipe_fields())
# what every round's train message carries, whatever the algorithm: the round and its local learning rate
ROUND_KEYS: tuple[str, ...] = ("server-round", ROUND_LR_KEY)

# algorithm -> the run-config keys its client rule reads besides the codec (common/algorithm_table.py's table: its
# settings group's and its client_keys, `rule_keys`)
RULE_KEYS: dict[str, tuple[str, ...]] = {
    name: rule_keys(algorithm) for name, algorithm in ALGORITHMS.items() if rule_keys(algorithm)
}


def optional_client_keys(algorithm: str) -> tuple[str, ...]:
    """The settings a train message to a node running `algorithm` may carry beside `client_keys`, sent to one node
    alone: under bounded influence, the scale the server took of that node's last clipped update and its round
    (`ACCEPTED_SCALE_KEYS`, for the rows whose node state follows their update, `state_follows_update`)."""
    row = ALGORITHMS.get(algorithm)
    return ACCEPTED_SCALE_KEYS if row is not None and row.state_follows_update else ()


# who a refused value's error names as its source
TRAIN_MESSAGE = "train message refused"


def _integer_at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


# The settings a train message carries that are no run-config key, each with what it accepts and its check: the
# node checks them as it checks the schema's keys (`check_train_settings`). A strategy that sends a setting of its
# own to the nodes declares it here.
MESSAGE_ONLY_SETTINGS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "server-round": ("an integer >= 0 (0: FedDDPM's warm-up)", _integer_at_least(0)),
}
# run-config key -> its field name, for the keys a train message is checked for
_FIELD_OF_KEY: dict[str, str] = {key_name(f.name): f.name for f in config_fields()}


def check_train_settings(config: Mapping[str, Any], required: Iterable[str]) -> None:
    """Refuse a train message's config that the node must not train with, naming the key.

    A key of `required` the config lacks is a ValueError naming every missing key (`missing_message`). Then each
    value the config carries under a key of the schema (`MESSAGE_KEYS`) or of `required` is checked exactly as
    the run config checks that key (common/run/config.py `check_parameters`: its type, finite, then its part's
    range and choices), and each of `MESSAGE_ONLY_SETTINGS` (`server-round`) by its own check: a ConfigError names
    the key, the value and what is accepted. Keys outside the schema (a developer's own `node_settings`,
    FedDDPM's `phase`) are the reading rule's business.
    """
    required = tuple(required)
    require_settings(config, required)
    for key, (accepted, ok) in MESSAGE_ONLY_SETTINGS.items():
        if key in config and not ok(config[key]):
            raise ConfigError(f"{TRAIN_MESSAGE}: {key!r} = {shown(config[key])} is invalid; accepted: {accepted}")
    checked = set(MESSAGE_KEYS) | set(required)
    check_parameters(TRAIN_MESSAGE, {_FIELD_OF_KEY[key]: value for key, value in config.items()
                                     if key in checked and key in _FIELD_OF_KEY})


def rule_settings(config: Mapping[str, Any], group: type) -> Any:
    """The value of the settings group `group` (a rule's own, e.g. common/algorithms/rule_settings.py's
    `SAMSettings`) that a train message's config carries: each of its fields that travel (side NODE or BOTH)
    read under its run-config key, coerced to its type and checked by the group's checks as the run config
    checks the key, so a rule reads `rule_settings(config, SAMSettings).sam_rho` and never a key by name.

    A missing key is a ValueError naming every missing key (`missing_message`); a mistyped, NaN or infinite, or
    out-of-range value a ConfigError naming the key, the value and what is accepted. The group's fields that do
    not travel keep their defaults.
    """
    fields = node_fields(group)
    require_settings(config, [key_name(f.name) for f in fields])
    try:
        settings = group(**{f.name: coerce_value(key_name(f.name), config[key_name(f.name)], f.default)
                            for f in fields})
        check_group(settings)
    except ConfigError as err:
        raise ConfigError(f"{TRAIN_MESSAGE}: {err}") from None
    return settings


def client_keys(algorithm: str, decentralized: bool = False, cog: bool = False) -> tuple[str, ...]:
    """The run-config keys a node running `algorithm` reads from its train message's config, beside `ROUND_KEYS`.

    The codec's (centralized algorithms only: the relay refuses compression), the rule's own (the table's
    `client_keys`) and, on a run with FedCOG plugged in (`cog=True`), FedCOG's (`COG_KEYS`).
    """
    keys = (() if decentralized else CODEC_KEYS) + RULE_KEYS.get(algorithm, ())
    return keys + tuple(key for key in COG_KEYS if cog and key not in keys)


def message_codec(config: Mapping[str, Any]) -> CodecSettings:
    """The uplink codec a train message's config asks for, read back as every settings group is (`rule_settings`):
    each key checked and refused by name when missing, mistyped or out of range. A message that names no codec
    (Flower's own strategies and the decentralized relay send none) asks for none."""
    return rule_settings(config, CodecSettings) if names_a_codec(config) else CodecSettings()


def own_message_keys(cfg: RunConfig) -> tuple[str, ...]:
    """The keys of a plugin's own settings that a train message of the run `cfg` carries (its group's `NODE` and
    `BOTH` fields, "<name>.<key>"; common/run/own_settings.py), () for an algorithm without its own."""
    return message_keys(cfg.algorithm) if cfg.own_settings is not None else ()


def own_message_settings(config: Mapping[str, Any], cfg: RunConfig) -> Any:
    """A plugin's own settings group as a train message's `config` gives them, checked with the group's own
    `check()` (a missing key is a ValueError, a bad value a ConfigError naming "<name>.<key>"); None for an
    algorithm without its own settings."""
    return check_message(config, cfg.algorithm, cfg.own_settings, coerce_value)
