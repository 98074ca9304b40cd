"""Declared server state: the attributes a strategy class names in `server_state`, checkpointed with no code of its own.

A strategy keeps state across rounds that is not the global model (FedAdam's moments m and v, a server momentum).
A class declares which of its attributes those are,

    class FedAdam(FedAvg):
        server_state = ("m", "v")   # each a dict[str, np.ndarray], or None before the first round sets it

and `state_dict()` / `load_state_dict()` (server_app/strategies/base.py) carry them through this module: each
attribute that holds arrays becomes one array group of the strategy's state, `server-state.<name>`, saved bitwise
(names, dtypes, shapes, bytes) in fedsynth's checkpoint (server_app/checkpoint.py: its checksum covers the
groups, and a resume is refused when the run config differs), and the names that were None are listed in the
state's meta. Restoring gives every declared attribute back: its arrays (copies, C-contiguous, in their dtype and
shape), or None.

Why names and not hooks: an override of the array hooks has to list each group twice (save and load) and keep
both in step; a class that forgets the load half resumes with fresh moments and no error. A declaration has one
place, and a checkpoint that does not hold exactly the declared names is refused naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# the array group a declared attribute is saved under: `server-state.<attribute>` (no '/': checkpoint.py's rule)
GROUP_PREFIX = "server-state."
# the state meta's entry: {"declared": [every declared name], "unset": [the names that held None]}
META_KEY = "server-state"


def declared_names(strategy: object) -> tuple[str, ...]:
    """The class's `server_state`, checked: a tuple of attribute names (identifiers). TypeError names the class."""
    names = getattr(type(strategy), "server_state", ())
    owner = type(strategy).__name__
    if not isinstance(names, tuple) or not all(isinstance(name, str) and name.isidentifier() for name in names):
        raise TypeError(f"{owner}.server_state must be a tuple of attribute names (e.g. ('m', 'v')), not {names!r}")
    if len(set(names)) != len(names):
        raise TypeError(f"{owner}.server_state names an attribute twice: {names!r}")
    return names


def _arrays_of(owner: str, name: str, value: Any) -> dict[str, np.ndarray]:
    """A declared attribute's value as the arrays a checkpoint stores; TypeError names the attribute otherwise."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                                 for k, v in value.items()):
        raise TypeError(f"{owner}.{name} is declared in server_state, so it must hold a dict[str, np.ndarray] or "
                        f"None, not {type(value).__name__}")
    return {key: np.require(array, requirements="C") for key, array in value.items()}


def declared_groups(strategy: object) -> dict[str, dict[str, np.ndarray]]:
    """{`server-state.<name>`: its arrays} for each declared attribute that holds arrays (None is left out)."""
    owner = type(strategy).__name__
    groups = {}
    for name in declared_names(strategy):
        value = getattr(strategy, name, None)
        if value is not None:
            groups[GROUP_PREFIX + name] = _arrays_of(owner, name, value)
    return groups


def declared_meta(strategy: object) -> dict[str, Any]:
    """The state meta's entry for the declared attributes ({} when the class declares none)."""
    names = declared_names(strategy)
    if not names:
        return {}
    return {META_KEY: {"declared": list(names), "unset": [n for n in names if getattr(strategy, n, None) is None]}}


def with_declared_state(strategy: object, arrays: dict[str, Any], meta: dict[str, Any]) -> tuple[dict, dict]:
    """`arrays` and `meta` of the strategy's own hooks, with its declared attributes added (`state_dict`).

    ValueError when a hook already uses a declared group's name or the meta's entry (the two would overwrite
    each other in the checkpoint)."""
    groups, entry = declared_groups(strategy), declared_meta(strategy)
    clash = sorted(groups.keys() & arrays.keys()) + sorted(entry.keys() & meta.keys())
    if clash:
        raise ValueError(f"{type(strategy).__name__}'s state already has {clash}: the names its server_state uses")
    return {**arrays, **groups}, {**meta, **entry}


def restore_declared_state(strategy: object, arrays: Mapping[str, Any],
                           meta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Set each declared attribute from a state `with_declared_state` made; returns the rest (the hooks' part).

    ValueError names the class and the difference when the state does not hold exactly the declared names (a
    checkpoint of another version of the class, or of a class without them): resuming would silently restart
    the state the class declares.
    """
    names = declared_names(strategy)
    owner = type(strategy).__name__
    rest_arrays = {k: v for k, v in arrays.items() if not k.startswith(GROUP_PREFIX)}
    rest_meta = {k: v for k, v in meta.items() if k != META_KEY}
    entry = meta.get(META_KEY, {"declared": [], "unset": []})
    saved = list(entry.get("declared", [])) if isinstance(entry, Mapping) else None
    unset = list(entry.get("unset", [])) if isinstance(entry, Mapping) else None
    stored = sorted(k[len(GROUP_PREFIX):] for k in arrays if k.startswith(GROUP_PREFIX))
    if saved is None or unset is None or sorted(saved) != sorted(names) or sorted(stored + unset) != sorted(names):
        held = sorted(stored + (unset or []))
        raise ValueError(f"the state given to {owner}.load_state_dict holds server state {held} but "
                         f"{owner}.server_state declares {sorted(names)}: it was saved by another strategy class or "
                         "another version of this one")
    for name in names:
        group = arrays.get(GROUP_PREFIX + name)
        setattr(strategy, name, None if group is None else {k: np.array(v, copy=True, order="C")
                                                            for k, v in group.items()})
    return rest_arrays, rest_meta
