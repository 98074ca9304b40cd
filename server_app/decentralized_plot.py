"""decentralized.png, the plot a decentralized run adds to its results folder.

The relay (`server_app/strategies/relay.py`) calls it from its `plot` hook; it lives beside the
app's other result writers, not in the strategy, because it is about the results folder, not the
round's messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


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
