"""The keyword parameters of fedsynth's strategies: their defaults and meanings, defined once.

Every strategy class (server_app/strategies/, and the public names of `fedsynth.strategies`) is built from
typed keyword parameters only, as Flower's own strategies are. A parameter has the name of the run-config
key it mirrors (`server_lr` <-> `server-lr`), so fedsynth's app builds a strategy from a run config by reading
each of the class's parameters under its own name (server_app/registry.py `build_strategy`), and its default
is the run config's (`DEFAULTS`): a public class and `fedsynth run` start from the same numbers.

`documented` also makes the class's constructor check what it is given (`checked_init`): a parameter that
is a run-config key is refused as the run config refuses the key, with the same message
(common/run/config.py `check_parameters`), so `FedAvg(aggregation="weigthed")` fails where `aggregation = "weigthed"`
fails; the few others are checked by `OWN_PARAMETER_CHECKS`.

`documented` appends a class's "Parameters" section to its docstring, so `help(FedSynSAM)` lists every
parameter with its type, default and meaning. A parameter that is a run-config key means what the key means:
its text is the key's in the run config's part (common/data/settings.py, common/algorithms/*_settings.py, ...),
with the name it travels under when the nodes read it; the few others are described in `OWN_PARAMETER_DOCS`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import math
import textwrap
import typing
from collections.abc import Iterable
from typing import Any, Callable

from common.algorithm_table import ALGORITHMS
from common.algorithms.plugins import rule_keys
from common.algorithms.aggregation_settings import AUTO_MEAN
from common.algorithms.cog_settings import CogSettings
from common.algorithms.codec_settings import CodecSettings
from common.run.client_settings import CODEC_KEYS
from common.run.aggregation import BoundedInfluence, Krum, TrimmedMean, mean_of
from common.errors import ConfigError
from common.keys import check_group, key_name, message_config, sent_to_nodes
from common.run.config import RunConfig, check_parameters, coerce_value
from common.run.own_settings import message_entries, own_group
from common.run.task import ServerTask, task_values

DEFAULTS = RunConfig()  # the run config's defaults (docs/configuration.md): every strategy parameter's default

# run-config keys the nodes read from the train message's config (common/run/client_settings.py)
_SENT = set(CODEC_KEYS) | {key for algorithm in ALGORITHMS.values() for key in rule_keys(algorithm)}

# What each parameter that is not a run-config key means; a run-config key's meaning is its field's in the
# run config's parts (docs/configuration.md), defined once there.
OWN_PARAMETER_DOCS: dict[str, str] = {
    "fraction_evaluate": "Fraction of the nodes sent an evaluate message after each round. A round whose train replies\n"
                         "all carried `local-test-accuracy` (the received model's evaluation, as fedsynth's clients do)\n"
                         "sends none, and the carried numbers become the round's evaluate metrics.",
    "weighted_by_key": "The reply metric that weighs each reply in the averages, as in Flower's strategies. A\n"
                       "reply that also carries \"num-examples\" must give both the same value, or it is dropped.",
    "wiring": "What the app around the strategy wires in, one `AppWiring(nodes, parameter_names, lr_schedule,\n"
              "node_settings)` (server_app/strategies/wiring.py; None: none of them): the node table of a handshake\n"
              "(None: the grid's nodes, numbered in node-id order), the model's trainable parameter names (None:\n"
              "judged from the arrays), each round's \"lr\" = lr_schedule(server_round) (None: `start()`'s\n"
              "`train_config` decides) and your own settings added to every train message's config (fedsynth's app\n"
              "sends FedCOG's there on a run with FedCOG). fedsynth's app builds it from its run.",
    "gossip": "The graph and mixing of each round, one `Gossip(topology, peers, mixing, relay_mixing)`\n"
              "(common/run/gossip.py; its fields mean the run-config keys of the same names: the topology, the random\n"
              "topologies' neighbours k, the mixing weights, and whether the relay sends each node the weighted sum of\n"
              "its neighbours' models instead of each); None: the run config's defaults.",
    "min_available_nodes": "Each round waits until the grid has at least this many nodes, as Flower's strategies do.",
    "task": "The model the server builds itself and the data's shape: `ServerTask(model=..., dataset=...)`, or for\n"
            "your own data `ServerTask(model=..., partition=\"node\", image_channels=..., image_size=...,\n"
            "num_classes=...)` (common.run.task.ServerTask; its fields mean what the run-config keys of the same\n"
            "names mean).",
    "aggregation": "How the server combines the updates, and the bounds of that mean. A plain mean (the papers'):\n"
                   "\"weighted\" (by `weighted_by_key`), \"uniform\" (1/S), \"median\", `TrimmedMean(fraction)` or\n"
                   "`Krum(byzantine_nodes)` (run-config keys `aggregation`, `trim-fraction`, `byzantine-nodes`). A\n"
                   "bounded one: `Bounded(mean, influence)`, its `influence` a `BoundedInfluence(update_norm_ratio,\n"
                   "weight_share, update_norm, action)` that bounds each update's norm and caps each node's weight\n"
                   "share; `Bounded(\"weighted\")` (influence `BOUNDED_INFLUENCE`: 1.5x the lower-median update norm, a\n"
                   "share of at most 0.4) is what the run config's `bounded-influence = true` sets, and each round's\n"
                   "train metrics then carry \"clipped-updates\" and \"weight-cap-bound\". The default is the class's\n"
                   "paper mean, unbounded (uniform for FedSynSAM, FedDDPM and FedDDPMPlus, weighted for the others;\n"
                   "its row's `mean` and `rule`).",
    "bounded_influence": "The relay's bounds (it has no round mean to bound): None, none. `BoundedInfluence(weight_share,\n"
                         "update_norm, action)` caps each node's share of the metric means and bounds each node's model\n"
                         "change (clip or refuse); its `update_norm_ratio` is unused. `BOUNDED_INFLUENCE` is what the run\n"
                         "config's `bounded-influence = true` sets.",
    "codec": "The uplink codec the nodes compress their update with, sent in every train message's config:\n"
             "None (no compression), `QSGD(bits, levels, qsgd_scope, qsgd_bucket, error_feedback)` or\n"
             "`TopK(topk_ratio, error_feedback)` (common/run/codecs.py), each a `CodecSettings`, the run config's\n"
             "codec part (common/algorithms/codec_settings.py; its fields mean the run-config keys of their names).",
    "cog_settings": "FedCOG's generation and distillation settings, sent in every train message's config under\n"
                    "their run-config keys: a `CogSettings` (the run config's FedCOG part,\n"
                    "common/algorithms/cog_settings.py); None: its defaults. Its `cog_start_round` is this class's.",
}


def _number_in(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      and low <= v <= high)


def _config_scalar(value: Any) -> bool:
    """A value a Flower ConfigRecord carries to the nodes: text, bytes, a bool, an int or a finite float."""
    return isinstance(value, (str, bytes, bool, int)) or (isinstance(value, float) and math.isfinite(value))


def _config_value(value: Any) -> bool:
    """A ConfigRecord value: a scalar (`_config_scalar`) or a list of scalars of one kind."""
    if isinstance(value, list):
        return all(_config_scalar(v) for v in value) and len({type(v) for v in value}) <= 1
    return _config_scalar(value)


def _node_settings(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(isinstance(k, str) and k != "" and _config_value(v)
                                                             for k, v in value.items()))


def _checked(kind: type) -> Callable[[Any], bool]:
    """None, or a `kind` whose own `check()` passes: a bad field is refused as the run config refuses its key."""
    def ok(value: Any) -> bool:
        if value is None:
            return True
        if not isinstance(value, kind):
            return False
        value.check()
        return True
    return ok


def _of_type(module: str, name: str) -> Callable[[Any], bool]:
    """None or an instance of the value type `name` of `module` (imported when a value is checked: the value
    modules import this one)."""
    return lambda value: value is None or isinstance(value, getattr(importlib.import_module(module), name))


def _node_table(value: Any) -> bool:
    from server_app.strategies.node_table import NodeInfo

    return value is None or (isinstance(value, list) and all(isinstance(n, NodeInfo) for n in value))


# The parameters that are not run-config keys, checked as strictly: (accepted values, check)
OWN_PARAMETER_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "fraction_evaluate": ("a number in [0, 1]", _number_in(0.0, 1.0)),
    "min_available_nodes": ("an integer >= 0",
                            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "weighted_by_key": ("a metric name (non-empty text)", lambda v: isinstance(v, str) and v != ""),
    "sam": ("true or false", lambda v: isinstance(v, bool)),
    "codec": ("None or an uplink codec, fedsynth.strategies.QSGD(...) or TopK(...)", _checked(CodecSettings)),
    "cog_settings": ("None or a valid fedsynth.client.CogSettings", _checked(CogSettings)),
    "node_settings": ("None or a dict of setting names (text) to values a Flower ConfigRecord carries (text, bytes, "
                      "a bool, an int, a finite float, or a list of one of these)", _node_settings),
    "lr_schedule": ("None or a function of the server round returning the round's lr",
                    lambda v: v is None or callable(v)),
    "nodes": ("None or a list of fedsynth.strategies.NodeInfo", _node_table),
    "parameter_names": ("None or a list of the model's parameter names (text)",
                        lambda v: v is None or (isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v))),
    "wiring": ("None or a fedsynth.strategies.AppWiring", _of_type("server_app.strategies.wiring", "AppWiring")),
    "gossip": ("None or a fedsynth.strategies.Gossip", _of_type("common.run.gossip", "Gossip")),
}


def check_given(owner: str, values: dict[str, Any]) -> None:
    """Raise ConfigError for a parameter value the run config (or `OWN_PARAMETER_CHECKS`) refuses.

    A value object (a codec, `BoundedInfluence`, `TrimmedMean`, `ServerTask`) checked itself when it was built;
    any other `aggregation` (a name, a `Bounded` one's mean, or a value of the wrong type) is checked as the
    run-config key."""
    values = {name: value for name, value in values.items() if name != "bounded_influence"}  # the relay's: a value
    if isinstance(values.get("aggregation"), BoundedInfluence):
        raise ConfigError(f"{owner}: parameter aggregation = {values['aggregation']!r} gives bounds without their "
                          "mean; pass aggregation=Bounded(mean, influence=...), e.g. Bounded(\"weighted\", "
                          "BOUNDED_INFLUENCE)")
    if "aggregation" in values:
        values["aggregation"] = mean_of(values["aggregation"])  # a `Bounded` one's bounds checked themselves
        if isinstance(values["aggregation"], (TrimmedMean, Krum)):
            del values["aggregation"]
    if values.get("aggregation") == AUTO_MEAN:  # the run config resolves "auto" by its algorithm; a class has its own
        raise ConfigError(f"{owner}: parameter aggregation = {AUTO_MEAN!r} is the run config's; a class takes "
                          "\"weighted\", \"uniform\" or a robust mean (its default is its paper's mean)")
    if isinstance(values.get("task"), ServerTask):
        check_parameters(owner, task_values(values["task"]))
    for name, value in values.items():
        if name in OWN_PARAMETER_CHECKS:
            accepted, ok = OWN_PARAMETER_CHECKS[name]
            if not ok(value):
                raise ConfigError(f"{owner}: parameter {name} = {value!r} is invalid; accepted: {accepted}")
    check_parameters(owner, values)


def check_node_settings_keys(owner: str, arguments: dict[str, Any]) -> None:
    """Refuse a `wiring.node_settings` entry that would override, with another value, a setting the class sends its
    nodes from one of its own parameters (`FedAvg(codec=QSGD(bits=4))` with a `node_settings` entry of the codec's
    bit width 8: the nodes would encode with 8 bits and the server decode with 4)."""
    node_settings = wired_settings(arguments.get("wiring"))
    codec = arguments.get("codec")
    from_codec = message_config(CodecSettings, CodecSettings.of(codec or CodecSettings())) if (
        "codec" in arguments) else {}
    for key, value in node_settings.items():
        name = key.replace("-", "_")
        if key in from_codec and from_codec[key] != value:
            raise ConfigError(f"{owner}: node_settings key {key!r} = {value!r} overrides what the strategy sends its "
                              f"nodes from its parameter codec = {codec!r}; set codec instead")
        if key in _SENT and name in arguments and arguments[name] != value:
            raise ConfigError(f"{owner}: node_settings key {key!r} = {value!r} overrides what the strategy sends "
                              f"its nodes from its parameter {name} = {arguments[name]!r}; set {name} instead")


def wired_settings(wiring: Any) -> dict[str, Any]:
    """The `node_settings` of a strategy's `wiring` (an `AppWiring` or None): {} when there are none."""
    return dict(getattr(wiring, "node_settings", None) or {})


# Flower's FedAvg parameters that every class takes with Flower's meaning, beside its own (`checked_init` keeps
# them on the strategy as attributes of the same name): the reply records' names, which fedsynth's nodes read
# under Flower's defaults only, and the metric aggregation functions, `(replies' RecordDicts, weighted_by_key)
# -> MetricRecord`, whose record is added to the round's train (evaluate) metrics, as Flower's FedAvg returns it.
FLOWER_PARAMETERS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "arrayrecord_key": ('"arrays", the record fedsynth\'s nodes read the model from and reply with',
                        lambda v: v == "arrays"),
    "configrecord_key": ('"config", the record fedsynth\'s nodes read the round\'s settings from',
                         lambda v: v == "config"),
    "train_metrics_aggr_fn": ("None or a function (list of reply RecordDicts, weighted_by_key) -> MetricRecord",
                              lambda v: v is None or callable(v)),
    "evaluate_metrics_aggr_fn": ("None or a function (list of reply RecordDicts, weighted_by_key) -> MetricRecord",
                                 lambda v: v is None or callable(v)),
}
FLOWER_DEFAULTS: dict[str, Any] = {"arrayrecord_key": "arrays", "configrecord_key": "config",
                                   "train_metrics_aggr_fn": None, "evaluate_metrics_aggr_fn": None}
