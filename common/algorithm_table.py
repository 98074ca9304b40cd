"""The algorithm table: every algorithm fedsynth runs, by name, with where its two halves live.

An algorithm has a server rule (a strategy class), a client rule (an update function taking a `LocalJob`
and returning a `LocalResult`) and the settings the server sends the client. `common` imports neither app,
so a row names each half by its import path, `"package.module:attribute"`, as the run config names a
user's model (`model = "package.module:factory"`) and Flower's pyproject names an app
(`serverapp = "package.module:app"`). Each app resolves the half it runs:

- server_app/registry.py: `SERVER_STRATEGIES` (algorithm -> class), resolved from `strategy`;
- client_app/registry.py: `CLIENT_UPDATES` (algorithm -> update function), resolved from `client`;
- common/run/client_settings.py: the run-config keys each train message's config carries (`client_keys`);
- fedsynth/strategies/: exports each row's class under its class name.

A user's algorithm is the same value outside fedsynth: `algorithm = "package.module:Name"` in the run
config names a module-level `Algorithm` (common/algorithms/plugins.py loads and checks it), so a built-in
row and a plugin are one representation, resolved by the same code (docs/architecture.md, "An algorithm").

Adding a built-in algorithm is three files: its row here, its strategy class module and its client rule
module. The `X+cog` rows are generated from the rows FedCOG plugs into (`cog_base`); what decides
behaviour by algorithm (decentralized, FedCOG, the diffusion task, MOON's projection head) is a field of the
row, not a name list.
tests/test_algorithms.py checks that each half resolves every row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.algorithms.cog_settings import COG_START_KEY
from common.algorithms.rule_settings import (
    DFedAvgMSettings, FedDynSAMSettings, FedProxSettings, MOONSettings, MoFedSAMSettings, OledFLSettings, SAMSettings,
)
from common.algorithms.synsam_settings import SynSAMRuleSettings
from common.keys import node_keys


# the means a row's `mean` may name: the papers' two plain means of the updates
PAPER_MEANS: tuple[str, ...] = ("weighted", "uniform")


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its two halves by import path, the settings its client reads and what it runs on.

    server : the name of its server rule: algorithms with the same one share their server's aggregation (a
        family); a plugin may leave it empty (its own family).
    client_keys : the run-config keys its client rule reads from the train message's config, beside the
        uplink codec's (common/run/client_settings.py), under their run-config names: a built-in row's are its
        rule's settings group's (`node_keys(SAMSettings)`), declared once in the group.
    decentralized : its ServerApp is the relay (server_app/strategies/relay.py), which sends each node its
        own message, and the nodes mix their neighbours' models.
    strategy : its strategy class, `"package.module:Class"`: the class `fedsynth.strategies` exports under
        that name and fedsynth's app builds (server_app/registry.py); it sends `client_keys`.
    client : its client rule, `"package.module:function"`, called with a `LocalJob` for each train message
        and returning a `LocalResult` (client_app/training.py; `fedsynth.algorithm` exports both).
    cog_base : FedCOG plugs into it: the table adds an `X+cog` row (same halves, with FedCOG) and
        `cog = true` runs that row.
    with_cog : its client rule runs with FedCOG's generation and distillation plugged in (client_app/fedcog.py).
    trains_ddpm : its rules need only a loss of a batch, so it trains a U-Net (the diffusion task) unchanged.
    ddpm_only : a diffusion algorithm: it needs a U-Net, and `model = "auto"` is FedDDPM's MNIST U-Net.
    projection_head : its client rule reads the model's `features` and a projection head (MOON's contrastive
        loss): the model is a built-in classifier built with `moon-projection-dim` projection outputs, and the
        node's previous model is kept for a resume.
    state_follows_update : its node keeps a state that changes with its update (SCAFFOLD's c_i, FedDyn's g_i):
        under bounded influence a node whose update was clipped is told the scale the server took, in its next
        message's config (`ACCEPTED_SCALE_KEYS` of common/run/client_settings.py, beside `client_keys`), and its
        strategy class's `notifies_accepted_scale` is True.
    mean : the server's mean of the updates its paper takes, "weighted" (by the clients' sample counts) or
        "uniform" (1/S over the S answering clients): what `aggregation = "auto"` (the run config's default) and
        its strategy class's `aggregation` default run (common/algorithms/paper_rules.py gives the source).
    """

    server: str = ""
    client_keys: tuple[str, ...] = ()
    decentralized: bool = False
    strategy: str = ""
    client: str = ""
    cog_base: bool = False
    with_cog: bool = False
    trains_ddpm: bool = False
    ddpm_only: bool = False
    projection_head: bool = False
    state_follows_update: bool = False
    mean: str = "weighted"

    @property
    def strategy_name(self) -> str:
        """The name of its strategy class (`fedsynth.strategies` exports it under this name)."""
        return self.strategy.rpartition(":")[2]


def _relay(*client_keys: str, strategy: str, client: str) -> Algorithm:
    return Algorithm("relay", client_keys, decentralized=True,
                     strategy=f"server_app.strategies.decentralized:{strategy}",
                     client=f"client_app.decentralized:{client}")


_S = "server_app.strategies."  # where the built-in strategy classes live
_FEDAVG_CLIENT = "client_app.updates:fedavg_update"

