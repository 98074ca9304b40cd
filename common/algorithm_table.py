"""The algorithm table: every algorithm fedsynth runs, by name, with what its server and client halves share.

An algorithm has a server rule (a strategy class in server_app/), a client rule (an update function in
client_app/) and the settings the server sends the client. `common` imports neither app, so the table is
defined here once by name, and each app maps the names to its own half:

- server_app/registry.py: server-rule name -> strategy class; `SERVER_STRATEGIES` (algorithm -> class) is
  read off this table;
- client_app/updates.py: `CLIENT_UPDATES` (algorithm -> update function), the decentralized rules from
  client_app/decentralized.py's `DECENTRALIZED_UPDATES`;
- common/run/client_settings.py: the run-config keys each train message's config carries (`client_keys`);
- common/algorithms/gossip.py: `DECENTRALIZED_ALGORITHMS`, the relay's algorithms;
- fedsynth/strategies/: the public class of each algorithm a Flower developer can use (`public_class`).

tests/test_algorithms.py checks that each half covers exactly this table's names, so adding an algorithm
means adding its row here, its class or function in each app, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's row.

    server : the name of its server rule (server_app/registry.py's `SERVER_RULES`).
    client_keys : the run-config keys its client rule reads from the train message's config, beside the
        uplink codec's (common/run/client_settings.py), under their run-config names (e.g. "sam-rho").
    decentralized : its ServerApp is the relay (server_app/strategies/relay.py), which sends each node its
        own message, and the nodes mix their neighbours' models.
    public_class : the class of `fedsynth.strategies` that runs it ("" when none).
    """

    server: str
    client_keys: tuple[str, ...] = ()
    decentralized: bool = False
    public_class: str = ""


def _relay(*client_keys: str, public_class: str = "") -> Algorithm:
    return Algorithm("relay", client_keys, decentralized=True, public_class=public_class)


ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm("fedavg", public_class="FedAvg"),
    "fedavgm": Algorithm("fedavgm", public_class="FedAvgM"),
    "fedprox": Algorithm("fedavg", ("proximal-mu",)),
    "scaffold": Algorithm("scaffold", public_class="Scaffold"),
    "moon": Algorithm("fedavg", ("moon-mu", "moon-tau")),
    "fedsam": Algorithm("fedavg", ("sam-rho",), public_class="FedSAM"),
    "mofedsam": Algorithm("previous-update", ("sam-rho", "mofedsam-alpha"), public_class="MoFedSAM"),
    # decentralized FL (issue 6): the ServerApp only relays; the node rules differ
    "dpsgd": _relay(),
    "dfedavg": _relay(public_class="DFedAvg"),
    "dfedavgm": _relay(),
    "dfedsam": _relay("sam-rho"),
    "oledfl-sgd": _relay("ole-beta", public_class="OledFL"),
    "oledfl-sam": _relay("ole-beta", "sam-rho", public_class="OledFL"),
    # FedCOG (issue 4) is client-side only: X+cog keeps X's server rule ("fedcog" = "fedavg+cog")
    "fedcog": Algorithm("fedavg", ("cog-start-round",), public_class="FedCOG"),
    "fedavg+cog": Algorithm("fedavg"),
    "fedavgm+cog": Algorithm("fedavgm"),
    "fedprox+cog": Algorithm("fedavg"),
    "scaffold+cog": Algorithm("scaffold"),
    "moon+cog": Algorithm("fedavg"),
    # FedSynSAM (issue 3): the SAM family and the baselines of the FedSynSAM paper
    "fedlesam": Algorithm("fedlesam", ("sam-rho",), public_class="FedLESAM"),
    "fedsynsam": Algorithm("fedsynsam", ("sam-rho", "synsam-beta", "synsam-mix"), public_class="FedSynSAM"),
    "dynafed": Algorithm("dynafed", public_class="DynaFed"),
    "fedgamma": Algorithm("scaffold", ("sam-rho",)),
    "fedlesam-s": Algorithm("fedlesam-s", ("sam-rho",)),
    "fedlesam-d": Algorithm("fedlesam-d", ("sam-rho", "dyn-alpha"), public_class="FedLESAMD"),
    "fedsmoo": Algorithm("fedsmoo", ("sam-rho", "dyn-alpha"), public_class="FedSMOO"),
    # FedDDPM (issue 5): diffusion models with server-side auxiliary correction
    "fedddpm": Algorithm("fedddpm", public_class="FedDDPM"),
    "fedddpm+": Algorithm("fedddpm+", public_class="FedDDPMPlus"),
}
