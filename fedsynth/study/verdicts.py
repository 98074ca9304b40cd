"""Each claim's paired difference A − B over the report seeds, its 95 % interval and its verdict, from the ledger.

Read by the report (fedsynth/study/report.py) and the claim figure (fedsynth/study/figure.py), so both
show the same numbers in the same units.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedsynth.study.ledger import Ledger
from fedsynth.study.plan import plan
from fedsynth.study.statistics import paired_differences, t_interval, verdict
from fedsynth.study.studyfile import Claim, Study


def display_scale_of(study: Study, score: str) -> float:
    """Accuracy-like scores are shown in the study's display units; rounds and seconds as they are."""
    return 1.0 if "-to:" in score else study.display_scale


def cell_scores(study: Study, ledger: Ledger, cell: str, score: str, metric: str | None = None) -> tuple[dict[int, float], int]:
    """{report seed: score} of a cell, and how many runs never reached a rounds-to target (censored).

    A run that never reached a rounds-to target counts as reaching it one round
    after its last: the comparison stays paired, and is conservative for the arm
    that failed to reach it (its true number is larger).
    """
    metric = metric or study.metric
    _, report, _ = plan(study, ledger)
    out: dict[int, float] = {}
    censored = 0
    for spec in report:
        entry = ledger.get(spec.key)
        if spec.cell != cell or entry is None:
            continue
        value = entry.get("scores", {}).get(metric, {}).get(score)
        if value is None and score.startswith("rounds-to:"):
            value, censored = float(entry.get("rounds", 0)) + 1, censored + 1
        if isinstance(value, (int, float)):
            out[spec.seed] = float(value)
    return out, censored


def claim_cells(study: Study, claim: Claim) -> list[tuple[str, str, str]]:
    """(variant, cell of A, cell of B) for each variant the claim is tested in."""
    variants = list(study.variants) or [""]
    return [(v, f"{claim.better}@{v}" if v else claim.better, f"{claim.other}@{v}" if v else claim.other) for v in variants]


def claim_result(study: Study, ledger: Ledger, claim: Claim, variant_cells: tuple[str, str, str]) -> dict[str, Any]:
    """The paired difference A − B over report seeds, its 95 % interval and the verdict."""
    variant, cell_a, cell_b = variant_cells
    a, censored_a = cell_scores(study, ledger, cell_a, claim.score, claim.metric)
    b, censored_b = cell_scores(study, ledger, cell_b, claim.score, claim.metric)
    differences = paired_differences(a, b)
    interval = t_interval(list(differences.values()))
    label = claim.score if claim.metric == study.metric else f"`{claim.metric}` {claim.score}"
    return {"claim": claim.text, "variant": variant, "score": label, "differences": differences, "metric": claim.metric,
            "interval": interval, "verdict": verdict(interval, claim.direction), "censored": censored_a + censored_b}


def digits_of(study: Study, score: str) -> int:
    return 1 if "-to:" in score else (2 if study.display_scale != 1.0 else 4)


def claim_format(study: Study, result: Mapping[str, Any]) -> tuple[float, int]:
    """(scale, digits) of a claim's numbers: an extra metric's are shown unscaled, as in its table."""
    if result["metric"] != study.metric:
        return 1.0, 1 if "-to:" in result["score"] else 4
    return display_scale_of(study, result["score"]), digits_of(study, result["score"])
