"""The numbers the method pages and docs/reliability.md quote from the committed studies, computed from their ledgers.

A page marks each such number where it stands, `<!-- n:KIND STUDY ARGS -->TEXT<!-- /n -->` (the markers do not
show on a rendered page), and this script computes TEXT from the study's committed ledger
(`benchmarks/results/studies/STUDY/ledger.jsonl`, read as `fedsynth study` reads it, by the code of the study
reports), so a sentence cannot drift from the runs it describes; tests/test_doc_numbers.py fails when a page's text
differs from what this computes. The kinds (arms are the study's; `A>B` is a claim as the study file writes it, with
its spaces left out):

- `claim STUDY A>B` / `verdict STUDY A>B` / `pairs STUDY A>B` / `range STUDY A>B`: a claim's paired difference
  with its 95 % interval (`−0.08 [−0.20, +0.04]`, in the report's units), its verdict, its number of paired seeds,
  and its smallest and largest per-seed difference (`−4.15 to +1.61`); `A>B@VARIANT` names a variant's, and
  `claim STUDY A>B SCORE` one of a claim tested on several scores (`rounds-to:0.85`, `central-accuracy`);
- `mean STUDY ARM` / `mean-range STUDY ARM1,ARM2,...`: an arm's mean score over its report seeds, and the lowest
  and highest of several arms' means (`71-127`), in display units;
- `diff STUDY A B`: the paired difference A − B of the study's score for two arms the study file has no claim on;
  `diff-verdict STUDY A B` its verdict as for a claim "A > B" (holds, reversed, not resolved);
- `interaction STUDY A B C D`: the paired difference of two differences, (A − B) − (C − D) per seed;
  `interaction-verdict STUDY A B C D` its verdict as for a claim "(A − B) > (C − D)";
- `spans STUDY ARM`: each report seed's spread (max − min) of the arm's last-k evaluations, in display units;
- `swing STUDY ARM`: the arm's mean absolute change between consecutive evaluations (those after round 0, the
  model before training), averaged over its report seeds, in display units;
- `sweep STUDY A<B`: the range of a claim's rounds-to differences over the targets the study scores it at (those
  at least one run reached), `+30.0 to +110.3 rounds over targets 0.8-0.86`;
- `beats STUDY ARM B1,B2,...` / `beats-pairs STUDY ARM B1,B2,...`: at how many of the arm's evaluations (each seed,
  each round) its metric is better than that of every Bi, "N of M"; and in how many of the comparisons with one Bi.

    python benchmarks/doc_numbers.py            # list each page's numbers that differ from the ledgers
    python benchmarks/doc_numbers.py --write    # rewrite them
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.claims_figure import ROOT, _digits, _loaded, _signed, unit  # noqa: E402

PAGES = [ROOT / "docs" / name for name in ("fedsynsam.md", "fedcog.md", "fedddpm.md", "oledfl.md", "reliability.md")]
MARKER = re.compile(r"<!-- n:(?P<spec>[^\n]*?) -->(?P<text>[^\n]*?)<!-- /n -->")


@functools.lru_cache(maxsize=None)
def _study(name: str):
    """The committed study and its ledger, read by the keys it was made with (`keyed_for`)."""
    from fedsynth.study.plan import keyed_for

    study, ledger = _loaded(name, "")
    return keyed_for(study, ledger), ledger


def _claim(study, text: str):
    wanted = text.replace(" ", "")
    for claim in study.claims:
        if claim.text.replace(" ", "") == wanted:
            return claim
    raise KeyError(f"study {study.name} has no claim {text!r}")


def _scores(study, ledger, arm: str, score: str | None = None, metric: str | None = None) -> dict[int, float]:
    from fedsynth.study.verdicts import cell_scores

    if arm not in study.arms:
        raise KeyError(f"study {study.name} has no arm {arm!r}")
    return cell_scores(study, ledger, arm, score or study.score, metric)[0]


def _interval_text(values: list[float], digits: int) -> str:
    """`−0.08 [−0.20, +0.04]` over the values (already in display units), the mean alone for one."""
    from fedsynth.study.statistics import t_interval

    interval = t_interval(values)
    if interval.n < 2 or math.isnan(interval.low):
        return _signed(interval.mean, digits)
    return f"{_signed(interval.mean, digits)} [{_signed(interval.low, digits)}, {_signed(interval.high, digits)}]"


def _claim_result(name: str, text: str):
    """(study, claim, its result) of `A>B` or `A>B@VARIANT`."""
    from fedsynth.study.verdicts import claim_cells, claim_result

    study, ledger = _study(name)
    text, _, variant = text.partition("@")
    claim = _claim(study, text)
    cells = [c for c in claim_cells(study, claim) if c[0] == variant]
    if not cells:
        raise KeyError(f"study {study.name} has no variant {variant!r}")
    return study, claim, claim_result(study, ledger, claim, cells[0])


def claim_text(name: str, text: str, score: str = "") -> str:
    """The claim's difference as its report prints it; `score` picks one of a claim tested on several (its metric
    or score as the report's axis names it: `central-accuracy`, `rounds-to:0.85`)."""
    from fedsynth.study.figure import claim_bars
    from benchmarks.claims_figure import difference_text

    study, ledger = _study(name)
    claim_name, _, variant = text.partition("@")
    label = _claim(study, claim_name).text + (f" ({variant})" if variant else "")
    bars = [bar for bar in claim_bars(study, ledger) if bar.label == label and f" {score}" in bar.axis]
    if len(bars) != 1:
        raise KeyError(f"study {study.name}: claim {text!r} has {len(bars)} results"
                       + (f" on {score!r}" if score else "; name one's score"))
    return difference_text(bars[0], _digits(unit(bars[0].unit)))


