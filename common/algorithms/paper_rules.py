"""Every algorithm's paper rule, in one table: its mean, its server step, its own hyper-parameters and their source.

An algorithm's name runs its paper's rule by default (SPEC 7, "Every default is its paper's"). This table says
what that rule is and where each part comes from, so that a reader can check it against the paper and a test can
check the code against it:

- the **mean** of the updates is the row's `mean` in common/algorithm_table.py (what `aggregation = "auto"` and
  the class's `aggregation` default run); `mean_source` here says where the paper fixes it;
- the **server step** in words;
- the algorithm's **own hyper-parameters** where its paper (or, where the paper is silent, its reference code or
  SPEC.md) fixes them, as run-config keys with their default values: tests/test_paper_rule_defaults.py builds
  each public class with no arguments and compares its defaults, and the run config's, with these values;
- the **source**: equation, table or reference file; where the paper is silent, which reference the default
  follows;
- the **regime** where the paper's training recipe differs from the shared defaults (lr, momentum, local steps,
  batch): the shared recipe is not a rule of the algorithm, so the study files state the paper's (e.g. FedCOG's
  runs use SGD momentum 0.9).

The `X+cog` rows (common/algorithm_table.py `with_cog_rows`) run X's rule with FedCOG's client plug-in: their
server rule is X's. docs/algorithms.md's table is generated from this one (`rules_table_markdown`; regenerate
with `python -m common.algorithms.paper_rules`, or with every generated list: `python -m fedsynth.algorithm_docs
--write`), and tests/test_docs.py fails when the page differs.
Pure data: no torch, no numpy.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.algorithm_table import ALGORITHMS


@dataclass(frozen=True)
class PaperRule:
    """One algorithm's rule as its paper states it.

    server_step : what the server does with the mean of the updates, in words.
    mean_source : where the paper fixes its mean (the row's `mean`), or which reference the default follows.
    hyper_parameters : the algorithm's own run-config keys with the default its paper or reference code fixes.
    source : where those values come from (equation, table, section, reference file).
    regime : where the paper's training recipe differs from the shared defaults; "" when it does not.
    """

    server_step: str
    mean_source: str
    source: str
    hyper_parameters: Mapping[str, Any] = field(default_factory=dict)
    regime: str = ""


_FEDAVG_STEP = "w + server-lr x mean of the updates"
_SAMPLE_WEIGHTS = "McMahan et al., 2017, Algorithm 1 (n_k / n), as FedCOG's reference code aggregates its baselines"
_NO_SERVER_MEAN = "no server mean: each node mixes its neighbours' models (the mixing matrix W)"
_SCAFFOLD_STEP = "FedAvg's step; c += (1/N) sum over the answering clients of (c_i+ - c_i)"
_SYNSAM_BASELINE = ("as the FedSynSAM paper runs its baselines (Sec. V: global lr 1; rho tuned on "
                    "{0.001, 0.01, 0.05, 0.1, 0.5})")
_SYNSAM_REGIME = "FedSynSAM paper: K = 10 local iterations of batch 128, lr tuned on {0.01, 0.05, 0.1, 0.5}"
_OLEDFL_REGIME = ("OledFL paper: lr 0.1 x 0.998^t, weight decay 5e-4, batch 128, K = 5 local epochs, SAM rho 0.1, "
                  "beta 0.99 (CIFAR-10) / 0.8 (CIFAR-100)")

RULES: dict[str, PaperRule] = {
    "fedavg": PaperRule(_FEDAVG_STEP, "McMahan et al., 2017, Algorithm 1 (n_k / n)",
                        "McMahan et al., 2017, Algorithm 1; FedDDPM's baselines average 1/n (set aggregation)",
                        {"server-lr": 1.0}),
    "fedavgm": PaperRule("v <- server-momentum x v + mean of the updates; w + server-lr x v", _SAMPLE_WEIGHTS,
                         "Hsu et al., 2019 (beta swept; 0.9 as SPEC 4.1)", {"server-momentum": 0.9},
                         "FedCOG's baselines use server momentum 0.1 (FedCOG paper, A.2)"),
    "fedprox": PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS,
                         "Li et al., 2020 (mu tuned); 0.01 as FedCOG's baselines (FedCOG paper, A.2)",
                         {"proximal-mu": 0.01}),
    "scaffold": PaperRule(_SCAFFOLD_STEP,
                          "the paper's Algorithm 1 averages 1/|S|; the default follows FedCOG's reference code "
                          "(rui-ye/FedCOG scaffold.py: sample-size weights, c by 1/N), as for the other baselines",
                          "Karimireddy et al., 2020, Algorithm 1 (option II control variates)"),
    "moon": PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS, "Li, He & Song, 2021 (mu = 1, tau = 0.5)",
                      {"moon-mu": 1.0, "moon-tau": 0.5},
                      "FedCOG's baselines use mu = 0.01 (FedCOG paper, A.2)"),
    "fedsam": PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS,
                        "Qu et al., 2022; Caldarola et al., 2022 (rho tuned per paper; 0.05 as SPEC 4.1)",
                        {"sam-rho": 0.05}, _SYNSAM_REGIME),
    "mofedsam": PaperRule(_FEDAVG_STEP + "; sends the previous global update", _SAMPLE_WEIGHTS,
                          "Qu et al., 2022 (alpha = 0.1)", {"sam-rho": 0.05, "mofedsam-alpha": 0.1},
                          "FedDDPM paper: Adam zeta = 2e-4 on the DDPM loss (its study files set it)"),
    "dpsgd": PaperRule("relay: " + _NO_SERVER_MEAN + "; one local SGD step", "-",
                       "Lian et al., 2017; OledFL paper's baselines (k = 10 neighbours)", {"peers": 10},
                       _OLEDFL_REGIME),
    "dfedavg": PaperRule("relay: " + _NO_SERVER_MEAN + "; K local epochs", "-",
                         "Sun et al., 2022; OledFL paper's baselines (k = 10 neighbours)", {"peers": 10},
                         _OLEDFL_REGIME),
    "dfedavgm": PaperRule("relay: " + _NO_SERVER_MEAN + "; local momentum", "-",
                          "Sun et al., 2022 (local momentum 0.9); OledFL paper's baselines",
                          {"peers": 10, "dfedavgm-momentum": 0.9}, _OLEDFL_REGIME),
    "dfedsam": PaperRule("relay: " + _NO_SERVER_MEAN + "; SAM local steps", "-",
                         "Shi et al., 2023; OledFL paper's baselines", {"peers": 10}, _OLEDFL_REGIME),
    "oledfl-sgd": PaperRule("relay: " + _NO_SERVER_MEAN + "; Ole restart x_i + beta (x_i - z_i)", "-",
                            "OledFL paper, Algorithm 1 and Sec. experiments (beta = 0.99 on CIFAR-10, k = 10)",
                            {"peers": 10, "ole-beta": 0.99}, _OLEDFL_REGIME),
    "oledfl-sam": PaperRule("relay: " + _NO_SERVER_MEAN + "; Ole restart, then SAM local steps", "-",
                            "OledFL paper, Algorithm 1 and Sec. experiments (beta = 0.99 on CIFAR-10, k = 10)",
                            {"peers": 10, "ole-beta": 0.99}, _OLEDFL_REGIME),
    "fedcog": PaperRule(_FEDAVG_STEP + " (FedCOG is client-side only)",
                        "FedCOG's reference code (rui-ye/FedCOG fedcog.py: sample-size weights)",
                        "FedCOG paper, Sec. 4 and A.2.2 (G = 256, lambda_dis = 0.1, the hyper-parameter-free KD "
                        "weights); rui-ye/FedCOG fedcog.py and gen_utils/generate_image.py (100 steps, Adam 0.01)",
                        {"gen-budget": 256, "gen-steps": 100, "gen-lr": 0.01, "lambda-dis": 0.1,
                         "kd-weighting": "balanced"},
                        "FedCOG paper: SGD lr 0.01, momentum 0.9, weight decay 1e-5 (reference code), 400 local "
                        "iterations of batch 64, FedCOG from round 50 of 70 (its study files set them)"),
    "fedlesam": PaperRule(_FEDAVG_STEP + "; sends the previous global update", _SAMPLE_WEIGHTS,
                          "Fan et al., 2024; " + _SYNSAM_BASELINE, {"sam-rho": 0.05}, _SYNSAM_REGIME),
    "fedsynsam": PaperRule(
        _FEDAVG_STEP + "; after R rounds distils D_syn from the trajectory and sends it once",
        "FedSynSAM paper, eq. 24 (Delta = (1/S) sum of Delta_i) and the update before it",
        "FedSynSAM paper, Sec. V (R = 30, 20 images per class, M = 200, beta = 0.9, eta_alpha = 1e-5, global lr 1) "
        "and Algorithm 1",
        {"trajectory-rounds": 30, "synthetic-ipc": 20, "distill-iterations": 200, "synsam-beta": 0.9,
         "distill-alpha-lr": 1e-5, "server-lr": 1.0, "sam-rho": 0.05},
        _SYNSAM_REGIME),
    "dynafed": PaperRule(_FEDAVG_STEP + "; then trains the global model on D_syn (Adam, a few epochs)",
                         _SAMPLE_WEIGHTS, "Pi et al., 2023 (DynaFed); SPEC 4.1 (Adam 1e-4, 5 epochs)",
                         {"dynafed-lr": 1e-4, "dynafed-epochs": 5, "trajectory-rounds": 30}, _SYNSAM_REGIME),
    "fedgamma": PaperRule(_SCAFFOLD_STEP, _SAMPLE_WEIGHTS, "Dai et al., 2023; " + _SYNSAM_BASELINE,
                          {"sam-rho": 0.05}, _SYNSAM_REGIME),
    "fedlesam-s": PaperRule(_SCAFFOLD_STEP + "; sends the previous global update", _SAMPLE_WEIGHTS,
                            "Fan et al., 2024 (FedLESAM-S); " + _SYNSAM_BASELINE, {"sam-rho": 0.05},
                            _SYNSAM_REGIME),
    "fedlesam-d": PaperRule("h += (1/N) sum of (g_i+ - g_i); w + server-lr x mean of the updates - h / dyn-alpha; "
                            "sends the previous global update", _SAMPLE_WEIGHTS,
                            "Fan et al., 2024 (FedLESAM-D); FedDyn's alpha = 0.1 (Acar et al., 2021); "
                            + _SYNSAM_BASELINE, {"sam-rho": 0.05, "dyn-alpha": 0.1}, _SYNSAM_REGIME),
    "fedsmoo": PaperRule("h -= (dyn-alpha / N) sum of the updates; w + server-lr x mean - h / dyn-alpha; global "
                         "perturbation rho x mean(mu_i - e_i) / its norm", _SAMPLE_WEIGHTS,
                         "Sun et al., 2023 (FedSMOO); FedDyn's alpha = 0.1; " + _SYNSAM_BASELINE,
                         {"sam-rho": 0.05, "dyn-alpha": 0.1}, _SYNSAM_REGIME),
    "fedddpm": PaperRule(
        "w + (1/n) sum of (w_i - w), then correction-epochs on the auxiliary set A at correction-lr",
        "FedDDPM paper, Algorithm 1 line 9 (w^ = w + sum over Z_t of (1/n)(w_i - w))",
        "FedDDPM paper, Sec. V and Table I's setup (MNIST: E = 1, eta = 5e-5, |A_i| = 0.1 m_i, warmup 200 epochs)",
        {"aux-fraction": 0.1, "correction-epochs": 1, "correction-lr": 5e-5, "warmup-epochs": 200},
        "FedDDPM paper: Adam zeta = 2e-4, batch 128 (MNIST), N = 100, p in {0.15, 0.3} (its study files set them)"),
    "fedddpm+": PaperRule(
        "FedAvg rounds (1/n); QuickTest every 10 rounds (EMA gamma 0.4, threshold 0.2), then oneshot-epochs on A "
        "at the clients' lr and stop",
        "FedDDPM paper, Algorithms 2 and 3 (FedAvg's 1/n mean)",
        "FedDDPM paper, Algorithms 2 and 3 and Sec. V (500 QuickTest samples, E = 20 on MNIST)",
        {"aux-fraction": 0.1, "quicktest-every": 10, "quicktest-size": 500, "quicktest-gamma": 0.4,
         "quicktest-threshold": 0.2, "oneshot-epochs": 20, "warmup-epochs": 200},
        "FedDDPM paper: Adam zeta = 2e-4, batch 128 (MNIST), N = 100, p in {0.15, 0.3} (its study files set them)"),
}


def rule_of(name: str) -> PaperRule:
    """The paper rule of algorithm `name`; an `X+cog` row runs X's server rule (KeyError for a name of neither)."""
    return RULES[name.removesuffix("+cog")]


def _value_text(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def rules_table_markdown() -> str:
    """The table of every built-in algorithm's rule (the `X+cog` rows under their base), as markdown."""
    rows = ["| algorithm | mean | server step | own hyper-parameters (default) | source | the paper's regime |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, rule in RULES.items():
        row = ALGORITHMS[name]
        mean = "-" if row.decentralized else f"{row.mean} ({rule.mean_source})"
        keys = ", ".join(f"`{k}` = {_value_text(v)}" for k, v in rule.hyper_parameters.items()) or "-"
        cogged = f"; `{name}+cog` the same with FedCOG's client plug-in" if f"{name}+cog" in ALGORITHMS else ""
        cells = [f"`{name}`", mean, rule.server_step + cogged, keys, rule.source, rule.regime or "the shared defaults"]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


BEGIN_MARK = "<!-- paper rules: generated by python -m common.algorithms.paper_rules; do not edit by hand -->"
END_MARK = "<!-- end of the generated paper rules -->"


def with_rules_table(page: str) -> str:
    """`page` (docs/algorithms.md) with the text between `BEGIN_MARK` and `END_MARK` replaced by the table."""
    head, begin, rest = page.partition(BEGIN_MARK)
    _, end, tail = rest.partition(END_MARK)
    if not begin or not end:
        raise ValueError(f"the page lacks the marks {BEGIN_MARK!r} ... {END_MARK!r}")
    return f"{head}{BEGIN_MARK}\n{rules_table_markdown()}\n{END_MARK}{tail}"


if __name__ == "__main__":
    # python -m common.algorithms.paper_rules   (rewrites docs/algorithms.md's table; --print: the table alone)
    if "--print" in sys.argv[1:]:
        sys.stdout.write(rules_table_markdown() + "\n")
    else:
        path = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
        path.write_text(with_rules_table(path.read_text()))