# Flower's parameters whose meaning fedsynth's classes do not have: (Flower's meaning, the parameters to use instead)
FLOWER_ONLY: dict[str, tuple[str, str]] = {
    "min_train_nodes": ("the fewest nodes sampled for training",
                        "it samples fraction_train of the nodes (the decentralized relay: all of them) and needs "
                        "min_nodes good replies: use fraction_train and min_nodes"),
    "min_evaluate_nodes": ("the fewest nodes sampled for evaluation",
                           "it samples fraction_evaluate of the nodes: use fraction_evaluate"),
}


def refuse_unknown_parameters(owner: str, given: Iterable[str], valid: Iterable[str],
                              cls: type | None = None) -> None:
    """TypeError naming `owner` and the nearest valid parameter for a keyword that is none of `valid`, the
    fedsynth parameters to use for a Flower parameter fedsynth's classes do not have (`FLOWER_ONLY`), or, for a
    former flat parameter of `cls` that is now part of a grouped one (`node_settings` in `wiring`), that grouped
    parameter and how to pass it (`moved_parameter`)."""
    valid = list(valid)
    for name in given:
        if name in valid:
            continue
        if name in FLOWER_ONLY:
            meaning, instead = FLOWER_ONLY[name]
            raise TypeError(f"{owner}: parameter {name!r} is Flower's ({meaning}), which {owner} does not take; "
                            f"{instead}")
        moved = moved_parameter(name, parameter_types(cls)) if cls is not None else None
        if moved is not None:
            raise TypeError(f"{owner}: parameter {name!r} is {moved[0]}, not a parameter of {owner}: pass {moved[1]}")
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TypeError(f"{owner}: unknown parameter {name!r}; {hint}{owner}'s parameters: {', '.join(valid)}")


