"""The keyword parameters of fedsynth's strategies: their defaults and meanings, defined once.

Every strategy class (server_app/strategies/, and the public names of `fedsynth.strategies`) is built from
typed keyword parameters only, as Flower's own strategies are. A parameter has the name of the run-config
key it mirrors (`sam_rho` <-> `sam-rho`), so fedsynth's app builds a strategy from a run config by reading
each of the class's parameters under its own name (server_app/registry.py `build_strategy`), and its default
is the run config's (`DEFAULTS`): a public class and `fedsynth run` start from the same numbers.

`documented` appends a class's "Parameters" section to its docstring, so `help(FedSynSAM)` lists every
parameter with its type, default and meaning. A parameter that is a run-config key means what the key means:
its text is the key's in the run config's part (common/data/settings.py, common/algorithms/*_settings.py, ...),
with the name it travels under when the nodes read it; the few others are described in `OWN_PARAMETER_DOCS`.
"""

from __future__ import annotations

import inspect
import textwrap

import dataclasses

from common.algorithm_table import ALGORITHMS
from common.run.client_settings import CODEC_KEYS
from common.run.config import RunConfig

DEFAULTS = RunConfig()  # the run config's defaults (docs/configuration.md): every strategy parameter's default

# run-config keys the nodes read from the train message's config (common/run/client_settings.py)
_SENT = set(CODEC_KEYS) | {key for algorithm in ALGORITHMS.values() for key in algorithm.client_keys}

# What each parameter that is not a run-config key means; a run-config key's meaning is its field's in the
# run config's parts (docs/configuration.md), defined once there.
OWN_PARAMETER_DOCS: dict[str, str] = {
    "fraction_evaluate": "Fraction of the nodes sent an evaluate message after each round. A round whose train replies\n"
                         "all carried `local-test-accuracy` (the received model's evaluation, as fedsynth's clients do)\n"
                         "sends none, and the carried numbers become the round's evaluate metrics.",
    "lr_schedule": "If given, each round's train config carries \"lr\" = lr_schedule(server_round); else `start()`'s\n"
                   "`train_config` decides.",
    "nodes": "A node table (node ids with partition ids and example counts, as fedsynth's handshake learns it);\n"
             "None numbers the grid's nodes in node-id order, and every round adds the nodes that joined since.",
    "weighted_by_key": "The reply metric that weighs each reply in the averages, as in Flower's strategies.",
    "node_settings": "Your own settings for the nodes, added to every train message's config (as FedProx sends\n"
                     "\"proximal-mu\"); fedsynth's app sends a rule's run-config keys here (\"proximal-mu\", \"moon-mu\", ...).",
    "parameter_names": "The names of the model's trainable arrays (`[n for n, _ in net.named_parameters()]`): what the\n"
                       "server step, the codec and control variates cover. None: judged from the arrays (floating arrays\n"
                       "not named like normalisation statistics).",
    "min_available_nodes": "Each round waits until the grid has at least this many nodes, as Flower's strategies do.",
    "task": "The model the server builds itself and the data's shape (common.run.task.ServerTask).",
    "sam": "False: OledFL-SGD; True: OledFL-SAM (the nodes read \"sam-rho\" from the config).",
}


def parameter_meaning(name: str) -> str:
    """What parameter `name` means: its run-config key's meaning (and the name the nodes read it under), or
    `OWN_PARAMETER_DOCS`'s text."""
    if name in OWN_PARAMETER_DOCS:
        return OWN_PARAMETER_DOCS[name]
    field = {f.name: f for f in dataclasses.fields(RunConfig)}[name]
    key = name.replace("_", "-")
    sent = f' Sent to the nodes as "{key}".' if key in _SENT else ""
    meaning = str(field.metadata["meaning"]).rstrip(".")
    return textwrap.fill(f"{meaning} (run-config key `{key}`).{sent}", width=100, break_on_hyphens=False)


def parameter_section(cls: type) -> str:
    """The "Parameters" section of `cls`'s docstring: each keyword parameter with its type, default and meaning."""
    lines = ["Parameters", "----------"]
    for parameter in inspect.signature(cls).parameters.values():
        default = parameter.default
        shown = getattr(default, "__name__", None) or repr(default)
        lines.append(f"{parameter.name} : {parameter.annotation} (default: {shown})")
        lines.extend("    " + line.strip() for line in parameter_meaning(parameter.name).splitlines())
    return "\n".join(lines)


def documented(cls: type) -> type:
    """Append the class's parameter section to its docstring, so that `help(cls)` lists every parameter."""
    section = "\n".join("    " + line if line else "" for line in parameter_section(cls).splitlines())
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + section + "\n"
    return cls
