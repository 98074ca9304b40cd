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
- fedsynth/strategies/: re-exports each algorithm's one strategy class (`strategy`), the class the app builds.

tests/test_algorithms.py checks that each half covers exactly this table's names, so adding an algorithm
means adding its row here, its class or function in each app, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's row.

    server : the name of its server rule: algorithms with the same one share their server's aggregation (a family).
    client_keys : the run-config keys its client rule reads from the train message's config, beside the
        uplink codec's (common/run/client_settings.py), under their run-config names (e.g. "sam-rho").
    decentralized : its ServerApp is the relay (server_app/strategies/relay.py), which sends each node its
        own message, and the nodes mix their neighbours' models.
    strategy : the name of its strategy class, which `fedsynth.strategies` exports and fedsynth's app builds
        (server_app/registry.py); the class sends `client_keys` (an `X+cog` row: its base's class and keys).
    """

    server: str
    client_keys: tuple[str, ...] = ()
    decentralized: bool = False
    strategy: str = ""


def _relay(*client_keys: str, strategy: str) -> Algorithm:
    return Algorithm("relay", client_keys, decentralized=True, strategy=strategy)


ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm("fedavg", strategy="FedAvg"),
    "fedavgm": Algorithm("fedavgm", strategy="FedAvgM"),
    "fedprox": Algorithm("fedavg", ("proximal-mu",), strategy="FedProx"),
    "scaffold": Algorithm("scaffold", strategy="Scaffold"),
    "moon": Algorithm("fedavg", ("moon-mu", "moon-tau"), strategy="MOON"),
    "fedsam": Algorithm("fedavg", ("sam-rho",), strategy="FedSAM"),
    "mofedsam": Algorithm("previous-update", ("sam-rho", "mofedsam-alpha"), strategy="MoFedSAM"),
    # decentralized FL (issue 6): the ServerApp only relays; the node rules differ
    "dpsgd": _relay(strategy="DPSGD"),
    "dfedavg": _relay(strategy="DFedAvg"),
    "dfedavgm": _relay("dfedavgm-momentum", strategy="DFedAvgM"),
    "dfedsam": _relay("sam-rho", strategy="DFedSAM"),
    "oledfl-sgd": _relay("ole-beta", strategy="OledFL"),
    "oledfl-sam": _relay("ole-beta", "sam-rho", strategy="OledFL"),
    # FedCOG (issue 4) is client-side only: X+cog keeps X's server rule and class ("fedcog" = "fedavg+cog");
    # the server sends FedCOG's settings beside X's (common/run/client_settings.py `client_keys`)
    "fedcog": Algorithm("fedavg", ("cog-start-round",), strategy="FedCOG"),
    "fedavg+cog": Algorithm("fedavg", strategy="FedAvg"),
    "fedavgm+cog": Algorithm("fedavgm", strategy="FedAvgM"),
    "fedprox+cog": Algorithm("fedavg", ("proximal-mu",), strategy="FedProx"),
    "scaffold+cog": Algorithm("scaffold", strategy="Scaffold"),
    "moon+cog": Algorithm("fedavg", ("moon-mu", "moon-tau"), strategy="MOON"),
    # FedSynSAM (issue 3): the SAM family and the baselines of the FedSynSAM paper
    "fedlesam": Algorithm("fedlesam", ("sam-rho",), strategy="FedLESAM"),
    "fedsynsam": Algorithm("fedsynsam", ("sam-rho", "synsam-beta", "synsam-mix"), strategy="FedSynSAM"),
    "dynafed": Algorithm("dynafed", strategy="DynaFed"),
    "fedgamma": Algorithm("scaffold", ("sam-rho",), strategy="FedGamma"),
    "fedlesam-s": Algorithm("fedlesam-s", ("sam-rho",), strategy="FedLESAMS"),
    "fedlesam-d": Algorithm("fedlesam-d", ("sam-rho", "dyn-alpha"), strategy="FedLESAMD"),
    "fedsmoo": Algorithm("fedsmoo", ("sam-rho", "dyn-alpha"), strategy="FedSMOO"),
    # FedDDPM (issue 5): diffusion models with server-side auxiliary correction
    "fedddpm": Algorithm("fedddpm", strategy="FedDDPM"),
    "fedddpm+": Algorithm("fedddpm+", strategy="FedDDPMPlus"),
}