def parameter_types(cls: type) -> dict[str, Any]:
    """{parameter: its type} of `cls`'s constructor: its settings groups' fields (`settings`) and the first
    constructor written out in its lineage (FedAvg's, the relay's), as `declared_parameters` reads them; a type that
    does not resolve is left out (it only serves a refusal's wording)."""
    types: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        group = getattr(init, "settings_group", None)
        try:
            if group is None:
                return {**typing.get_type_hints(init), **types}
            if dataclasses.is_dataclass(group):
                types = {**typing.get_type_hints(group), **types}
        except (NameError, TypeError):
            continue
    return types


def _value_types(hint: Any) -> list[type]:
    """The grouped value types (dataclasses) a parameter's type names, through `X | None` and unions."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [value for arg in typing.get_args(hint) for value in _value_types(arg)]


def _snake_case(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def moved_parameter(name: str, types: dict[str, Any]) -> tuple[str, str] | None:
    """Where a flat parameter `name` (one of the last release's) went, as (where, how to pass it), or None: a field
    of the grouped value a parameter takes (`nodes`: "a field of `wiring`", "wiring=AppWiring(nodes=...)"), or
    the field whose type it was named after (`bounded_influence`, a `BoundedInfluence`: "the field `influence`
    of `aggregation`", "aggregation=Bounded(mean=..., influence=...)"). Read from `types` (`parameter_types`)
    alone, so a new grouped value is found without a list to keep."""
    for parameter, hint in types.items():
        for value in _value_types(hint):
            fields = dataclasses.fields(value)
            required = [f.name for f in fields if f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING]
            named = {f.name: f.name for f in fields}
            try:
                field_types = typing.get_type_hints(value)
            except (NameError, TypeError):
                field_types = {}
            named |= {_snake_case(t.__name__): field for field, field_hint in field_types.items()
                      for t in _value_types(field_hint) if field in named and _snake_case(t.__name__) not in named}
            if name in named:
                field = named[name]
                shown = ", ".join(f"{f}=..." for f in [*[r for r in required if r != field], field])
                where = f"a field of `{parameter}`" if field == name else f"the field `{field}` of `{parameter}`"
                return where, f"{parameter}={value.__name__}({shown})"
    return None


def checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """`init` (a strategy's `__init__`) that first checks the values it was given (`check_given`).

    A value that is the parameter's own default is not checked again (the run config's defaults pass, and a
    default of None means "not given"). An unknown keyword is refused naming the class and the nearest valid
    parameter (`refuse_unknown_parameters`); Flower's `FLOWER_PARAMETERS` are taken, checked and kept as
    attributes after `init`.
    """
    signature = inspect.signature(init)
    own = [name for name in signature.parameters if name != "self"]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        owner = type(self).__name__
        refuse_unknown_parameters(owner, kwargs, own + list(FLOWER_PARAMETERS), type(self))
        flower = {name: kwargs.pop(name) for name in list(kwargs) if name in FLOWER_PARAMETERS and name not in own}
        for name, value in flower.items():
            accepted, ok = FLOWER_PARAMETERS[name]
            if not ok(value):
                raise ConfigError(f"{owner}: parameter {name} = {value!r} is invalid; accepted: {accepted}")
        bound = signature.bind(self, *args, **kwargs)
        given = {name: value for name, value in list(bound.arguments.items())[1:]
                 if name in signature.parameters and value is not signature.parameters[name].default}
        check_given(type(self).__name__, given)
        bound.apply_defaults()
        check_node_settings_keys(type(self).__name__, dict(list(bound.arguments.items())[1:]))
        init(self, *args, **kwargs)
        for name, value in flower.items():
            setattr(self, name, value)

    return __init__


def parameter_meaning(name: str, cls: type | None = None) -> str:
    """What parameter `name` of `cls` means: its settings group's field's meaning (and the name the nodes read it
    under), its run-config key's, or `OWN_PARAMETER_DOCS`'s text."""
    fields = {f.name: f for group in settings_groups(cls) for f in dataclasses.fields(group)} if cls else {}
    if name in OWN_PARAMETER_DOCS and (name not in fields or fields[name].metadata.get("parameter_only")):
        return OWN_PARAMETER_DOCS[name]
    field = fields.get(name) or {f.name: f for f in dataclasses.fields(RunConfig)}[name]
    if field.metadata.get("parameter_only"):  # a grouped value (a server training's settings), no run-config key
        return textwrap.fill(str(field.metadata["meaning"]), width=100, break_on_hyphens=False)
    key = key_name(name)
    sent = f' Sent to the nodes as "{key}".' if key in _SENT or sent_to_nodes(field) else ""
    meaning = str(field.metadata["meaning"]).rstrip(".")
    return textwrap.fill(f"{meaning} (run-config key `{key}`).{sent}", width=100, break_on_hyphens=False)


def parameter_section(cls: type) -> str:
    """The "Parameters" section of `cls`'s docstring: each keyword parameter with its type, default and meaning."""
    lines = ["Parameters", "----------"]
    for parameter in inspect.signature(cls).parameters.values():
        default = parameter.default
        shown = getattr(default, "__name__", None) or repr(default)
        lines.append(f"{parameter.name} : {parameter.annotation} (default: {shown})")
        lines.extend("    " + line.strip() for line in parameter_meaning(parameter.name, cls).splitlines())
    lines.append("Flower's FedAvg parameters, taken with Flower's meaning:")
    for name, (accepted, _) in FLOWER_PARAMETERS.items():
        lines.append(f"{name} (default: {FLOWER_DEFAULTS[name]!r})")
        lines.append(f"    {accepted}.")
    lines.append("    A function's MetricRecord is added to the round's metrics (`Result`), beside fedsynth's means.")
    for name, (meaning, instead) in FLOWER_ONLY.items():
        lines.append(f"{name}: refused ({meaning} in Flower); {instead}.")
    return "\n".join(lines)


def documented(cls: type) -> type:
    """Append the class's parameter section to its docstring, so that `help(cls)` lists every parameter, and
    make its own constructor check what it is given (`checked_init`; a constructor made from the class's settings
    group checks them itself, `with_settings`)."""
    if "__init__" in cls.__dict__ and not getattr(cls.__dict__["__init__"], "settings_group", None):
        cls.__init__ = checked_init(cls.__dict__["__init__"])  # type: ignore[misc]
    section = "\n".join("    " + line if line else "" for line in parameter_section(cls).splitlines())
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + section + "\n"
    return cls


# ----- a strategy class's settings group ------------------------------------------------------------------
# A class declares its algorithm's settings as one settings group (common/keys.py), `settings = SAMSettings`,
# instead of writing a constructor that re-declares and forwards its parent's parameters. `with_settings` (run
# for every subclass of RoundStrategy when it is defined) gives it a constructor: one keyword parameter per
# field the parents do not take already (the field's name, type and default), then the parent's; the values
# given are checked by the group's checks and kept as attributes of the same names. The group's fields that
# travel to the nodes are sent in every train message under their run-config keys (`settings_config`).


def settings_groups(cls: type) -> list[type]:
    """The settings groups `cls` and its bases declare (`settings`), the bases' first, each once."""
    groups: list[type] = []
    for klass in reversed(cls.__mro__):
        group = klass.__dict__.get("settings")
        if group is not None and group not in groups:
            groups.append(group)
    return groups


def settings_fields(cls: type) -> list[dataclasses.Field]:
    """Every field of `cls`'s settings groups (`settings_groups`), each name once."""
    fields: dict[str, dataclasses.Field] = {}
    for group in settings_groups(cls):
        for f in dataclasses.fields(group):
            fields.setdefault(f.name, f)
    return list(fields.values())


def settings_config(strategy: Any) -> dict[str, Any]:
    """The train message's config entries of `strategy`'s settings groups: each field that travels to the nodes
    (side NODE or BOTH) under its run-config key, with the strategy's value (`message_config`); a plugin's own
    group under its whole keys, "<name>.<key>" (common/run/own_settings.py `message_entries`)."""
    own = own_group(type(strategy))
    config: dict[str, Any] = {}
    for group in settings_groups(type(strategy)):
        config.update(message_entries(type(strategy), strategy) if group is own else message_config(group, strategy))
    return config


def checked_settings(owner: str, group: type, given: dict[str, Any]) -> Any:
    """The value of `group` with the fields `given` (the others at their defaults): each checked as a written
    constructor checks it (`check_given`), coerced to its default's type as the run config coerces its key, then
    checked by the group's checks (`check_group`, a plugin's own); ConfigError names `owner` and the key."""
    fields = {f.name: f for f in dataclasses.fields(group)}
    # a run-config key as the run config checks it, a parameter that is none (OledFL's `sam`, a `ServerTask`) by
    # its own check, worded as a written constructor's (`check_given`)
    check_given(owner, dict(given))
    try:
        typed = {name: coerce_value(key_name(name), value, fields[name].default)
                 if type(fields[name].default) in (bool, int, float, str) else value for name, value in given.items()}
        settings = group(**typed)
        check_group(settings)
    except ConfigError as err:
        raise ConfigError(f"{owner}: {err}") from None
    return settings


def with_settings(cls: type) -> None:
    """Give `cls`, which declares `settings = Group` (or only `parameter_defaults`) and no constructor of its own,
    its constructor: the group's fields as keyword parameters before the parent's, checked (`checked_settings`)
    and kept as attributes; then the parent's constructor, with the class's `parameter_defaults` (its paper's
    mean, ...) as the defaults of the parent's parameters they name, and the parent's `fixed_parameters` left at
    the parent's defaults (no parameters of the class: FedDDPM+ has no per-round correction); then the class's own `__post_init__()` if it
    has one (its server state's starting values, as a dataclass's `__post_init__`)."""
    group = cls.__dict__.get("settings")
    defaults: dict[str, Any] = dict(cls.__dict__.get("parameter_defaults", {}))
    fixed: tuple[str, ...] = tuple(cls.__dict__.get("fixed_parameters", ()))
    if (group is None and not defaults and not fixed) or "__init__" in cls.__dict__:
        return
    parent = super(cls, cls).__init__  # type: ignore[misc]
    inherited = {name: p for name, p in inspect.signature(parent).parameters.items() if name not in fixed}
    unknown = sorted((set(defaults) | set(fixed)) - set(inspect.signature(parent).parameters))
    if unknown:
        raise TypeError(f"{cls.__name__}: parameter_defaults or fixed_parameters name no parameter of its parent: "
                        f"{', '.join(unknown)}")
    own = [f for f in dataclasses.fields(group) if f.name not in inherited] if group is not None else []
    names = [f.name for f in own]
    valid = names + [name for name in inherited if name != "self"] + list(FLOWER_PARAMETERS)

    def __init__(self: Any, **kwargs: Any) -> None:
        owner = type(self).__name__
        refuse_unknown_parameters(owner, kwargs, valid, type(self))
        if group is not None:
            settings = checked_settings(owner, group, {name: kwargs.pop(name) for name in names if name in kwargs})
            for name in names:
                setattr(self, name, getattr(settings, name))
            refuse_overridden_settings(owner, settings, group, wired_settings(kwargs.get("wiring")))
        super(cls, self).__init__(**{**defaults, **kwargs})
        if "__post_init__" in cls.__dict__:  # the class's own server state, as a dataclass's `__post_init__`
            cls.__dict__["__post_init__"](self)

    parameters = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                  for f in own]
    parents = [p.replace(default=defaults[p.name]) if p.name in defaults else p for p in inherited.values()]
    __init__.__signature__ = inspect.signature(parent).replace(  # type: ignore[attr-defined]
        parameters=[parents[0], *parameters, *parents[1:]])
    __init__.__doc__ = f"{cls.__name__}'s parameters: its settings group's fields, then its parent's."
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.settings_group = group or type(None)  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def refuse_overridden_settings(owner: str, settings: Any, group: type, node_settings: Any) -> None:
    """Refuse a `node_settings` entry that would send the nodes, under a settings group's key, another value than
    the class's parameter of that name gives."""
    sent = message_config(group, settings)
    for key, value in (node_settings or {}).items() if isinstance(node_settings, dict) else ():
        if key in sent and sent[key] != value:
            name = key.replace("-", "_")
            raise ConfigError(f"{owner}: node_settings key {key!r} = {value!r} overrides what the strategy sends "
                              f"its nodes from its parameter {name} = {sent[key]!r}; set {name} instead")


def declared_parameters(cls: type) -> list[str]:
    """The keyword parameters `cls` declares, as fedsynth's app fills them from a run config
    (server_app/registry.py): the fields of each settings group a class of its lineage declares (`settings`),
    then those of the first constructor written out in it (FedAvg's, the relay's, or a class's own).

    TypeError names a class whose written constructor hides its parameters behind `*args`/`**kwargs` (the app
    could not fill them, and the class would silently keep its parent's defaults)."""
    names: list[str] = []
    fixed: set[str] = set()  # a class's `fixed_parameters` are none of its own, nor of its subclasses'
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        group = getattr(init, "settings_group", None)
        if group is not None:
            fixed |= set(klass.__dict__.get("fixed_parameters", ()))
            if dataclasses.is_dataclass(group):
                names += [f.name for f in dataclasses.fields(group) if f.name not in names and f.name not in fixed]
            continue
        parameters = list(inspect.signature(init).parameters.values())[1:]
        hidden = [p.name for p in parameters if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if hidden:
            raise TypeError(f"{klass.__name__}'s constructor takes *{hidden[0]}: declare its settings as a settings "
                            f"group (settings = ...) or name every parameter it takes")
        return names + [p.name for p in parameters if p.name not in names and p.name not in fixed]
    return names
