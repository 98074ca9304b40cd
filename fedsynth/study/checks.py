"""A ledger's checks beyond its keys: against its runs' folders, between reuse sources, and of its `--out` folder.

The ledger's own read checks each entry's key against what it records
(fedsynth/study/ledger.py). What a key cannot show is checked here:

- **the run folder**: each entry records a digest of its run's metrics.jsonl
  (`metrics-digest`). Where the entry's run folder is on this machine, a report
  checks the file against the digest and the entry's scores against the scores
  the study computes from the file; an entry that disagrees is named and left
  out (its scores were edited, or its folder is another run's). Entries made
  before ledgers kept the digest are checked on their scores alone and counted
  as "no digest"; entries whose folder is elsewhere cannot be checked, and the
  report says how many.
- **reuse sources**: two `--reuse` ledgers that hold one key with different
  results (scores, curves, metrics digest or partition) are two different runs
  under one key, one of them edited; neither is taken (`ReuseRefused` names both).
  An entry without an effective config or provenance is not taken either.
- **the `--out` folder**: a study refuses a folder that holds another study's
  ledger (or report), so it never overwrites that study's report nor mixes its
  runs into another's ledger.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsynth.study.ledger import Ledger
from fedsynth.study.plan import read_rounds
from fedsynth.study.scores import score_run
from fedsynth.study.sharpness import SHARPNESS
from fedsynth.study.studyfile import Study

METRICS_FILE = "metrics.jsonl"
METRICS_DIGEST = "metrics-digest"
MAX_METRICS_BYTES = 64 << 20  # a run's metrics.jsonl is KBs to a few MB; a larger file at run-dir is not read
REPORT_TITLE = "# Study `"  # the first line of report.md (fedsynth/study/report.py)


def metrics_digest(folder: Path) -> str | None:
    """sha256 (16 hex digits) of the run folder's metrics.jsonl, or None when it has none."""
    path = Path(folder) / METRICS_FILE
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


def _same(a: Any, b: Any) -> bool:
    """Equal numbers (NaN equal to NaN) or equal values."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def score_differences(study: Study, entry: Mapping[str, Any], rounds: list[dict[str, Any]]) -> list[str]:
    """"METRIC/SCORE LEDGER vs FOLDER" for each score the entry records that the folder's rounds give otherwise."""
    recorded = entry.get("scores", {})
    metrics = [m for m in recorded if m != SHARPNESS and m in study.metrics]  # sharpness: its own file
    computed = score_run(rounds, metrics, last_k=study.last_k, targets=study.targets)
    found = []
    for metric in metrics:
        for name, value in recorded[metric].items():
            if name in computed.get(metric, {}) and not _same(value, computed[metric][name]):
                found.append(f"{metric}/{name} {value!r} vs {computed[metric][name]!r}")
    return found


@dataclass
class FolderCheck:
    """What a report's check of the run folders found: the ledger without the entries that disagree, and counts."""

    ledger: Ledger
    disagree: list[str] = field(default_factory=list)  # "entry KEY (cell seed S): why" of each entry left out
    checked: int = 0  # entries whose run folder was found and agreed
    no_digest: int = 0  # of those, how many record no metrics digest (made before ledgers kept one)
    elsewhere: int = 0  # entries whose run folder is not on this machine

    def lines(self) -> list[str]:
        """The report header's lines about it: the entries left out, and how many were checked. A ledger whose
        run folders are all elsewhere (a committed one) gets none, so its report is the same on every machine."""
        lines = []
        if self.disagree:
            lines.append(f"- **{len(self.disagree)} ledger entr{'y' if len(self.disagree) == 1 else 'ies'} disagree "
                         "with their run folders and are left out**: " + "; ".join(self.disagree[:5])
                         + ("; ..." if len(self.disagree) > 5 else "") + ".")
        if self.checked:
            lines.append(f"- Run folders: {self.checked} entries agree with their run folders' metrics.jsonl"
                         + (f" ({self.no_digest} on their scores alone: made before ledgers kept a metrics digest)"
                            if self.no_digest else "")
                         + (f"; {self.elsewhere} not checkable here (their run folders are not on this machine)"
                            if self.elsewhere else "") + ".")
        return lines

    def note(self) -> str | None:
        """The command's line on the entries it could not check, or None when it checked every one."""
        if not self.elsewhere:
            return None
        return (f"{self.elsewhere} ledger entr{'y' if self.elsewhere == 1 else 'ies'} not checkable against their run "
                "folders (not on this machine; entries made before ledgers kept a metrics digest are checked on "
                "their scores alone where the folder is here)")


