"""A run-config key and its checks: the field helper every settings part declares its keys with.

Each part of the run config (common/data/settings.py, common/models/settings.py, the algorithm
families' `*_settings.py`, common/run/settings.py, ...) is a frozen dataclass whose fields are
run-config keys (the field name with `_` written as `-`). `key` gives a field its default and the
text of its row in docs/configuration.md; `require`, `check_choice` and `check_text` raise the
`ConfigError` a part's `check` raises, worded the same for every key so a user can fix the run from
the message alone. A base module: every floor of common/ declares keys.

A key also says which side reads it (`side`): `SERVER` (the server, or each app from its own run config),
`NODE` (the node reads it from the train message, where the server's strategy put it under its run-config
name: the local training recipe, a rule's weights such as SAM's radius) or `BOTH` (the server uses it and sends
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


# how many refused keys an error message names before it counts the rest
LISTED_KEYS = 10


def shown_keys(keys: list[str], limit: int = LISTED_KEYS) -> str:
    """The first `limit` of `keys`, each as `shown` writes it, then how many more: a run config of a million
    unknown keys (or one key of a million characters) is refused in a message of a few lines."""
    named = ", ".join(shown(key) for key in keys[:limit])
    return named if len(keys) <= limit else f"{named} and {len(keys) - limit} more"


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



# ----- settings groups -------------------------------------------------------------------------------------
# An algorithm's own settings are one frozen dataclass of `key` fields (a "settings group", e.g. SAM's radius,
# common/algorithms/rule_settings.py), declared once in the algorithm's module. A group may extend others by
# inheritance (MoFedSAM's is SAM's and its alpha): each group declares and checks its own fields, and the run
# config composes the groups (common/run/config.py `PARTS`). A strategy class that declares `settings = Group`
# takes the group's fields as its keyword parameters (server_app/strategies/parameters.py), and the group's
# `NODE`/`BOTH` fields travel in its train messages under their run-config keys (`message_config`).


def own_fields(group: type) -> list[dataclasses.Field]:
    """The fields `group` declares itself (not those of the groups it extends), in declaration order."""
    own = group.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(group) if f.name in own and "declared_in" not in f.metadata]


def check_group(settings: Any) -> None:
    """Run every check of a settings group's value: each group's own `check`, the extended groups' first.

    ConfigError names the key, its value and the accepted values."""
    for group in reversed(type(settings).__mro__):
        if "check" in group.__dict__:
            group.check(settings)


def node_fields(group: type) -> list[dataclasses.Field]:
    """The fields of `group` (its own and those it extends) that travel in the train message (`sent_to_nodes`)."""
    return [f for f in dataclasses.fields(group) if sent_to_nodes(f)]


def node_keys(group: type | None) -> tuple[str, ...]:
    """The run-config keys of `group`'s fields that travel in the train message; () for no group."""
    return () if group is None else tuple(key_name(f.name) for f in node_fields(group))


def message_config(group: type, values: Any) -> dict[str, Any]:
    """The train message's config entries of `group`: each field that travels (`node_fields`) under its run-config
    key, its value read from `values` (a value of the group, a strategy or a run config: any object with the
    fields as attributes)."""
    return {key_name(f.name): getattr(values, f.name) for f in node_fields(group)}


def group_of(group: type, values: Any) -> Any:
    """The value of `group` that `values` (a run config, a strategy: any object with the group's fields as
    attributes) holds: `SAMSettings` of a run config is its SAM radius."""
    return group(**{f.name: getattr(values, f.name) for f in dataclasses.fields(group)})


def same_key(part: type, name: str, side: str | None = None, default: Any = dataclasses.MISSING) -> Any:
    """A field of a settings group that is the key `name` another part declares (a strategy class's group that
    takes FedCOG's first round, which FedCOG's part declares): the declaration's default and text, not a second
    declaration (`own_fields` skips it, so the run config and its docs keep the part's). `side` overrides the
    side that sends it (`SERVER`: the class sends it itself); `default` the default, where the run config resolves
    the key's own from others (FedDDPM+'s FID features: "auto" is the run config's, by its partition)."""
    declared = part.__dataclass_fields__[name]
    metadata = {**declared.metadata, "declared_in": part.__qualname__, **({"side": side} if side else {})}
    return dataclasses.field(default=declared.default if default is dataclasses.MISSING else default,
                             metadata=metadata)


def parameter(default: Any, meaning: str) -> Any:
    """A field of a strategy class's settings group that is no run-config key: a grouped value the class takes
    (FedCOG's `cog_settings`), read by the server alone."""
    return dataclasses.field(default=default, metadata={"meaning": meaning, "source": "", "side": SERVER,
                                                       "parameter_only": True})
