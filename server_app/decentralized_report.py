"""What fedsynth's app adds around a decentralized run: the Ole warning, summary.json's fields, decentralized.png.

The relay (server_app/strategies/relay.py) is only the algorithm: it sends each node its message and keeps
each node's model. What a run reports about it lives here, beside the app's other result writers: the
warning when Ole's beta makes Ole's restart push the nodes apart on the run's topology, the fields a
decentralized run adds to summary.json (topology, traffic, rounds to the target accuracies, consensus), and
its plot. The recorder (server_app/recorder.py) and the ServerApp (server_app/app.py) call them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from common.algorithms.rule_settings import OledFLSettings
from common.keys import key_name, message_config, node_keys
from common.algorithms.gossip import parse_targets, rounds_to_targets
from common.algorithms.plugins import algorithm_of, rule_keys
from common.algorithms.mixing_spectrum import ole_beta_bound, ole_gossip_contraction
from common.algorithms.topology import RANDOM_TOPOLOGIES, mixing_matrix
from common.run.config import RunConfig


def _runs_ole(cfg: RunConfig) -> bool:
    """Whether the run's nodes use Ole's restart: its rule reads Ole's settings (`OledFLSettings`: OledFL-SGD and
    OledFL-SAM)."""
    return set(node_keys(OledFLSettings)) <= set(rule_keys(algorithm_of(cfg.algorithm)))


def warn_if_ole_diverges(cfg: RunConfig, num_nodes: int) -> None:
    """Warn when Ole's beta makes Ole's gossip push the nodes apart on this topology (OledFL runs only).

    Its restart is gossip with (1+beta) W - beta I; above the bound the
    nodes' disagreement grows every round whatever the training does.
    On a static topology that happens above (1 + lambda_min)/(1 - lambda_min)
    (ring 0.5). On the random ones, drawn afresh each round, the exact
    mean-square factor is trace/(n-1) of the expected operator
    (`ole_gossip_contraction` with `exchangeable`). On `random` it is
    below 1 for every beta < 1 (`k_regular_ole_contraction`; 100 nodes,
    k = 10: 0.98 at beta 0.99), so no warning is due there; it was also
    below 1 on `random-draws` and `random-pull` at every size measured. An
    earlier estimate (the top eigenvalue of a 20-graph average) was biased
    upward and warned wrongly on `random` (issue 35).
    """
    if not _runs_ole(cfg) or num_nodes < 2:
        return
    random = cfg.topology in RANDOM_TOPOLOGIES
    rounds = range(1, min(cfg.num_server_rounds, 20) + 1) if random else [0]
    ws = [mixing_matrix(cfg.topology, num_nodes, peers=cfg.peers, seed=cfg.seed, round_num=t, mixing=cfg.mixing)
          for t in rounds]
    contraction = ole_gossip_contraction(ws, cfg.ole_beta, exchangeable=random)
    if contraction <= 1.0:
        return
    bound = (f"; on this topology beta <= {ole_beta_bound(ws[0]):.2f} is stable"
             if cfg.topology not in RANDOM_TOPOLOGIES else "")
    log(WARNING, "%s %g on topology %s: Ole's restart multiplies the nodes' disagreement by %.2f "
        "per round (mean square), so they drift apart unless local training pulls them back%s",
        key_name("ole_beta"), cfg.ole_beta, cfg.topology, contraction, bound)


def decentralized_summary(cfg: RunConfig, rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a decentralized run adds to summary.json: its topology, traffic, targets and consensus."""
    trained = [r for r in rounds if r.get("round", 0) >= 1]
    summary: dict[str, Any] = {
        "topology": cfg.topology,
        "peers": cfg.peers if cfg.topology in RANDOM_TOPOLOGIES else None,
        "mixing": cfg.mixing,
        **{key: value if _runs_ole(cfg) else None for key, value in message_config(OledFLSettings, cfg).items()},
        "relay-mixing": cfg.relay_mixing,
        "psi": float(np.mean([r["psi"] for r in trained])) if trained else None,
    }
    for key in ("downlink-bytes-neighbour-models", "downlink-bytes-relay-mixing"):
        summary[key] = sum(r.get(key, 0) for r in trained)
    central = [r for r in rounds if "central-accuracy" in r]
    if central:
        summary["rounds-to-target"] = rounds_to_targets(
            [(r["round"], r["central-accuracy"]) for r in central], parse_targets(cfg.target_accuracies))
    if trained:
        summary["final-consensus-distance"] = trained[-1]["consensus-distance"]
        # the nodes' own (mixed) models on their local test splits in the last round; evaluating all N
        # models on the central test set as well would cost N evaluations per run
        summary.update({f"final-{k}": v for k, v in trained[-1].items() if k.startswith("node-accuracy-")})
    return summary


def plot_decentralized(rounds: Sequence[Mapping[str, Any]], folder: Path) -> None:
    """decentralized.png: consensus distance, and x-bar accuracy beside the nodes' accuracy band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [r for r in rounds if r.get("round", 0) >= 1]
    fig, (ax_cons, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [r["round"] for r in trained if "consensus-distance" in r]
    ys = [r["consensus-distance"] for r in trained if "consensus-distance" in r]
    if xs:
        ax_cons.plot(xs, ys, marker=".")
        if min(ys) > 0:
            ax_cons.set_yscale("log")
    ax_cons.set(xlabel="round", ylabel="(1/N) sum ||z_i - x-bar||^2", title="Consensus distance")
    central = [r for r in rounds if "central-accuracy" in r]
    if central:
        ax_acc.plot([r["round"] for r in central], [r["central-accuracy"] for r in central], marker=".",
                    label="average model x-bar (test set)")
    band = [r for r in trained if "node-accuracy-mean" in r]
    if band:
        bx = [r["round"] for r in band]
        ax_acc.plot(bx, [r["node-accuracy-mean"] for r in band], label="nodes' mixed models (local test), mean")
        ax_acc.fill_between(bx, [r["node-accuracy-min"] for r in band], [r["node-accuracy-max"] for r in band],
                            alpha=0.2, label="nodes min-max")
    ax_acc.set(xlabel="round", ylabel="accuracy", title="Accuracy")
    for ax in (ax_cons, ax_acc):
        ax.grid(alpha=0.3)
    if ax_acc.get_legend_handles_labels()[0]:
        ax_acc.legend(fontsize=8)
    # fixed margins: tight_layout would double the plot's cost, paid by every run
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.92, wspace=0.3)
    fig.savefig(folder / "decentralized.png", dpi=100)
    plt.close(fig)