def check_run_folders(study: Study, ledger: Ledger) -> FolderCheck:
    """Check every finished entry whose run folder is here against its metrics.jsonl (see the module's docstring)."""
    check = FolderCheck(ledger)
    bad: dict[str, str] = {}
    for key, entry in ledger.entries.items():
        if entry.get("exit-code") != 0:
            continue
        run_dir = entry.get("run-dir")
        folder = Path(run_dir) if isinstance(run_dir, str) and run_dir else None
        if folder is None or not (folder / METRICS_FILE).is_file() \
                or (folder / METRICS_FILE).stat().st_size > MAX_METRICS_BYTES:
            check.elsewhere += 1  # not here (or not a run's file): not checkable
            continue
        where = f"entry {key} ({entry.get('cell')} {entry.get('phase')} seed {entry.get('seed')})"
        recorded = entry.get(METRICS_DIGEST)
        if recorded is not None and recorded != metrics_digest(folder):
            bad[key] = (f"{where}: its run folder's {folder / METRICS_FILE} has digest {metrics_digest(folder)}, "
                        f"the entry records {recorded}")
            continue
        differ = score_differences(study, entry, read_rounds(folder))
        if differ:
            bad[key] = f"{where}: its scores differ from those of {folder / METRICS_FILE}: " + ", ".join(differ[:3])
            continue
        check.checked += 1
        check.no_digest += recorded is None
    if bad:
        kept = copy.copy(ledger)
        kept.entries = {key: entry for key, entry in ledger.entries.items() if key not in bad}
        kept.malformed = list(ledger.malformed)
        check.ledger, check.disagree = kept, list(bad.values())
    return check


def without_provenance(entry: Mapping[str, Any]) -> str | None:
    """Why an entry cannot be reused for lack of a record (effective config, provenance), or None."""
    lacks = [name for name in ("effective-config", "provenance") if not isinstance(entry.get(name), Mapping)]
    return f"records no {' and no '.join(lacks)}" if lacks else None


def result_of(entry: Mapping[str, Any], scores: Mapping[str, Any]) -> str:
    """What two entries of one key must share to be one run: its scores here, curves, rounds and digests."""
    partition = entry.get("partition")
    return json.dumps({"scores": scores, "curves": entry.get("curves"), "rounds": entry.get("rounds"),
                       METRICS_DIGEST: entry.get(METRICS_DIGEST),
                       "partition": partition.get("digest") if isinstance(partition, Mapping) else None},
                      sort_keys=True, default=str)


def disagreement_text(key: str, first: tuple[Ledger, Mapping[str, Any]], second: tuple[Ledger, Mapping[str, Any]]) -> str:
    """Two sources' entries of one key that differ, both named."""
    (one, a), (two, b) = first, second
    fields = [name for name in ("scores", "curves", "rounds", METRICS_DIGEST, "partition")
              if json.dumps(a.get(name), sort_keys=True) != json.dumps(b.get(name), sort_keys=True)]
    return (f"ledger {one.path} and ledger {two.path} both hold entry {key} ({a.get('cell')} {a.get('phase')} "
            f"seed {a.get('seed')}) with different results ({', '.join(fields) or 'scores here'}): one key is one "
            "run, so one of them was edited or ran on other code; neither is taken")


def study_of_folder(ledger: Ledger, out: Path) -> set[str]:
    """The names of the studies whose runs the folder's ledger holds; for a ledger made before entries named their
    study, the title of the folder's report.md."""
    names = {entry["study"] for entry in ledger.entries.values() if isinstance(entry.get("study"), str)}
    if names:
        return names
    report = Path(out) / "report.md"
    try:
        first = report.read_text(errors="replace").splitlines()[0] if report.is_file() else ""
    except (OSError, IndexError):
        first = ""
    if first.startswith(REPORT_TITLE) and first.endswith("`"):
        return {first[len(REPORT_TITLE):-1]}
    return set()


def other_study_in(study: Study, ledger: Ledger, out: Path) -> str | None:
    """Why `out` is not this study's folder (it holds another study's ledger or report), or None when it is."""
    others = sorted(study_of_folder(ledger, out) - {study.name})
    if not others:
        return None
    return (f"--out {out} holds the ledger of study {', '.join(others)}, not of {study.name}: running or reporting "
            f"there would mix its runs and overwrite its report.md. Give this study its own --out")


def source_disagreements(found: Mapping[str, Sequence[tuple[Ledger, Mapping[str, Any], str]]]) -> list[str]:
    """For {key: [(source, entry, its result_of)]}, the text of each key whose sources disagree."""
    texts = []
    for key, candidates in found.items():
        first = candidates[0]
        for other in candidates[1:]:
            if other[2] != first[2]:
                texts.append(disagreement_text(key, first[:2], other[:2]))
                break
    return texts
