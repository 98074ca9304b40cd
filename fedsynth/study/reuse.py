"""`fedsynth study --reuse OTHER/ledger.jsonl`: take another study's finished runs instead of running them again.

A run key is a digest of the effective run config (every key, defaults
resolved: `RunSpec.key`), so a run that another study finished with the same
key is the same run: an ablation study
whose base arms equal a main study's, or a study split in two files, need not
spend hours repeating it. The copy is entered in this study's ledger under this
study's cell, arm, variant and phase, names where it came from, and is scored
again by this study's rules (its metrics, last-k and targets) from the curves
the other ledger holds. A run whose curves cannot give those scores exactly is
not copied: one with no curve of one of this study's metrics (an empty curve,
a metric the run did not log, is exact), or with a curve the ledger thinned
(`fedsynth.study.ledger.MAX_CURVE_POINTS`), whose last-k would be wrong. A report
run is scored only on the metrics the report reads (the study's metric, its
extras and its claims'): the tuning metric is read from tuning runs alone, and
a 300-round run's per-round validation curve is thinned in every ledger.
A thinned run is still scored exactly when its run folder (the entry's
`run-dir`) is on this machine with every round in its metrics.jsonl: the
study scores its own runs from that file, so the copy gets the same scores.
Seconds-to scores need the rounds' times, which a ledger does not keep: they
are taken from the other ledger when it scored the same target, else left out.

A run the other ledger holds with the same study settings under another
effective config (a default changed between them) or other inputs (another
client count or data), or without a recorded one (a ledger made before
provenance, or keyed by key version 1, which covers neither the client count nor
the data), is not the same run: `ReuseRefused` names both keys and the keys that
differ, and nothing is copied. So is an entry of the right key that records no
effective config or no provenance, and a key that two sources hold with
different results (fedsynth/study/checks.py): both are named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsynth.study.checks import result_of, source_disagreements, without_provenance
from fedsynth.study.effective import KEY_VERSION
from fedsynth.study.ledger import MAX_CURVE_POINTS, Ledger
from fedsynth.study.scores import score_run
from fedsynth.study.plan import other_config_text, plan, read_rounds, runs_under_other_configs
from fedsynth.study.studyfile import RunSpec, Study


def phase_metrics(study: Study, phase: str) -> list[str]:
    """The metrics a run of `phase` ("tune" or "report") is scored on when it is reused."""
    if phase == "tune":
        return study.metrics
    read = {study.metric, *study.extra_metrics, *(claim.metric for claim in study.claims)}
    return [metric for metric in study.metrics if metric in read]


def rounds_from_curves(entry: Mapping[str, Any], metrics: Sequence[str]) -> list[dict[str, Any]] | None:
    """The entry's rounds rebuilt from its ledger curves; None when a metric has no curve or a thinned one."""
    curves = entry.get("curves", {})
    by_round: dict[int, dict[str, Any]] = {}
    for metric in metrics:
        points = curves.get(metric)
        if points is None or len(points) >= MAX_CURVE_POINTS:
            return None
        for round_number, value in points:
            by_round.setdefault(int(round_number), {"round": int(round_number)})[metric] = value
    return [by_round[r] for r in sorted(by_round)]


