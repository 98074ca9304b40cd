"""A user's algorithm as a plugin: `algorithm = "package.module:Name"` in the run config.

The contract is the algorithm table's row (common/algorithm_table.py), nothing more: `Name` is a
module-level `fedsynth.algorithm.Algorithm` that names its two halves by import path,

    FEDNOVA = Algorithm(strategy="fednova.server:FedNova", client="fednova.client:fednova_update")

- `strategy`: a subclass of one of `fedsynth.strategies`' classes (fedsynth's app builds it from the run
  config as it builds its own: each constructor parameter from the run-config key of the same name, the
  others at their defaults; server_app/registry.py), which sends its client what it needs in the train
  config and aggregates the replies;
- `client`: a function `update(job: LocalJob) -> LocalResult` that trains `job.model` in place for one
  round; fedsynth's ClientApp builds the reply from it as for its own rules (the model, or with an uplink
  codec the encoded update; `LocalResult.metrics` and `.outgoing` ride along);
- optionally `client_keys` (existing run-config keys its client reads), its paper's rule (`rule=PaperRule(...)`,
  as a built-in row declares it: checked by `check_paper_rule`, its `keys` real run-config keys) and the row's
  other flags.

Why import paths and not the objects: it is how the run config already names a user's model
(`model = "package.module:factory"`) and how Flower's pyproject names its apps; a row stays plain data that
`common` can hold without importing either app, and a built-in row and a plugin are resolved by the same
code. The module must be importable on the server and on every SuperNode, as a model's package must
(docs/own-data.md: inside the Flower app directory that `flwr run` ships, or installed on every host), and
permitted there (common/imports.py: a package outside the app is on each site's list, or it is refused before
it is imported).

Both halves are imported and checked whenever the run config is parsed (`parse_run_config`, on the server
and on each node, before any work), so a missing module, a missing attribute or a value of the wrong type
stops the run with a ConfigError naming the path and what is wrong; so does a strategy whose constructor
forwards `**kwargs` (`refuse_forwarding`: the app could not fill what it forwards).
"""

from __future__ import annotations

import difflib
import inspect

from collections.abc import Collection

from common.algorithm_table import ALGORITHMS, PAPER_MEANS, Algorithm, PaperRule
from common.errors import ConfigError
from common.imports import import_attribute  # noqa: F401 - re-exported for the client registry
from common.keys import check_choice, node_keys

# how the error messages and the docs write a plugin's name
PLUGIN_FORM = "package.module:Name"


def is_plugin(name: str) -> bool:
    """Whether an algorithm name is a user's plugin, `package.module:Name` (a built-in name has no colon)."""
    return ":" in name


def rule_keys(algorithm: Algorithm) -> tuple[str, ...]:
    """The run-config keys `algorithm`'s client rule reads from its train message, beside the codec's: the NODE/BOTH
    fields of its settings group (its `settings`, `"package.module:Group"`, imported here) and its `client_keys`."""
    group = import_attribute(algorithm.settings, "an algorithm's settings group") if algorithm.settings else None
    return tuple(dict.fromkeys(node_keys(group) + tuple(algorithm.client_keys)))


def plugin_algorithm(path: str) -> Algorithm:
    """The `Algorithm` a plugin path names, with both halves imported and checked; ConfigError says what is wrong."""
    what = f"run config key 'algorithm' = {path!r}"
    algorithm = import_attribute(path, what)
    if not isinstance(algorithm, Algorithm):
        raise ConfigError(f"{what}: {path.partition(':')[2]!r} is a {type(algorithm).__name__}, not a "
                          "fedsynth.algorithm.Algorithm(strategy=\"package.module:Class\", "
                          "client=\"package.module:function\")")
    for field in ("strategy", "client"):
        if not isinstance(getattr(algorithm, field), str) or not getattr(algorithm, field):
            raise ConfigError(f"{what}: its {field} must be an import path \"package.module:attribute\", "
                              f"not {getattr(algorithm, field)!r}")
    if algorithm.cog_base:
        raise ConfigError(f"{what}: cog_base is for fedsynth's own rows (the table generates their X+cog rows); "
                          "a plugin that runs FedCOG's client plug-in sets with_cog = True")
    if algorithm.mean not in PAPER_MEANS:
        raise ConfigError(f"{what}: its mean must be one of {', '.join(PAPER_MEANS)} (the server's mean by "
                          f"default), not {algorithm.mean!r}")
    if not isinstance(algorithm.settings, str):
        raise ConfigError(f"{what}: its settings must be a settings group's import path \"package.module:Group\" "
                          f"or empty, not {algorithm.settings!r}")
    if not all(isinstance(key, str) for key in algorithm.client_keys):
        raise ConfigError(f"{what}: client_keys must be run-config key names, not {algorithm.client_keys!r}")
    check_halves(algorithm, what)
    return algorithm


