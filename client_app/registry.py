"""Client-side registry: algorithm name -> the update function fedsynth's ClientApp runs for a train message.

The client's half of common/algorithm_table.py's table: each row names its client rule by import path
(`client`), resolved here; a row with `with_cog` runs that rule with FedCOG plugged in (client_app/fedcog.py),
which is how the generated `X+cog` rows get their rule. A user's algorithm, `algorithm =
"package.module:Name"` (common/algorithms/plugins.py), is resolved by the same `update_of` when a train
message names it, so its rule runs through the same `LocalJob` and reply as fedsynth's own rules.
"""

from __future__ import annotations

from client_app.fedcog import ClientUpdate, client_algorithm, with_cog
from common.algorithms.plugins import algorithm_of, import_attribute
from common.algorithm_table import ALGORITHMS, Algorithm
from common.run.config import RunConfig


def update_of(algorithm: Algorithm) -> ClientUpdate:
    """The update function of a row: its `client` imported, with FedCOG plugged in where the row says so."""
    update = import_attribute(algorithm.client, f"the client rule {algorithm.client!r}")
    return with_cog(update) if algorithm.with_cog else update


# algorithm -> its client update function, for every row of the table
CLIENT_UPDATES: dict[str, ClientUpdate] = {name: update_of(row) for name, row in ALGORITHMS.items()}


def client_update(cfg: RunConfig) -> ClientUpdate:
    """The update function of the run's algorithm (`cog = true` runs X+cog), a plugin's included."""
    name = client_algorithm(cfg)
    return CLIENT_UPDATES[name] if name in CLIENT_UPDATES else update_of(algorithm_of(name))