def rounds_from_run_folder(entry: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The entry's rounds from its run folder's metrics.jsonl; None when the folder is gone or lacks rounds."""
    run_dir = entry.get("run-dir")
    if not isinstance(run_dir, str) or not run_dir:
        return None
    rounds = read_rounds(Path(run_dir))
    last = max((int(row.get("round", 0)) for row in rounds), default=0)
    return rounds if rounds and last == entry.get("rounds") else None


def rescore(study: Study, entry: Mapping[str, Any], phase: str = "report") -> dict[str, dict[str, float | None]] | None:
    """This study's scores of another ledger's entry as a run of `phase`, from its curves or else its run folder;
    None when neither gives them exactly."""
    metrics = phase_metrics(study, phase)
    rounds = rounds_from_curves(entry, metrics)
    if rounds is None:
        rounds = rounds_from_run_folder(entry)
    if rounds is None:
        return None
    scores = score_run(rounds, metrics, last_k=study.last_k, targets=study.targets)
    for metric, values in scores.items():
        recorded = entry.get("scores", {}).get(metric, {})
        for name in [n for n in values if n.startswith("seconds-to:")]:
            if name in recorded:
                values[name] = recorded[name]
            else:
                del values[name]
    return scores


class ReuseRefused(ValueError):
    """`--reuse` of a ledger whose runs ran under another (or an unrecorded) effective config; names the keys."""


def refusals(study: Study, specs: Sequence[RunSpec], ledger: Ledger, sources: Sequence[Ledger]) -> list[str]:
    """Why each run of `specs` that neither this ledger nor any source holds by key is not taken from a source
    that holds it with the same study settings (another effective config, or none recorded)."""
    if study.keyed_by_settings or study.key_version < KEY_VERSION:
        return [f"study {study.name} is read with keys of an older version (its ledger was made before "
                f"{'provenance' if study.keyed_by_settings else 'run keys covered the client count and data'}): "
                "it takes no runs from other ledgers"]
    missing = [spec for spec in specs if spec.key not in ledger and not any(spec.key in s for s in sources)]
    return [other_config_text(source, spec, entry) for source in sources
            for spec, entry in runs_under_other_configs(missing, source)]


def reusable(study: Study, specs: Sequence[RunSpec], ledger: Ledger, sources: Sequence[Ledger]) -> dict[str, dict[str, Any]]:
    """{run key: the entry to enter} for the runs in `specs` this ledger lacks and a source finished.

    Raises ReuseRefused when a source holds one of them under another effective config (`refusals`).
    """
    refused = refusals(study, specs, ledger, sources) if sources else []
    if refused:
        _refuse("runs of the same study settings under another effective config or inputs are not the same runs",
                refused)
    candidates: dict[str, list[tuple[Ledger, dict[str, Any], str]]] = {}
    unrecorded: list[str] = []
    for spec in specs:
        if spec.key in ledger or spec.key in candidates:
            continue
        for source in sources:
            entry = source.get(spec.key)
            if entry is None or entry.get("exit-code") != 0:
                continue
            lacking = without_provenance(entry)
            if lacking is not None:
                unrecorded.append(f"ledger {source.path} entry {spec.key} ({spec.cell} {spec.phase} seed {spec.seed}) "
                                  f"{lacking}: what it ran is unknown")
                continue
            scores = rescore(study, entry, spec.phase)
            if scores is None:
                continue
            copied = {**entry, "cell": spec.cell, "arm": spec.arm, "variant": spec.variant, "phase": spec.phase,
                      "seed": spec.seed, "grid-point": spec.grid_point, "scores": scores, "study": study.name,
                      "reused-from": str(source.path)}
            candidates.setdefault(spec.key, []).append((source, copied, result_of(entry, scores)))
    if unrecorded:
        _refuse("an entry without an effective config or provenance is not reused", unrecorded)
    disagree = source_disagreements(candidates)
    if disagree:
        _refuse("two ledgers disagree on one key", disagree)
    return {key: found[0][1] for key, found in candidates.items()}


def _refuse(why: str, texts: list[str]) -> None:
    shown = texts[:5] + ([f"... and {len(texts) - 5} more"] if len(texts) > 5 else [])
    raise ReuseRefused(f"--reuse refused: {why} (docs/studies.md):\n  " + "\n  ".join(shown))


def reuse_runs(study: Study, ledger: Ledger, sources: Sequence[Ledger]) -> int:
    """Enter in `ledger` every run of the study that a source ledger finished; returns how many."""
    copied = 0
    for _ in range(2):  # tuning runs first: the values they choose decide which report runs there are
        tuning, report, _ = plan(study, ledger)
        for entry in reusable(study, tuning + report, ledger, sources).values():
            ledger.append(entry)
            copied += 1
    return copied
