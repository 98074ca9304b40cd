"""The algorithm table: every algorithm fedsynth runs, by name, with where its two halves live.

An algorithm has a server rule (a strategy class), a client rule (an update function taking a `LocalJob`
and returning a `LocalResult`) and the settings the server sends the client. `common` imports neither app,
so a row names each half by its import path, `"package.module:attribute"`, as the run config names a
user's model (`model = "package.module:factory"`) and Flower's pyproject names an app
(`serverapp = "package.module:app"`). Each app resolves the half it runs:

- server_app/registry.py: `SERVER_STRATEGIES` (algorithm -> class), resolved from `strategy`;
- client_app/registry.py: `CLIENT_UPDATES` (algorithm -> update function), resolved from `client`;
- common/algorithms/plugins.py `rule_keys`: the keys its client rule reads, its settings group's (`settings`, a
  group named by import path too: the groups live on a higher floor of common/ than this base module) and
  `client_keys`; common/run/client_settings.py: the run-config keys each train message's config carries;
- fedsynth/strategies/: exports each row's class under its class name.

A user's algorithm is the same value outside fedsynth: `algorithm = "package.module:Name"` in the run
config names a module-level `Algorithm` (common/algorithms/plugins.py loads and checks it), so a built-in
row and a plugin are one representation, resolved by the same code (docs/architecture.md, "An algorithm").

Adding a built-in algorithm is three files: its row here (with its paper's rule, `PaperRule`), its strategy
class module and its client rule module. The `X+cog` rows are generated from the rows FedCOG plugs into
(`cog_base`); what decides behaviour by algorithm (decentralized, FedCOG, the diffusion task, MOON's
projection head) is a field of the row, not a name list; the docs' lists of the algorithms and the paper-rule
table are generated from the rows (`python -m fedsynth.algorithm_docs --write`).
tests/test_algorithms.py checks that each half resolves every row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


# the means a row's `mean` may name: the papers' two plain means of the updates
PAPER_MEANS: tuple[str, ...] = ("weighted", "uniform")


@dataclass(frozen=True)
class PaperRule:
    """An algorithm's rule as its paper states it, beside what its settings declare (SPEC 7: every default is its
    paper's). docs/algorithms.md's paper-rule table is generated from the rows' rules (`python -m
    fedsynth.algorithm_docs --write`), and tests/test_paper_rule_defaults.py checks the code against them.

    server_step : what the server does with the mean of the updates, in words.
    mean_source : where the paper fixes its mean (the row's `mean`), or which reference the default follows.
    source : where its hyper-parameters' defaults come from (equation, table, section, reference file).
    keys : the run-config keys of shared settings whose default its paper fixes too (`server-lr`, `peers`, the
        trajectory's), beside its own settings group's, which are all its hyper-parameters (`rule_keys` of
        common/algorithms/plugins.py). Their values are the keys' declared defaults (`common.keys.key`), never
        written here.
    regime : where the paper's training recipe (lr, momentum, local steps, batch) differs from the shared defaults,
        which are not a rule of the algorithm (its study files set the paper's); "" when it does not.
    """

    server_step: str
    mean_source: str
    source: str
    keys: tuple[str, ...] = ()
    regime: str = ""


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its two halves by import path, the settings its client reads and what it runs on.

    server : the name of its server rule: algorithms with the same one share their server's aggregation (a
        family); a plugin may leave it empty (its own family).
    client_keys : run-config keys its client rule reads from the train message's config beside its settings
        group's (`settings`) and the uplink codec's (common/run/client_settings.py), under their run-config names.
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
        its strategy class's `aggregation` default run (`rule` gives the source).
    page : the page of docs/ that documents it; the docs' algorithm tables (README.md, docs/algorithms.md) group
        the rows by page, one family each (generated: `python -m fedsynth.algorithm_docs --write`).
    settings : its client rule's settings group, `"package.module:Group"` (common/keys.py): the group's
        NODE/BOTH fields are keys it reads from the message (`rule_keys` of common/algorithms/plugins.py resolves
        them; named by path, as the halves are, because the groups live on a higher floor of common/).
    rule : its paper's rule (`PaperRule`); every built-in row has one, and an `X+cog` row runs X's.
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
    page: str = "algorithms.md"
    settings: str = ""
    rule: PaperRule | None = None

    @property
    def strategy_name(self) -> str:
        """The name of its strategy class (`fedsynth.strategies` exports it under this name)."""
        return self.strategy.rpartition(":")[2]


# the rules' shared wording
_FEDAVG_STEP = "w + server-lr x mean of the updates"
_SAMPLE_WEIGHTS = "McMahan et al., 2017, Algorithm 1 (n_k / n), as FedCOG's reference code aggregates its baselines"
_SCAFFOLD_STEP = "FedAvg's step; c += (1/N) sum over the answering clients of (c_i+ - c_i)"
_SYNSAM_BASELINE = ("as the FedSynSAM paper runs its baselines (Sec. V: global lr 1; rho tuned on "
                    "{0.001, 0.01, 0.05, 0.1, 0.5})")
_SYNSAM_REGIME = "FedSynSAM paper: K = 10 local iterations of batch 128, lr tuned on {0.01, 0.05, 0.1, 0.5}"
_OLEDFL_REGIME = ("OledFL paper: lr 0.1 x 0.998^t, weight decay 5e-4, batch 128, K = 5 local epochs, SAM rho 0.1, "
                  "beta 0.99 (CIFAR-10) / 0.8 (CIFAR-100)")
_DDPM_REGIME = ("FedDDPM paper: Adam zeta = 2e-4, batch 128 (MNIST), N = 100, p in {0.15, 0.3} (its study files set "
                "them)")


def _relay(settings: str = "", *, strategy: str, client: str, step: str, source: str) -> Algorithm:
    """A decentralized row: the relay and a node rule; its paper's rule mixes the neighbours' models (k = `peers`)."""
    return Algorithm("relay", decentralized=True, page="oledfl.md", settings=settings,
                     strategy=f"server_app.strategies.decentralized:{strategy}",
                     client=f"client_app.decentralized:{client}",
                     rule=PaperRule("relay: no server mean: each node mixes its neighbours' models (the mixing "
                                    "matrix W); " + step, "-", source, ("peers",), _OLEDFL_REGIME))


_S = "server_app.strategies."  # where the built-in strategy classes live
_G = "common.algorithms.rule_settings:"  # where the node rules' settings groups live
_FEDAVG_CLIENT = "client_app.updates:fedavg_update"
_SYNSAM = "fedsynsam.md"  # the page of FedSynSAM and the SAM family

_ROWS: dict[str, Algorithm] = {
    "fedavg": Algorithm("fedavg", strategy=_S + "fedavg:FedAvg", client=_FEDAVG_CLIENT, cog_base=True,
                        trains_ddpm=True,
                        rule=PaperRule(_FEDAVG_STEP, "McMahan et al., 2017, Algorithm 1 (n_k / n)",
                                       "McMahan et al., 2017, Algorithm 1; FedDDPM's baselines average 1/n (set "
                                       "aggregation)", ("server-lr",))),
    "fedavgm": Algorithm("fedavgm", strategy=_S + "fedavgm:FedAvgM", client=_FEDAVG_CLIENT, cog_base=True,
                         trains_ddpm=True,
                         rule=PaperRule("v <- server-momentum x v + mean of the updates; w + server-lr x v",
                                        _SAMPLE_WEIGHTS, "Hsu et al., 2019 (beta swept; 0.9 as SPEC 4.1)",
                                        ("server-momentum",),
                                        "FedCOG's baselines use server momentum 0.1 (FedCOG paper, A.2)")),
    "fedprox": Algorithm("fedavg", settings=_G + "FedProxSettings", strategy=_S + "node_rules:FedProx",
                         client="client_app.updates:fedprox_update", cog_base=True, trains_ddpm=True,
                         rule=PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS, "Li et al., 2020 (mu tuned); 0.01 as FedCOG's "
                                        "baselines (FedCOG paper, A.2)")),
    "scaffold": Algorithm("scaffold", strategy=_S + "scaffold:Scaffold", client="client_app.updates:scaffold_update",
                          cog_base=True, trains_ddpm=True, state_follows_update=True,
                          rule=PaperRule(_SCAFFOLD_STEP, "the paper's Algorithm 1 averages 1/|S|; the default "
                                         "follows FedCOG's reference code (rui-ye/FedCOG scaffold.py: sample-size "
                                         "weights, c by 1/N), as for the other baselines",
                                         "Karimireddy et al., 2020, Algorithm 1 (option II control variates)")),
    "moon": Algorithm("fedavg", settings=_G + "MOONSettings", strategy=_S + "node_rules:MOON",
                      client="client_app.updates:moon_update", cog_base=True, projection_head=True,
                      rule=PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS, "Li, He & Song, 2021 (mu = 1, tau = 0.5)",
                                     regime="FedCOG's baselines use mu = 0.01 (FedCOG paper, A.2)")),
    "fedsam": Algorithm("fedavg", settings=_G + "SAMSettings", strategy=_S + "node_rules:FedSAM",
                        client="client_app.updates:fedsam_update", trains_ddpm=True,
                        rule=PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS, "Qu et al., 2022; Caldarola et al., 2022 (rho "
                                       "tuned per paper; 0.05 as SPEC 4.1)", regime=_SYNSAM_REGIME)),
    "mofedsam": Algorithm("previous-update", settings=_G + "MoFedSAMSettings", strategy=_S + "node_rules:MoFedSAM",
                          client="client_app.updates:mofedsam_update", trains_ddpm=True,
                          rule=PaperRule(_FEDAVG_STEP + "; sends the previous global update", _SAMPLE_WEIGHTS,
                                         "Qu et al., 2022 (alpha = 0.1)", regime="FedDDPM paper: Adam zeta = 2e-4 on "
                                         "the DDPM loss (its study files set it)")),
    # decentralized FL (issue 6): the ServerApp only relays; the node rules differ
    "dpsgd": _relay(strategy="DPSGD", client="dpsgd_update", step="one local SGD step",
                    source="Lian et al., 2017; OledFL paper's baselines (k = 10 neighbours)"),
    "dfedavg": _relay(strategy="DFedAvg", client="dfedavg_update", step="K local epochs",
                      source="Sun et al., 2022; OledFL paper's baselines (k = 10 neighbours)"),
    "dfedavgm": _relay(_G + "DFedAvgMSettings", strategy="DFedAvgM", client="dfedavgm_update", step="local momentum",
                       source="Sun et al., 2022 (local momentum 0.9); OledFL paper's baselines"),
    "dfedsam": _relay(_G + "SAMSettings", strategy="DFedSAM", client="dfedsam_update", step="SAM local steps",
                      source="Shi et al., 2023; OledFL paper's baselines"),
    "oledfl-sgd": _relay(_G + "OledFLSettings", strategy="OledFL", client="oledfl_sgd_update",
                         step="Ole restart x_i + beta (x_i - z_i)",
                         source="OledFL paper, Algorithm 1 and Sec. experiments (beta = 0.99 on CIFAR-10, k = 10)"),
    "oledfl-sam": _relay(_G + "OledFLClassSettings", strategy="OledFL", client="oledfl_sam_update",
                         step="Ole restart, then SAM local steps",
                         source="OledFL paper, Algorithm 1 and Sec. experiments (beta = 0.99 on CIFAR-10, k = 10)"),
    # FedCOG (issue 4) is client-side only: "fedcog" = "fedavg+cog" with its own class (it sends the start round,
    # its settings group's: CogSettings' cog_start_round); the X+cog rows are generated below from the rows marked
    # cog_base; the server sends FedCOG's settings beside X's (common/run/client_settings.py `client_keys`)
    "fedcog": Algorithm("fedavg", settings="common.algorithms.cog_settings:FedCOGRuleSettings",
                        strategy=_S + "node_rules:FedCOG", client=_FEDAVG_CLIENT, with_cog=True, page="fedcog.md",
                        rule=PaperRule(_FEDAVG_STEP + " (FedCOG is client-side only)",
                                       "FedCOG's reference code (rui-ye/FedCOG fedcog.py: sample-size weights)",
                                       "FedCOG paper, Sec. 4 and A.2.2 (G = 256, lambda_dis = 0.1, the "
                                       "hyper-parameter-free KD weights); rui-ye/FedCOG fedcog.py and "
                                       "gen_utils/generate_image.py (100 steps, Adam 0.01)",
                                       ("gen-budget", "gen-steps", "gen-lr", "lambda-dis", "kd-weighting"),
                                       "FedCOG paper: SGD lr 0.01, momentum 0.9, weight decay 1e-5 (reference code), "
                                       "400 local iterations of batch 64, FedCOG from round 50 of 70 (its study files "
                                       "set them)")),
    # FedSynSAM (issue 3): the SAM family and the baselines of the FedSynSAM paper
    "fedlesam": Algorithm("fedlesam", settings=_G + "SAMSettings", strategy=_S + "sam_baselines:FedLESAM",
                          client="client_app.sam_family:fedlesam_update", page=_SYNSAM,
                          rule=PaperRule(_FEDAVG_STEP + "; sends the previous global update", _SAMPLE_WEIGHTS,
                                         "Fan et al., 2024; " + _SYNSAM_BASELINE, regime=_SYNSAM_REGIME)),
    "fedsynsam": Algorithm("fedsynsam", settings="common.algorithms.synsam_settings:SynSAMRuleSettings",
                           strategy=_S + "fedsynsam:FedSynSAM", client="client_app.sam_family:fedsynsam_update",
                           mean="uniform", page=_SYNSAM,
                           rule=PaperRule(_FEDAVG_STEP + "; after R rounds distils D_syn from the trajectory and "
                                          "sends it once", "FedSynSAM paper, eq. 24 (Delta = (1/S) sum of Delta_i) and "
                                          "the update before it", "FedSynSAM paper, Sec. V (R = 30, 20 images per "
                                          "class, M = 200, beta = 0.9, eta_alpha = 1e-5, global lr 1) and Algorithm 1",
                                          ("trajectory-rounds", "synthetic-ipc", "distill-iterations",
                                           "distill-alpha-lr", "server-lr"), _SYNSAM_REGIME)),
    "dynafed": Algorithm("dynafed", strategy=_S + "dynafed:DynaFed", client=_FEDAVG_CLIENT, page=_SYNSAM,
                         rule=PaperRule(_FEDAVG_STEP + "; then trains the global model on D_syn (Adam, a few epochs)",
                                        _SAMPLE_WEIGHTS, "Pi et al., 2023 (DynaFed); SPEC 4.1 (Adam 1e-4, 5 epochs)",
                                        ("dynafed-lr", "dynafed-epochs", "trajectory-rounds"), _SYNSAM_REGIME)),
    "fedgamma": Algorithm("scaffold", settings=_G + "SAMSettings", strategy=_S + "node_rules:FedGamma",
                          client="client_app.sam_family:fedgamma_update", state_follows_update=True,
                          page=_SYNSAM,
                          rule=PaperRule(_SCAFFOLD_STEP, _SAMPLE_WEIGHTS, "Dai et al., 2023; " + _SYNSAM_BASELINE,
                                         regime=_SYNSAM_REGIME)),
    "fedlesam-s": Algorithm("fedlesam-s", settings=_G + "SAMSettings", strategy=_S + "sam_baselines:FedLESAMS",
                            client="client_app.sam_family:fedlesam_s_update", state_follows_update=True,
                            page=_SYNSAM,
                            rule=PaperRule(_SCAFFOLD_STEP + "; sends the previous global update", _SAMPLE_WEIGHTS,
                                           "Fan et al., 2024 (FedLESAM-S); " + _SYNSAM_BASELINE,
                                           regime=_SYNSAM_REGIME)),
    "fedlesam-d": Algorithm("fedlesam-d", settings=_G + "FedDynSAMSettings", strategy=_S + "sam_baselines:FedLESAMD",
                            client="client_app.sam_family:fedlesam_d_update", state_follows_update=True,
                            page=_SYNSAM,
                            rule=PaperRule("h += (1/N) sum of (g_i+ - g_i); w + server-lr x mean of the updates - h / "
                                           "dyn-alpha; sends the previous global update", _SAMPLE_WEIGHTS,
                                           "Fan et al., 2024 (FedLESAM-D); FedDyn's alpha = 0.1 (Acar et al., 2021); "
                                           + _SYNSAM_BASELINE, regime=_SYNSAM_REGIME)),
    "fedsmoo": Algorithm("fedsmoo", settings=_G + "FedDynSAMSettings", strategy=_S + "sam_baselines:FedSMOO",
                         client="client_app.sam_family:fedsmoo_update", state_follows_update=True,
                         page=_SYNSAM,
                         rule=PaperRule("h -= (dyn-alpha / N) sum of the updates; w + server-lr x mean - h / "
                                        "dyn-alpha; global perturbation rho x mean(mu_i - e_i) / its norm",
                                        _SAMPLE_WEIGHTS,
                                        "Sun et al., 2023 (FedSMOO); FedDyn's alpha = 0.1; " + _SYNSAM_BASELINE,
                                        regime=_SYNSAM_REGIME)),
    # FedDDPM (issue 5): diffusion models with server-side auxiliary correction; the clients run FedAvg's rule
    # on the DDPM loss (the warmup is client_app/diffusion.py's)
    "fedddpm": Algorithm("fedddpm", strategy=_S + "fedddpm:FedDDPM", client=_FEDAVG_CLIENT, trains_ddpm=True,
                         ddpm_only=True, mean="uniform", page="fedddpm.md",
                         rule=PaperRule("w + (1/n) sum of (w_i - w), then correction-epochs on the auxiliary set A at "
                                        "correction-lr", "FedDDPM paper, Algorithm 1 line 9 (w^ = w + sum over Z_t of "
                                        "(1/n)(w_i - w))", "FedDDPM paper, Sec. V and Table I's setup (MNIST: E = 1, "
                                        "eta = 5e-5, |A_i| = 0.1 m_i, warmup 200 epochs)",
                                        ("aux-fraction", "correction-epochs", "correction-lr", "warmup-epochs"),
                                        _DDPM_REGIME)),
    "fedddpm+": Algorithm("fedddpm+", strategy=_S + "fedddpm_plus:FedDDPMPlus", client=_FEDAVG_CLIENT,
                          trains_ddpm=True, ddpm_only=True, mean="uniform", page="fedddpm.md",
                          rule=PaperRule("FedAvg rounds (1/n); QuickTest every 10 rounds (EMA gamma 0.4, threshold "
                                         "0.2), then oneshot-epochs on A at the clients' lr and stop",
                                         "FedDDPM paper, Algorithms 2 and 3 (FedAvg's 1/n mean)",
                                         "FedDDPM paper, Algorithms 2 and 3 and Sec. V (500 QuickTest samples, E = 20 "
                                         "on MNIST)", ("aux-fraction", "quicktest-every", "quicktest-size",
                                                       "quicktest-gamma", "quicktest-threshold", "oneshot-epochs",
                                                       "warmup-epochs"), _DDPM_REGIME)),
}


def with_cog_rows(rows: dict[str, Algorithm]) -> dict[str, Algorithm]:
    """`rows` and, after each row FedCOG plugs into, its `X+cog` row: X's halves and keys, with FedCOG.

    FedCOG needs a classifier's logits, so an `X+cog` row does not train a U-Net.
    """
    table: dict[str, Algorithm] = dict(rows)
    for name, row in rows.items():
        if row.cog_base:
            table[f"{name}+cog"] = replace(row, cog_base=False, with_cog=True, trains_ddpm=False,
                                           page="fedcog.md")
    return table


ALGORITHMS: dict[str, Algorithm] = with_cog_rows(_ROWS)

# the rows FedCOG plugs into (`cog = true` runs X+cog)
COG_BASES: tuple[str, ...] = tuple(name for name, row in ALGORITHMS.items() if row.cog_base)
