"""Every algorithm's strategy class by its class name, resolved from common/algorithm_table.py's rows.

Each row names its class by import path (`strategy`, "server_app.strategies.module:Class"); fedsynth's app
builds a run's strategy from this catalog (server_app/registry.py), and `fedsynth.strategies` exports the same
classes under the same names, so the class a Flower developer imports is the class a `fedsynth run` builds.
A new built-in class needs its row only: nothing here lists it.
"""

from __future__ import annotations

from common.algorithms.plugins import import_attribute
from common.algorithm_table import ALGORITHMS
from server_app.strategies.base import RoundStrategy

STRATEGY_CLASSES: dict[str, type[RoundStrategy]] = {
    algorithm.strategy_name: import_attribute(algorithm.strategy, f"the strategy class {algorithm.strategy!r}")
    for algorithm in ALGORITHMS.values()
}