def check_paper_rule(algorithm: Algorithm, what: str, run_config_keys: Collection[str]) -> None:
    """Refuse a plugin's paper rule (`Algorithm.rule`) that a built-in row's could not be: not a `PaperRule`, a
    server step or source that is no text or empty, or a key of `keys` that is none of `run_config_keys` (the run
    config's keys, passed in by the run config, which imports this module). The keys are the shared settings whose
    default its paper fixes too (`server-lr`, ...): its own settings' keys ("<name>.<key>") are its paper's
    hyper-parameters already, and say so here. None (no rule) is fine."""
    rule = algorithm.rule
    if rule is None:
        return
    if not isinstance(rule, PaperRule):
        raise ConfigError(f"{what}: its rule must be a fedsynth.algorithm.PaperRule(server_step=..., mean_source=..., "
                          f"source=...) or None, not {rule!r}")
    for field in ("server_step", "mean_source", "source", "regime"):
        value = getattr(rule, field)
        if not isinstance(value, str) or (field in ("server_step", "source") and not value.strip()):
            raise ConfigError(f"{what}: its rule's {field} must be {'non-empty ' if field != 'regime' else ''}text "
                              f"(what its paper states), not {value!r}")
    if isinstance(rule.keys, str) or not all(isinstance(key, str) for key in rule.keys):
        raise ConfigError(f"{what}: its rule's keys must be a tuple of run-config key names, not {rule.keys!r}")
    for key in rule.keys:
        if key in run_config_keys:
            continue
        if "." in key:
            raise ConfigError(f"{what}: its rule's key {key!r} is a key of its own settings, which are its paper's "
                              "hyper-parameters already; the rule's keys are the shared run-config keys whose "
                              "default its paper fixes too (e.g. 'server-lr')")
        close = difflib.get_close_matches(key, list(run_config_keys), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{what}: its rule's key {key!r} is no run-config key{hint}; the rule's keys are the shared "
                          "run-config keys whose default its paper fixes too (docs/configuration.md)")


def check_halves(algorithm: Algorithm, what: str) -> None:
    """Import both halves of `algorithm`: a Flower strategy class and a client function taking one argument."""
    from flwr.serverapp.strategy import Strategy

    strategy = import_attribute(algorithm.strategy, f"{what}: its strategy")
    if not (inspect.isclass(strategy) and issubclass(strategy, Strategy)):
        raise ConfigError(f"{what}: its strategy {algorithm.strategy!r} is not a strategy class (a subclass of one "
                          "of fedsynth.strategies' classes)")
    refuse_forwarding(strategy, f"{what}: its strategy {algorithm.strategy!r}")
    client = import_attribute(algorithm.client, f"{what}: its client")
    if not callable(client) or inspect.isclass(client):
        raise ConfigError(f"{what}: its client {algorithm.client!r} is not a function (update(job: LocalJob) -> "
                          "LocalResult)")
    try:
        inspect.signature(client).bind(None)
    except TypeError:
        raise ConfigError(f"{what}: its client {algorithm.client!r} must take one argument, the LocalJob") from None
    except ValueError:  # no signature to read (a builtin): left to the call
        pass


def refuse_forwarding(cls: type, what: str) -> None:
    """Refuse a strategy class whose constructor takes `**kwargs` (or `*args`), naming the class.

    fedsynth's app builds a strategy from the parameters its constructor names (each from the run-config key of
    its name, server_app/registry.py), so whatever such a constructor forwards to its parent would silently keep
    the parent's defaults: the run would ignore the run config's keys for them.
    """
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no signature to read: left to the call
        return
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            star = "**" if parameter.kind is parameter.VAR_KEYWORD else "*"
            raise ConfigError(
                f"{what}: {cls.__name__}'s constructor takes {star}{parameter.name}; fedsynth's app builds a strategy "
                "from the keyword parameters its constructor names (each from the run-config key of its name), so "
                f"what {cls.__name__} forwards through {star}{parameter.name} would keep its parent's defaults and "
                "ignore the run config: name every parameter it takes (def __init__(self, *, fraction_train: float "
                "= ..., ...)) and pass each to super().__init__")


def algorithm_of(name: str) -> Algorithm:
    """The row of the algorithm `name`: the table's, or a plugin's (loaded and checked); ConfigError otherwise."""
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    if is_plugin(name):
        return plugin_algorithm(name)
    check_choice("algorithm", name, [*ALGORITHMS, PLUGIN_FORM])
    raise AssertionError("unreachable: check_choice refused the name")


def known_algorithm(name: str) -> Algorithm | None:
    """The row of `name` when it names one (the table's, or a plugin's, loaded and checked), else None (a
    `ServerTask` that names no algorithm; a name `parse_run_config` refuses)."""
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    return plugin_algorithm(name) if is_plugin(name) else None


def algorithm_label(name: str) -> str:
    """How a run's folder name writes its algorithm: a built-in's name, a plugin's attribute in lower case."""
    return name.rpartition(":")[2].lower() if is_plugin(name) else name