_ROWS: dict[str, Algorithm] = {
    "fedavg": Algorithm("fedavg", strategy=_S + "fedavg:FedAvg", client=_FEDAVG_CLIENT, cog_base=True,
                        trains_ddpm=True),
    "fedavgm": Algorithm("fedavgm", strategy=_S + "fedavgm:FedAvgM", client=_FEDAVG_CLIENT, cog_base=True,
                         trains_ddpm=True),
    "fedprox": Algorithm("fedavg", node_keys(FedProxSettings), strategy=_S + "node_rules:FedProx",
                         client="client_app.updates:fedprox_update", cog_base=True, trains_ddpm=True),
    "scaffold": Algorithm("scaffold", strategy=_S + "scaffold:Scaffold", client="client_app.updates:scaffold_update",
                          cog_base=True, trains_ddpm=True, state_follows_update=True),
    "moon": Algorithm("fedavg", node_keys(MOONSettings), strategy=_S + "node_rules:MOON",
                      client="client_app.updates:moon_update", cog_base=True, projection_head=True),
    "fedsam": Algorithm("fedavg", node_keys(SAMSettings), strategy=_S + "node_rules:FedSAM",
                        client="client_app.updates:fedsam_update", trains_ddpm=True),
    "mofedsam": Algorithm("previous-update", node_keys(MoFedSAMSettings), strategy=_S + "node_rules:MoFedSAM",
                          client="client_app.updates:mofedsam_update", trains_ddpm=True),
    # decentralized FL (issue 6): the ServerApp only relays; the node rules differ
    "dpsgd": _relay(strategy="DPSGD", client="dpsgd_update"),
    "dfedavg": _relay(strategy="DFedAvg", client="dfedavg_update"),
    "dfedavgm": _relay(*node_keys(DFedAvgMSettings), strategy="DFedAvgM", client="dfedavgm_update"),
    "dfedsam": _relay(*node_keys(SAMSettings), strategy="DFedSAM", client="dfedsam_update"),
    "oledfl-sgd": _relay(*node_keys(OledFLSettings), strategy="OledFL", client="oledfl_sgd_update"),
    "oledfl-sam": _relay(*node_keys(OledFLSettings), *node_keys(SAMSettings), strategy="OledFL", client="oledfl_sam_update"),
    # FedCOG (issue 4) is client-side only: "fedcog" = "fedavg+cog" with its own class (it sends the start round);
    # the X+cog rows are generated below from the rows marked cog_base; the server sends FedCOG's settings beside
    # X's (common/run/client_settings.py `client_keys`)
    "fedcog": Algorithm("fedavg", (COG_START_KEY,), strategy=_S + "node_rules:FedCOG", client=_FEDAVG_CLIENT,
                        with_cog=True),
    # FedSynSAM (issue 3): the SAM family and the baselines of the FedSynSAM paper
    "fedlesam": Algorithm("fedlesam", node_keys(SAMSettings), strategy=_S + "sam_baselines:FedLESAM",
                          client="client_app.sam_family:fedlesam_update"),
    "fedsynsam": Algorithm("fedsynsam", node_keys(SynSAMRuleSettings), strategy=_S + "fedsynsam:FedSynSAM",
                           client="client_app.sam_family:fedsynsam_update", mean="uniform"),
    "dynafed": Algorithm("dynafed", strategy=_S + "dynafed:DynaFed", client=_FEDAVG_CLIENT),
    "fedgamma": Algorithm("scaffold", node_keys(SAMSettings), strategy=_S + "node_rules:FedGamma",
                          client="client_app.sam_family:fedgamma_update", state_follows_update=True),
    "fedlesam-s": Algorithm("fedlesam-s", node_keys(SAMSettings), strategy=_S + "sam_baselines:FedLESAMS",
                            client="client_app.sam_family:fedlesam_s_update", state_follows_update=True),
    "fedlesam-d": Algorithm("fedlesam-d", node_keys(FedDynSAMSettings), strategy=_S + "sam_baselines:FedLESAMD",
                            client="client_app.sam_family:fedlesam_d_update", state_follows_update=True),
    "fedsmoo": Algorithm("fedsmoo", node_keys(FedDynSAMSettings), strategy=_S + "sam_baselines:FedSMOO",
                         client="client_app.sam_family:fedsmoo_update", state_follows_update=True),
    # FedDDPM (issue 5): diffusion models with server-side auxiliary correction; the clients run FedAvg's rule
    # on the DDPM loss (the warmup is client_app/diffusion.py's)
    "fedddpm": Algorithm("fedddpm", strategy=_S + "fedddpm:FedDDPM", client=_FEDAVG_CLIENT, trains_ddpm=True,
                         ddpm_only=True, mean="uniform"),
    "fedddpm+": Algorithm("fedddpm+", strategy=_S + "fedddpm_plus:FedDDPMPlus", client=_FEDAVG_CLIENT,
                          trains_ddpm=True, ddpm_only=True, mean="uniform"),
}


def with_cog_rows(rows: dict[str, Algorithm]) -> dict[str, Algorithm]:
    """`rows` and, after each row FedCOG plugs into, its `X+cog` row: X's halves and keys, with FedCOG.

    FedCOG needs a classifier's logits, so an `X+cog` row does not train a U-Net.
    """
    table: dict[str, Algorithm] = dict(rows)
    for name, row in rows.items():
        if row.cog_base:
            table[f"{name}+cog"] = replace(row, cog_base=False, with_cog=True, trains_ddpm=False)
    return table


ALGORITHMS: dict[str, Algorithm] = with_cog_rows(_ROWS)

# the rows FedCOG plugs into (`cog = true` runs X+cog)
COG_BASES: tuple[str, ...] = tuple(name for name, row in ALGORITHMS.items() if row.cog_base)
