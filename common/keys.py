"""A run-config key and its checks: the field helper every settings part declares its keys with.

Each part of the run config (common/data/settings.py, common/models/settings.py, the algorithm
families' `*_settings.py`, common/run/settings.py, ...) is a frozen dataclass whose fields are
run-config keys (the field name with `_` written as `-`). `key` gives a field its default and the
text of its row in docs/configuration.md; `require`, `check_choice` and `check_text` raise the
`ConfigError` a part's `check` raises, worded the same for every key so a user can fix the run from
the message alone. A base module: every floor of common/ declares keys.

A key also says which side reads it (`side`): `SERVER` (the server, or each app from its own run config),
`NODE` (the node reads it from the train message, where the server's strategy put it under its run-config
name: the local training recipe, a rule's weights such as `sam-rho`) or `BOTH` (the server uses it and sends
it, the node reads it from the message: the uplink codec). The `NODE` and `BOTH` keys are the schema of a
train message: the node checks every one a message carries with the key's own run-config check
(common/run/client_settings.py `check_train_settings`). `config_value` and `require_settings` have no
fallback value and refuse a message that lacks a key, naming it and whose duty it was to send it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from common.errors import ConfigError


# Which side reads a key (`key`'s `side`): the server (or each app from its run config), the node from its
# train message, or both (the server uses it and sends it to the node)
SERVER, NODE, BOTH = "server", "node", "both"
SIDES = (SERVER, NODE, BOTH)


def key(default: Any, meaning: str, source: str = "", side: str = SERVER) -> Any:
    """A run-config key: its default, its meaning, where the default comes from (docs/configuration.md) and the
    side that reads it (`SIDES`; `NODE` and `BOTH` keys travel in the train message)."""
    if side not in SIDES:
        raise ValueError(f"key side {side!r} is not one of {', '.join(SIDES)}")
    return dataclasses.field(default=default, metadata={"meaning": meaning, "source": source, "side": side})


def sent_to_nodes(field: dataclasses.Field) -> bool:
    """Whether a settings field's key travels in the train message (its side is `NODE` or `BOTH`)."""
    return field.metadata.get("side", SERVER) in (NODE, BOTH)


def key_name(field_name: str) -> str:
    """The run-config key of a dataclass field (`num_server_rounds` -> `num-server-rounds`)."""
    return field_name.replace("_", "-")


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` for an error message, cut to about `limit` characters (a huge value must not flood the
    message, the log or an error reply that carries it back to the server)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def require(condition: bool, name: str, value: Any, accepted: str) -> None:
    """Raise ConfigError naming the key `name`, its value and the accepted values unless `condition` holds."""
    if not condition:
        raise ConfigError(f"run config key '{name}' = {shown(value)} is invalid; accepted: {accepted}")


def check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    """Raise ConfigError unless the key `name`'s `value` is one of `choices`."""
    choices = tuple(choices)
    require(value in choices, name, value, "one of " + ", ".join(choices))


def check_text(settings: Any, part: type) -> None:
    """No text key of `part` (a settings dataclass) holds a NUL: it fails deep in the OS ("embedded null byte")."""
    for f in dataclasses.fields(part):
        value = getattr(settings, f.name)
        require(not (isinstance(value, str) and "\x00" in value), key_name(f.name), value, "text without a NUL byte")


def missing_message(keys: Iterable[str]) -> str:
    """Why a train message without `keys` is refused, and whose duty they are."""
    names = ", ".join(repr(key) for key in keys)
    return (f"the train message's config lacks {names}: the server's strategy sends it "
            "(fedsynth.strategies does; a strategy of your own must put it in train_config or node_settings)")


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """The setting `key` of a train message's config; KeyError naming the key and the server's duty when absent."""
    if key not in config:
        raise KeyError(missing_message([key]))
    return config[key]


def require_settings(config: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Refuse a train message whose config lacks any of `keys`: ValueError naming every missing key."""
    missing = [key for key in keys if key not in config]
    if missing:
        raise ValueError(missing_message(missing))