def verdict_text(name: str, text: str) -> str:
    return _claim_result(name, text)[2]["verdict"]


def pairs_text(name: str, text: str) -> str:
    return str(_claim_result(name, text)[2]["interval"].n)


def range_text(name: str, text: str) -> str:
    from fedsynth.study.verdicts import claim_format

    study, _, result = _claim_result(name, text)
    scale, digits = claim_format(study, result)
    values = [d * scale for d in result["differences"].values()]
    return f"{_signed(min(values), digits)} to {_signed(max(values), digits)}"


def sweep_text(name: str, text: str) -> str:
    from fedsynth.study.verdicts import claim_cells, claim_result

    study, ledger = _study(name)
    wanted = text.replace(" ", "")
    found = []
    for claim in study.claims:
        if claim.text.replace(" ", "") != wanted or not claim.score.startswith("rounds-to:"):
            continue
        result = claim_result(study, ledger, claim, claim_cells(study, claim)[0])
        if result["censored"] < 2 * result["interval"].n:  # some run reached the target
            found.append((float(claim.score.split(":")[1]), result["interval"].mean))
    if not found:
        raise KeyError(f"study {study.name} has no rounds-to claim {text!r} that a run reached")
    means = [mean for _, mean in found]
    targets = [target for target, _ in found]
    return (f"{_signed(min(means), 1)} to {_signed(max(means), 1)} rounds over targets "
            f"{min(targets):g}-{max(targets):g}")


def _mean(study, ledger, arm: str) -> float:
    values = list(_scores(study, ledger, arm).values())
    return sum(values) / len(values) * study.display_scale


def mean_text(name: str, arm: str) -> str:
    study, ledger = _study(name)
    return f"{_mean(study, ledger, arm):.1f}"


def mean_range_text(name: str, arms: str) -> str:
    study, ledger = _study(name)
    means = [_mean(study, ledger, arm) for arm in arms.split(",")]
    return f"{min(means):.0f}-{max(means):.0f}"


def diff_text(name: str, a: str, b: str) -> str:
    """The paired difference A − B of the study's score (a pair without a claim), in the report's units."""
    from fedsynth.study.statistics import paired_differences

    study, ledger = _study(name)
    scale = study.display_scale
    differences = paired_differences(_scores(study, ledger, a), _scores(study, ledger, b))
    return _interval_text([d * scale for d in differences.values()], _digits("points" if scale == 100 else ""))


def diff_verdict_text(name: str, a: str, b: str) -> str:
    """The verdict of "A > B" for a pair without a claim, from the same paired interval as `diff_text`."""
    from fedsynth.study.statistics import paired_differences, t_interval, verdict

    study, ledger = _study(name)
    differences = paired_differences(_scores(study, ledger, a), _scores(study, ledger, b))
    return verdict(t_interval(list(differences.values())), ">")


def _interaction(name: str, a: str, b: str, c: str, d: str) -> tuple[list[float], float]:
    """The per-seed (A − B) − (C − D) in display units, and the study's display scale."""
    from fedsynth.study.statistics import paired_differences

    study, ledger = _study(name)
    first = paired_differences(_scores(study, ledger, a), _scores(study, ledger, b))
    second = paired_differences(_scores(study, ledger, c), _scores(study, ledger, d))
    scale = study.display_scale
    return [v * scale for v in paired_differences(first, second).values()], scale


def interaction_text(name: str, a: str, b: str, c: str, d: str) -> str:
    """(A − B) − (C − D), paired per seed: how much the difference A − B changes from C − D."""
    values, scale = _interaction(name, a, b, c, d)
    return _interval_text(values, _digits("points" if scale == 100 else ""))


def interaction_verdict_text(name: str, a: str, b: str, c: str, d: str) -> str:
    """The verdict of "(A − B) > (C − D)" from the same paired interval."""
    from fedsynth.study.statistics import t_interval, verdict

    return verdict(t_interval(_interaction(name, a, b, c, d)[0]), ">")


