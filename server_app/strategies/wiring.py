"""What the app around a strategy wires into it, as one value: `AppWiring`.

A strategy's parameters are the algorithm's and Flower's (the sampling, the aggregation, the codec, its rule's
settings). Four things are not the algorithm's but the app's: the node table its handshake learnt, the model's
trainable parameter names, the learning rate of each round, and its own settings for the nodes. fedsynth's app
builds them from its run (server_app/registry.py `strategy_arguments`); a Flower app passes the ones it has, e.g.
`FedAvg(wiring=AppWiring(node_settings={"my-setting": 1}))`. Each field is checked when the value is built
(server_app/strategies/parameters.py `OWN_PARAMETER_CHECKS`), with the message a parameter of that name had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from flwr.common.typing import Scalar

from server_app.strategies.node_table import NodeInfo
from server_app.strategies.parameters import check_given


@dataclass(frozen=True)
class AppWiring:
    """The app's wiring of a strategy (each None: not given).

    nodes : a node table (node ids with partition ids and example counts, as fedsynth's handshake learns it);
        None numbers the grid's nodes in node-id order, and every round adds the nodes that joined since.
    parameter_names : the names of the model's trainable arrays (`[n for n, _ in net.named_parameters()]`): what
        the server step, the codec and control variates cover; None: judged from the arrays (floating arrays not
        named like normalisation statistics). The centralized strategies' only: the relay forwards whole models.
    lr_schedule : each round's train config carries the learning rate lr_schedule(server_round); None: `start()`'s
        `train_config` decides.
    node_settings : your own settings for the nodes, added to every train message's config (as FedProx sends its
        weight mu); fedsynth's app sends FedCOG's settings here on a run with FedCOG (its generation budget, ...). An entry
        may not override a setting the strategy sends from its own parameters (the codec's, its rule's).
    """

    nodes: list[NodeInfo] | None = None
    parameter_names: list[str] | None = None
    lr_schedule: Callable[[int], float] | None = None
    node_settings: dict[str, Scalar] | None = None

    def __post_init__(self) -> None:
        check_given("AppWiring", {"nodes": self.nodes, "parameter_names": self.parameter_names,
                                  "lr_schedule": self.lr_schedule, "node_settings": self.node_settings})

    def sent_settings(self) -> dict[str, Scalar]:
        """A copy of `node_settings` ({} for None): what every train message's config carries of them."""
        return dict(self.node_settings or {})


NO_WIRING = AppWiring()  # a strategy built without `wiring`: the grid's nodes, names judged from the arrays
