"""The README's table of claims and its figure, made from the committed study ledgers.

Every row is one claim of one committed study (`benchmarks/results/studies/<study>/`):
the paper, the claim, our setting in a few words, the server rule its runs used (from
the ledger's effective configs; "not recorded" for a ledger made before provenance,
unless the row states the rule with its source), the verdict, the paired difference
with its 95 % interval and the paper's difference, computed by the same code as the
study reports (`fedsynth.study.figure.claim_bars`), so the README cannot drift from
them. The figure, `benchmarks/results/claims.png`, shows the same rows, one panel per
paper and unit, and `claims-<paper>.png` each paper's rows alone (on its method page).

    python benchmarks/claims_figure.py            # print the table, write the figure
    python benchmarks/claims_figure.py --readme   # also replace the table in README.md

A row's setting and paper note may quote other numbers of the ledgers as `{n:SPEC}`, computed as the method pages'
marked numbers are (benchmarks/doc_numbers.py). A new study's claim goes into the README by adding a `Row` below and running `--readme` (at most 25 rows: the
Dir(0.01) FedSynSAM row and the 8-bit FedSAM-vs-FedAvg row gave way to the confound study's, FedDDPM+ against FedAvg
(not resolved; FedDDPM+ against MoFedSAM stays) to the bounded-influence study's; their reports stay).
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "benchmarks" / "results" / "studies"
FIGURE = ROOT / "benchmarks" / "results" / "claims.png"
README = ROOT / "README.md"
BEGIN, END = "<!-- claims table: python benchmarks/claims_figure.py --readme -->", "<!-- end of claims table -->"


@dataclass(frozen=True)
class Row:
    """One README row: a claim (and variant) of a committed study, and how to describe it."""

    paper: str
    study: str
    claim: str
    variant: str
    setting: str
    paper_note: str = ""  # the paper's result in words, where the study file has no paper numbers for it
    score: str = ""  # which of the claim's scores ("rounds-to:0.85", "consensus-distance"); default its first
    study_file: str = ""  # the study file's name when it is not the study's (a part of a file run with --out)
    # The server rule of a ledger made before provenance, where it is known from elsewhere (say from where);
    # a ledger that records its runs' effective configs states its rule itself.
    rule: str = ""


# The server rules of the ledgers made before provenance, from when their runs finished (the ledgers' "finished"
# times) against the commits that changed the defaults: d464083 (2026-11-25 14:09) added a weight cap of 0.5,
# c1435f3 (2026-11-27 10:17) made bounded influence (1.5 / 0.4) the default, and issue 51 turned it off again.
PLAIN = "the paper's mean, no bound (ran before d464083 added any)"
CAP_HALF = ("sample-weighted mean under d464083's default weight cap 0.5 (binds only where one client holds over "
            "half a round's examples), no update bound")
RELAY = "decentralized: no server mean (the relay forwards the nodes' models)"

ROWS = [
    Row("FedSynSAM", "fedsynsam-confound", "fedsynsam > fedsam", "",
        "Path(1), 4-bit qsgd in buckets of 512, the tuned lr 0.2 and rho 0.05, 300 rounds",
        "+1.11 (Table II, 4 bits)"),
    Row("FedSynSAM", "fedsynsam-confound", "fedsynsam-oracle > fedsynsam", "",
        "the same; D_syn replaced by 20 real training images per class (a diagnostic: the server reads data)",
        "not in the paper (does the distillation hold FedSynSAM back?)"),
    Row("FedSynSAM", "fedsynsam-confound", "fedsynsam-normalized > fedsam", "",
        "the same; both ascent gradients scaled to unit norm before eq. 14's mix (an ablation)",
        "not in the paper (does a normalised mix bring FedSynSAM to FedSAM's level? Normalised against the raw mix "
        "directly: {n:diff fedsynsam-confound fedsynsam-normalized fedsynsam} points, "
        "{n:diff-verdict fedsynsam-confound fedsynsam-normalized fedsynsam})"),
    Row("FedSynSAM", "fedsynsam-bucket-8b-tuned", "fedsynsam > fedsam", "qsgd8b",
        "Path(1), 8-bit qsgd in buckets, the tuned lr and rho", rule=CAP_HALF),
    Row("FedSynSAM", "fedsynsam-cpu-codecs", "fedsynsam > fedsam", "none",
        "Path(1), no compression", "not in the paper (its Table II compares compressed uplinks only)", rule=PLAIN),
    Row("FedSynSAM", "fedsynsam-bucket-fixed-mlp2", "fedsynsam > fedsam", "",
        "Path(1), the 2NN, 4-bit qsgd in buckets", rule=CAP_HALF),
    Row("FedSynSAM", "fedsynsam-cpu-codecs", "fedsynsam < fedsam", "none",
        "sharpness of the final model, Path(1), no compression", "FedSynSAM's minima flatter", rule=PLAIN),
    Row("FedSynSAM", "fedsynsam-bucket-lr", "fedsam > fedavg", "qsgd4b",
        "Path(1), 4-bit qsgd in buckets, lr tuned", rule=CAP_HALF),
    Row("FedSynSAM", "fedsynsam-cpu-reduced", "fedsynsam > fedlesam", "",
        "Path(1), 4-bit qsgd with one norm (eq. 3); FedLESAM's lr at the edge of a 2-point grid (not tuned to an "
        "inner optimum)", rule=PLAIN),
    Row("FedSynSAM", "fedsynsam-cpu-reduced", "fedsynsam > dynafed", "",
        "Path(1), 4-bit qsgd with one norm (eq. 3); DynaFed's lr at the edge of a 2-point grid (not tuned to an "
        "inner optimum)", rule=PLAIN),
    Row("FedDDPM", "fedddpm-cpu", "fedddpm < scaffold", "",
        "Fashion-MNIST 8x8, shard, p = 0.3, 10 clients, 40 rounds; classifier FID (paper: Inception FID, MNIST)",
        rule=PLAIN),
    Row("FedDDPM", "fedddpm-cpu", "fedddpm < fedavg", "",
        "the same setting, against FedAvg", rule=PLAIN),
    Row("FedDDPM", "fedddpm-cpu", "fedddpm+ < mofedsam", "",
        "the same setting; the final model's FID of 5,000 samples; QuickTest never fired in 40 rounds, so FedDDPM+ "
        "ran as FedAvg and its one correction after the last round", "FedDDPM+ below every baseline", rule=PLAIN),
    Row("OledFL", "oledfl-long", "oledfl-sgd-b0.99 < dfedavg", "",
        "rounds to 85 %, the largest difference of the report's sweep ({n:sweep oledfl-long oledfl-sgd-b0.99<dfedavg}); "
        "100 nodes, random graph, MLP, 200 rounds, the paper's beta 0.99",
        "OledFL reaches a target in fewer rounds (CIFAR)", "rounds-to:0.85", rule=RELAY),
    Row("OledFL", "oledfl-long", "oledfl-sgd-b0.99 > dfedavg", "",
        "last-20 accuracy; 100 nodes, random graph, 200 rounds, beta 0.99", "OledFL more accurate (CIFAR)",
        "central-accuracy", rule=RELAY),
    Row("OledFL", "oledfl-long", "oledfl-sgd-b0.2 > dfedavg", "",
        "last-20 accuracy; as above at beta 0.2", "OledFL more accurate (CIFAR)", "central-accuracy", rule=RELAY),
    Row("OledFL", "oledfl-long-pull", "oledfl-sgd-b0.2 > dfedavg", "",
        "last-20 accuracy; DisPFL's directed pull graph, beta 0.2", "OledFL more accurate (CIFAR)",
        "central-accuracy", rule=RELAY),
    Row("OledFL", "oledfl-cpu", "oledfl-sam-b0.99 > dfedsam", "",
        "accuracy; 100 nodes, the SAM variant at beta 0.99", "OledFL-SAM more accurate than DFedSAM (CIFAR)",
        "central-accuracy", rule=RELAY),
    Row("FedCOG", "fedcog-cpu", "fedavg+cog > fedavg", "niid2",
        "Fashion-MNIST NIID-2 (pairs), 20 + 8 rounds, simple CNN", rule=PLAIN),
    Row("FedCOG", "fedcog-bounded-influence", "fedavg+cog-bounded > fedavg-bounded", "",
        "the same NIID-2 cell, both arms under bounded-influence = true, 5 seeds (plain arms beside them: "
        "{n:claim fedcog-bounded-influence fedavg+cog>fedavg}; plain gain − bounded gain: "
        "{n:interaction fedcog-bounded-influence fedavg+cog fedavg fedavg+cog-bounded fedavg-bounded})",
        "+9.57 (the paper's, which has no bound)"),
    Row("FedCOG", "fedcog-bounded-influence", "fedavg > fedavg-bounded", "",
        "plain FedAvg against bounded FedAvg on that cell, honest nodes; ten equal shares, so only the clip acted (the "
        "0.4 cap cannot bind). FedAvg+COG: {n:claim fedcog-bounded-influence fedavg+cog>fedavg+cog-bounded}",
        "not in the paper (the bound is ours)"),
    Row("FedCOG", "fedcog-cpu", "fedavg+cog > fedavg", "niid1",
        "NIID-1 (Dirichlet 0.1), 20 + 8 rounds", rule=PLAIN),
    Row("FedCOG", "fedcog-cpu", "scaffold+cog > scaffold", "niid1",
        "NIID-1; SCAFFOLD at a 10x smaller lr (it diverges at the paper's)", "not in the paper's table", rule=PLAIN),
    Row("FedCOG", "fedcog-paper", "fedavg+cog > fedavg", "",
        "NIID-2 at the paper's size (50 + 20 rounds of 400 steps), 2 seeds", rule=PLAIN),
    Row("FedCOG", "fedcog-ablation-cpu", "fedavg+cog > cog-noise", "",
        "Table 5's ablation: generated inputs against plain noise, NIID-2", "full FedCOG above every ablation",
        rule=PLAIN),
]


@functools.lru_cache(maxsize=None)
def _loaded(study_name: str, study_file: str) -> tuple[object, object]:
    """A committed study, loaded as `fedsynth study` loads it (the app's defaults), and its ledger."""
    from fedsynth.app_config import app_defaults
    from fedsynth.study.cli import run_config_check
    from fedsynth.study.ledger import Ledger
    from fedsynth.study.studyfile import load_study

    study = load_study(ROOT / "studies" / f"{study_file or study_name}.toml", run_config_check(ROOT),
                       app_defaults(ROOT))
    return study, Ledger(STUDIES / study_name / "ledger.jsonl")


def _study_and_ledger(row: Row) -> tuple[object, object]:
    return _loaded(row.study, row.study_file)


def row_rule(row: Row) -> str:
    """The server rule of the runs of the row's claim (both arms, in its variant), as their ledger records it.

    A ledger made before provenance records none: the row's own `rule`, marked as stated, or "not recorded".
    """
    from fedsynth.study.effective import RULE_NOT_RECORDED
    from fedsynth.study.plan import rules_by_cell
    from fedsynth.study.studyfile import CLAIM_PATTERN

    study, ledger = _study_and_ledger(row)
    better, _, other = CLAIM_PATTERN.match(row.claim).groups()
    cells = {f"{arm}@{row.variant}" if row.variant else arm for arm in (better, other)}
    rules = [rule for rule in rules_by_cell(study, ledger, cells) if rule != RULE_NOT_RECORDED]
    if rules:
        return "; ".join(rules)
    return f"{row.rule} (stated; not in its ledger)" if row.rule else "not recorded"


def row_bars(rows: list[Row] = ROWS) -> list[tuple[Row, object, str]]:
    """(row, its ClaimBar, its unit) for every row, computed from the committed ledger."""
    from fedsynth.study.figure import claim_bars

    studies: dict[str, list] = {}
    out = []
    for row in rows:
        if row.study not in studies:
            studies[row.study] = claim_bars(*_study_and_ledger(row))
        label = row.claim + (f" ({row.variant})" if row.variant else "")
        bars = [bar for bar in studies[row.study] if bar.label == label and f" {row.score}" in bar.axis]
        if not bars:
            raise KeyError(f"{row.study} has no claim {label!r} on {row.score or 'any score'}")
        out.append((row, bars[0], unit(bars[0].unit)))
    return out


def unit(bar_unit: str) -> str:
    """A difference's unit as the table names it: points, rounds, FID, or the metric's name."""
    return "FID" if "fid" in bar_unit else bar_unit


def _signed(value: float, digits: int) -> str:
    return f"{value:+.{digits}f}".replace("-", "−")


def difference_text(bar, digits: int) -> str:
    """`−0.08 [−0.20, +0.04]`, or the mean alone for fewer than two pairs."""
    if bar.n < 2 or math.isnan(bar.low):
        return _signed(bar.mean, digits) if not math.isnan(bar.mean) else "–"
    return f"{_signed(bar.mean, digits)} [{_signed(bar.low, digits)}, {_signed(bar.high, digits)}]"


def _digits(unit_name: str) -> int:
    return {"points": 2, "rounds": 1, "FID": 1}.get(unit_name, 3)


NUMBER = re.compile(r"\{n:([^}]*)\}")


def expand(text: str) -> str:
    """A row's text with each `{n:SPEC}` replaced by the number benchmarks/doc_numbers.py computes for SPEC from the
    ledgers (the README's own words then cannot drift from them either)."""
    if "{n:" not in text:
        return text
    from benchmarks.doc_numbers import compute

    return NUMBER.sub(lambda match: compute(match.group(1)), text)


def table_markdown(rows: list[Row] = ROWS) -> str:
    """The README's claims table."""
    lines = ["| paper | claim (A vs B) | our setting | server rule | verdict | A − B [95 % CI] | paper's A − B | report |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row, bar, unit_name in row_bars(rows):
        digits = _digits(unit_name)
        claim = f"{row.claim}" + (f" ({row.variant})" if row.variant else "")
        paper = _signed(bar.paper, digits) if bar.paper is not None else (expand(row.paper_note) or "–")
        verdict = f"**{bar.verdict}**" if bar.verdict in ("holds", "reversed") else bar.verdict
        lines.append(f"| {row.paper} | `{claim}` | {expand(row.setting)} | {row_rule(row)} | {verdict} | {difference_text(bar, digits)} "
                     f"{unit_name} | {paper} | [{row.study}](benchmarks/results/studies/{row.study}/report.md) |")
    return "\n".join(lines)


def paper_figure(paper: str, figure: Path = FIGURE) -> Path:
    """The figure of one paper's rows, shown on its method page: benchmarks/results/claims-<paper>.png (beside
    `figure`)."""
    return figure.with_name(f"claims-{paper.lower()}.png")


def plot(rows: list[Row] = ROWS, path: Path = FIGURE) -> None:
    """Every row's bar, one panel per paper and unit (bars labelled with the claim and the study); and one
    figure per paper with its panels alone, for its method page."""
    from fedsynth.study.figure import plot_claim_panels

    panels: dict[tuple[str, str], list] = {}
    for row, bar, unit_name in row_bars(rows):
        labelled = replace(bar, label=f"{bar.label} [{row.study}]")
        panels.setdefault((row.paper, unit_name), []).append(labelled)
    plot_claim_panels([(f"{paper}: A − B, {unit_name}", bars) for (paper, unit_name), bars in panels.items()], path,
                      "The papers' claims: paired A − B with 95 % CI (3-5 seeds)")
    for paper in dict.fromkeys(row.paper for row in rows):
        own = [(f"A − B, {unit_name}", bars) for (name, unit_name), bars in panels.items() if name == paper]
        plot_claim_panels(own, paper_figure(paper, path), f"{paper}: our tests of the paper's claims, A − B with 95 % CI")


def replace_readme_table(text: str, table: str) -> str:
    """README text with the part between the table's markers replaced by `table`."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"README.md has no {BEGIN} ... {END} markers")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", action="store_true", help="replace the claims table in README.md")
    parser.add_argument("--figure", type=Path, default=FIGURE,
                        help="the whole figure (the papers' own figures go beside it); default: the README's")
    args = parser.parse_args(argv)
    table = table_markdown()
    plot(path=args.figure)
    if args.readme:
        README.write_text(replace_readme_table(README.read_text(), table))
    print(table)
    print(f"figure: {args.figure}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
