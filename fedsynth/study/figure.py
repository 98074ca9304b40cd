"""A study's claim figure, `claims.png`: each claim's paired difference at a glance.

One horizontal bar per claim (and variant): its paired difference A − B with the
95 % interval, the zero line, the verdict as the bar's colour, and the paper's
difference (A's paper number minus B's) as a marker where the study file gives
both arms a paper number. Claims on scores of different units (accuracy points,
rounds to a target, FID) get a panel each, so no axis mixes units. The plotted
numbers are written into the PNG's metadata (`Description`, JSON) so that a
reader, or a test, can check them against the report without reading pixels.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fedsynth.study.ledger import Ledger
from fedsynth.study.plan import keyed_for
from fedsynth.study.statistics import HOLDS, NOT_RESOLVED, NOT_RUN, REVERSED
from fedsynth.study.studyfile import Claim, Study
from fedsynth.study.verdicts import claim_cells, claim_format, claim_result

VERDICT_COLOURS = {HOLDS: "#1b7837", REVERSED: "#b2182b", NOT_RESOLVED: "#8c8c8c", NOT_RUN: "#d9d9d9"}


@dataclass(frozen=True)
class ClaimBar:
    """One claim's bar, in the units the report prints it in (NaN bounds: fewer than 2 pairs).

    `axis` names the panel (metric and score); `unit` what a difference is counted in: accuracy
    points (a display scale of 100), rounds (to a target), or the metric itself (FID, sharpness, ...).
    """

    label: str
    axis: str
    unit: str
    mean: float
    low: float
    high: float
    n: int
    verdict: str
    paper: float | None


def paper_difference(study: Study, claim: Claim, variant: str) -> float | None:
    """The paper's A − B from the arms' paper numbers; None when either is missing or the claim is not on them.

    The paper numbers are the study metric's scores in display units, so a claim on another
    metric or on rounds to a target has no paper difference.
    """
    if claim.metric != study.metric or "-to:" in claim.score:
        return None
    a, b = study.arms[claim.better].paper_number(variant), study.arms[claim.other].paper_number(variant)
    return None if a is None or b is None else float(a) - float(b)


def claim_bars(study: Study, ledger: Ledger) -> list[ClaimBar]:
    """The bars of a study's claims, in the order and units of the report's claim lines."""
    study = keyed_for(study, ledger)  # a ledger made before provenance: by the keys it was made with
    bars = []
    for claim in study.claims:
        for cells in claim_cells(study, claim):
            result = claim_result(study, ledger, claim, cells)
            scale, _ = claim_format(study, result)
            interval = result["interval"]
            variant = result["variant"]
            unit = "points" if scale == 100 else "rounds" if "-to:" in claim.score else claim.metric
            axis = f"A − B: {claim.metric} {claim.score}" + (", points" if scale == 100 else "")
            bars.append(ClaimBar(label=claim.text + (f" ({variant})" if variant else ""), axis=axis, unit=unit,
                                 mean=interval.mean * scale, low=interval.low * scale, high=interval.high * scale,
                                 n=interval.n, verdict=result["verdict"],
                                 paper=paper_difference(study, claim, variant)))
    return bars


def panels_by_axis(bars: Sequence[ClaimBar]) -> list[tuple[str, list[ClaimBar]]]:
    """The bars grouped by their axis (units), in order of first appearance."""
    panels: dict[str, list[ClaimBar]] = {}
    for bar in bars:
        panels.setdefault(bar.axis, []).append(bar)
    return list(panels.items())


def plot_claim_panels(panels: Sequence[tuple[str, Sequence[ClaimBar]]], path: Path, title: str) -> None:
    """One panel per (title, bars); a bar per claim, the paper's difference as a black diamond."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = [(name, list(bars)) for name, bars in panels if bars]
    heights = [max(len(bars), 1) * 0.38 + 0.9 for _, bars in panels] or [1.0]
    fig, axes = plt.subplots(len(heights), 1, figsize=(9, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (name, bars) in zip(axes[:, 0], panels):
        for y, bar in enumerate(bars):
            colour = VERDICT_COLOURS.get(bar.verdict, VERDICT_COLOURS[NOT_RUN])
            if bar.n >= 2 and math.isfinite(bar.low) and math.isfinite(bar.high):
                ax.plot([bar.low, bar.high], [y, y], color=colour, linewidth=6, solid_capstyle="butt", alpha=0.85)
            if math.isfinite(bar.mean):
                ax.plot([bar.mean], [y], "o", color="white", markeredgecolor=colour, markersize=6)
            if bar.paper is not None:
                ax.plot([bar.paper], [y], "D", color="black", markersize=5)
        ax.axvline(0.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks(range(len(bars)), [bar.label for bar in bars], fontsize=8)
        ax.set_ylim(len(bars) - 0.5, -0.5)
        ax.set_xlabel(name, fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    legend = [Line2D([], [], color=colour, linewidth=6, label=verdict) for verdict, colour in VERDICT_COLOURS.items()
              if any(bar.verdict == verdict for _, bars in panels for bar in bars)]
    if any(bar.paper is not None for _, bars in panels for bar in bars):
        legend.append(Line2D([], [], marker="D", color="black", linestyle="", label="paper's difference"))
    axes[0, 0].set_title(title, fontsize=10)
    if legend:
        axes[0, 0].legend(handles=legend, fontsize=7, loc="best")
    fig.tight_layout()
    data = [{"panel": name, **asdict(bar)} for name, bars in panels for bar in bars]
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps(data)})
    plt.close(fig)


def plotted_bars(path: Path) -> list[dict[str, object]]:
    """The bars a claim figure was drawn from, read back from its PNG metadata."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text["Description"])


def plot_claims(study: Study, ledger: Ledger, path: Path) -> None:
    """`claims.png` of a study: its claims' bars, one panel per unit."""
    plot_claim_panels(panels_by_axis(claim_bars(study, ledger)), path, f"{study.name}: claims, A − B with 95 % CI")
