"""A plugin's own settings: its settings group's keys as run-config keys under its name, `<name>.<key>`.

A plugin (`algorithm = "package.module:Name"`, common/algorithms/plugins.py) declares its settings as a built-in
algorithm does: one frozen dataclass, its fields declared with `key(default, meaning, source, side)` and a
`check()` that raises ConfigError naming the key (`require(self.eta > 0, "eta", self.eta, "a number > 0")`),
set as its strategy class's `settings`. Its keys are the fields' keys under the plugin's name, the name of the
strategy class that declares the group, in lower case (FedAdam: "fedadam"):

    [tool.flwr.app.config]
    algorithm = "fedadam:FEDADAM"
    [tool.flwr.app.config.fedadam]      # Flower flattens the table to the keys "fedadam.eta", "fedadam.tau"
    eta = 0.03
    tau = 0.001

or `--run-config "fedadam.eta=0.03"` (Flower's own form of a key of a table; `flwr run` takes an override
only of a key the app's pyproject declares, so a deployment declares the plugin's keys there). Why the dotted
form: it is how Flower names a table's keys in the run config, so a plugin's keys group in the pyproject as its
settings group groups them in the code, and a plugin's key can never shadow one of fedsynth's (the learning rate's). Why the
class's name: the server's strategy, the node's check and the run config all know the class (the node imports
it when it parses the run config), so each derives the same keys without being told.

What this module does with them, on the server and on every node (`parse_run_config`, `parse_own_settings`): the
keys under the plugin's name are typed as each field's default is (a number, finite; an integer; true or false;
text), and a key the group does not declare is refused with the closest one; the group is built and its checks
run, and their ConfigError is reworded to name the whole key ("fedadam.eta"). The group's `NODE`/`BOTH` fields
travel in the train message under their whole keys (`message_entries`), where the node checks them with the same
group (`check_message`) before its client rule reads them (`LocalJob.own_settings`).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from common.algorithms.plugins import import_attribute, is_plugin, plugin_algorithm
from common.errors import ConfigError
from common.keys import check_group, key_name, require_settings, sent_to_nodes, shown_keys

SEPARATOR = "."  # Flower's: a TOML table's key `k` of table `t` is the run-config key "t.k"
# how a refused train-message value is introduced (common/run/client_settings.py's TRAIN_MESSAGE)
TRAIN_MESSAGE = "train message refused"
# fedsynth's own modules: a group a plugin inherits from one of their classes is a built-in's, whose keys are
# fedsynth's run-config keys, not the plugin's
_OWN_MODULES = ("server_app.", "fedsynth.", "common.")


def is_own_key(key: str) -> bool:
    """Whether a run-config key is a plugin's own, `<name>.<key>` (no key of fedsynth's has a dot)."""
    return SEPARATOR in key


def settings_owner(strategy: type) -> type | None:
    """The class of `strategy`'s MRO that declares its `settings` group, when that is not one of fedsynth's own
    (a built-in's group holds fedsynth's run-config keys, not a plugin's); None otherwise."""
    owner = next((cls for cls in strategy.__mro__ if "settings" in vars(cls)), None)
    if owner is None or owner.__module__.startswith(_OWN_MODULES) or owner.settings is None:
        return None
    return owner


def own_group(strategy: type) -> type | None:
    """The plugin's own settings group of the strategy class `strategy` (`settings_owner`'s), or None.

    TypeError names the class when its `settings` is not a dataclass."""
    owner = settings_owner(strategy)
    if owner is None:
        return None
    if not (isinstance(owner.settings, type) and dataclasses.is_dataclass(owner.settings)):
        raise TypeError(f"{owner.__name__}.settings must be a frozen dataclass whose fields are "
                        f"common.keys.key(...), not {owner.settings!r}")
    return owner.settings


def own_keys(strategy: type) -> dict[str, dataclasses.Field]:
    """{"<name>.<key>": field} of the plugin strategy class's own settings group ({} without one): `<name>` is the
    name of the class that declares the group, in lower case (FedAdam: "fedadam.eta")."""
    group = own_group(strategy)
    if group is None:
        return {}
    name = settings_owner(strategy).__name__.lower()
    return {f"{name}{SEPARATOR}{key_name(f.name)}": f for f in dataclasses.fields(group)}


def strategy_of(path: str) -> type | None:
    """The strategy class of the plugin `path` (imported and checked), None for a built-in algorithm's name."""
    if not is_plugin(path):
        return None
    return import_attribute(plugin_algorithm(path).strategy, f"run config key 'algorithm' = {path!r}: its strategy")


def settings_group(path: str) -> type | None:
    """The own settings group of the algorithm `path` (a plugin's strategy class's, `own_group`), or None.

    ConfigError names the path when its class's `settings` is not a dataclass, and names the class and the
    fields when its constructor does not take every field of the group: a constructor written by hand that
    leaves one out would run with its default whatever the run config says (the constructor fedsynth generates
    from the group takes them all, server_app/strategies/parameters.py `with_settings`).
    """
    strategy = strategy_of(path)
    try:
        group = None if strategy is None else own_group(strategy)
    except TypeError as err:
        raise ConfigError(f"run config key 'algorithm' = {path!r}: {err}") from None
    if group is not None:
        taken = inspect.signature(strategy).parameters
        missing = [f.name for f in dataclasses.fields(group) if f.name not in taken]
        if missing:
            raise ConfigError(f"run config key 'algorithm' = {path!r}: {strategy.__name__}'s constructor does not take "
                              f"{', '.join(missing)} of its settings group {group.__name__}, so the run config's "
                              f"keys for them would be ignored: leave the constructor to fedsynth (no __init__) or "
                              "name each field as a keyword parameter")
    return group


def _reworded(err: ConfigError, strategy: type) -> ConfigError:
    """The group's ConfigError naming the whole key: "run config key 'eta'" becomes "run config key 'fedadam.eta'"."""
    message = str(err)
    for whole in own_keys(strategy):
        local = whole.partition(SEPARATOR)[2]
        message = message.replace(f"run config key '{local}'", f"run config key '{whole}'")
    return ConfigError(message)


def checked_group(strategy: type, values: Mapping[str, Any]) -> Any:
    """The class's own group built from typed `values` ({field name: value}) and checked; ConfigError names the
    whole key."""
    try:
        settings = own_group(strategy)(**values)
        check_group(settings)  # the group's `check()`, and those of the groups it extends
    except ConfigError as err:
        raise _reworded(err, strategy) from None
    return settings


def parse_own_settings(path: str, raw: Mapping[str, Any], coerce: Callable[[str, Any, Any], Any]) -> Any:
    """The algorithm `path`'s own settings group from the run config's dotted keys `raw`, checked; None without one.

    `coerce(key, value, default)` types a value as the key's default (common/run/config.py's). A dotted key that
    is not one of the group's is a ConfigError naming it (and the closest of the group's keys).
    """
    strategy = strategy_of(path)
    group = settings_group(path)
    keys = own_keys(strategy) if group is not None else {}
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(keys), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        owner = (f"the settings of algorithm {path!r} are {', '.join(map(repr, keys))}" if keys else
                 f"algorithm {path!r} declares no settings of its own")
        raise ConfigError(f"unknown run config key(s): {shown_keys(unknown)}{hint}; a key with a dot is a "
                          f"plugin's own, '<name>.<key>', and {owner}")
    if group is None:
        return None
    values = {f.name: coerce(key, raw[key], f.default) for key, f in keys.items() if key in raw}
    return checked_group(strategy, values)


def as_config(path: str, settings: Any) -> dict[str, Any]:
    """The plugin's settings as run-config keys ({"fedadam.eta": 0.03, ...}; {} without any)."""
    if settings is None:
        return {}
    return {key: getattr(settings, f.name) for key, f in own_keys(strategy_of(path)).items()}


def message_entries(strategy: type, values: Any) -> dict[str, Any]:
    """The train message's config entries of a plugin strategy class's own group: its `NODE` and `BOTH` fields
    under their whole keys ("fedadam.local-lr-scale"), each read from `values` (the strategy, or a group value);
    {} for a class without its own group."""
    return {key: getattr(values, f.name) for key, f in own_keys(strategy).items() if sent_to_nodes(f)}


def message_keys(path: str) -> tuple[str, ...]:
    """The keys of the algorithm `path`'s own settings that its train messages carry (`message_entries`)."""
    strategy = strategy_of(path)
    return () if strategy is None else tuple(k for k, f in own_keys(strategy).items() if sent_to_nodes(f))


def check_message(config: Mapping[str, Any], path: str, settings: Any,
                  coerce: Callable[[str, Any, Any], Any]) -> Any:
    """The plugin's settings of a train message's `config`, checked by the node with the group's own checks.

    `settings` is the group the node parsed from its run config: the message's `NODE`/`BOTH` fields replace
    its values, each typed and then checked as the run config checks them. A missing one is a ValueError naming
    it, a bad one a ConfigError naming the whole key. Returns the group the client rule reads (None without one).
    """
    if settings is None:
        return None
    strategy = strategy_of(path)
    keys = message_keys(path)
    require_settings(config, keys)
    fields = own_keys(strategy)
    try:
        values = {fields[key].name: coerce(key, config[key], fields[key].default) for key in keys}
        return checked_group(strategy, {**dataclasses.asdict(settings), **values})
    except ConfigError as err:
        raise ConfigError(f"{TRAIN_MESSAGE}: {err}") from None