def _curves(study, ledger, arm: str) -> list[list[float]]:
    """Each report seed's curve of the study metric (values only, in round order), seeds in order."""
    from fedsynth.study.plan import plan

    _, report, _ = plan(study, ledger)
    found = {}
    for spec in report:
        entry = ledger.get(spec.key)
        if spec.cell == arm and entry is not None:
            points = sorted(entry.get("curves", {}).get(study.metric, []))
            found[spec.seed] = [float(v) for r, v in points if isinstance(v, (int, float)) and r > 0]
    if not found:
        raise KeyError(f"study {study.name} has no report runs of arm {arm!r}")
    return [found[seed] for seed in sorted(found)]


def spans_text(name: str, arm: str) -> str:
    study, ledger = _study(name)
    spans = [(max(c[-study.last_k:]) - min(c[-study.last_k:])) * study.display_scale for c in _curves(study, ledger, arm)]
    return ", ".join(f"{s:.1f}" for s in spans)


def swing_text(name: str, arm: str) -> str:
    study, ledger = _study(name)
    swings = [sum(abs(b - a) for a, b in zip(c, c[1:])) / (len(c) - 1) for c in _curves(study, ledger, arm)]
    return f"{sum(swings) / len(swings) * study.display_scale:.1f}"


def _beats(name: str, arm: str, others: str) -> tuple[int, int, int, int]:
    """(evaluations where ARM beats every other arm, evaluations, comparisons it wins, comparisons)."""
    from fedsynth.study.scores import lower_is_better

    study, ledger = _study(name)
    lower = lower_is_better(study.metric)
    names = others.split(",")
    mine = _by_round(study, ledger, arm)
    theirs = {other: _by_round(study, ledger, other) for other in names}
    every = evaluations = won = comparisons = 0
    for seed, rounds in mine.items():
        for round_number, value in rounds.items():
            wins = [(value < t[seed][round_number]) if lower else (value > t[seed][round_number])
                    for t in theirs.values()]
            evaluations += 1
            every += all(wins)
            won += sum(wins)
            comparisons += len(wins)
    return every, evaluations, won, comparisons


def _by_round(study, ledger, arm: str) -> dict[int, dict[int, float]]:
    from fedsynth.study.plan import plan

    _, report, _ = plan(study, ledger)
    return {spec.seed: {int(r): float(v) for r, v in ledger.get(spec.key)["curves"][study.metric]}
            for spec in report if spec.cell == arm and ledger.get(spec.key) is not None}


def beats_text(name: str, arm: str, others: str) -> str:
    every, evaluations, _, _ = _beats(name, arm, others)
    return f"{every} of {evaluations}"


def beats_pairs_text(name: str, arm: str, others: str) -> str:
    _, _, won, comparisons = _beats(name, arm, others)
    return f"{won} of {comparisons}"


KINDS: dict[str, Callable[..., str]] = {
    "claim": claim_text, "verdict": verdict_text, "pairs": pairs_text, "range": range_text, "mean": mean_text,
    "mean-range": mean_range_text, "sweep": sweep_text, "diff": diff_text, "diff-verdict": diff_verdict_text,
    "interaction": interaction_text, "interaction-verdict": interaction_verdict_text, "spans": spans_text,
    "swing": swing_text, "beats": beats_text, "beats-pairs": beats_pairs_text,
}


def compute(spec: str) -> str:
    """The text of one marker's number: `KIND STUDY ARGS...` (see the module's docstring)."""
    kind, *args = spec.split()
    if kind not in KINDS:
        raise KeyError(f"unknown kind {kind!r} in <!-- n:{spec} -->; known: {', '.join(KINDS)}")
    return KINDS[kind](*args)


def page_numbers(text: str) -> list[tuple[str, str, str]]:
    """(marker spec, the page's text, the computed text) of every marked number of a page."""
    return [(m["spec"], m["text"], compute(m["spec"])) for m in MARKER.finditer(text)]


def rewrite(text: str) -> str:
    """The page with every marked number replaced by the computed one."""
    return MARKER.sub(lambda m: f"<!-- n:{m['spec']} -->{compute(m['spec'])}<!-- /n -->", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages' marked numbers")
    args = parser.parse_args(argv)
    stale = 0
    for page in PAGES:
        text = page.read_text()
        for spec, shown, computed in page_numbers(text):
            if shown != computed:
                stale += 1
                print(f"{page.relative_to(ROOT)}: {spec}: the page says {shown!r}, the ledger gives {computed!r}")
        if args.write:
            page.write_text(rewrite(text))
    print(f"{stale} number(s) differ{' (rewritten)' if args.write and stale else ''}", file=sys.stderr)
    return 0 if args.write or not stale else 1


if __name__ == "__main__":
    sys.exit(main())
