"""`fedsynth status RESULTS_DIR`: how a run really ended, from its summary.json and metrics.jsonl.

Flower's `flwr ls` reports a run `finished:completed` when its ServerApp returned,
also when some of its rounds were skipped (fewer than `min-nodes` usable replies):
only fedsynth's own `summary.json` says `completed-with-failed-rounds`. This
command prints the run's status, why, which rounds failed, which rounds
dropped whose replies and which waited for a node to come back, and exits with the code `fedsynth run` would have
(EXIT_* in fedsynth/cli.py), so a script or an operator can act on it. It reads metrics.jsonl as
`fedsynth monitor` does (fedsynth/monitor/files.py): a round's line still being written waits for the next
look, a damaged line is skipped and counted. `outcome` is the reading of summary.json both commands share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsynth.monitor.files import JsonLines, parse_json_lines
from fedsynth.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_FAILED_ROUNDS, EXIT_OK
from server_app.outcome import STATUS_FAILED, STATUS_FAILED_ROUNDS, STATUS_OK, failed_rounds

# besides `fedsynth run`'s codes (an interrupted run is EXIT_FAILED here: it stopped before its last round)
EXIT_NO_RUN = EXIT_BAD_INPUT  # no run's results folder at that path
EXIT_NOT_FINISHED = 4         # no summary.json yet: the run is still running, or its process was killed


def site_names(rows: Any) -> dict[Any, str]:
    """Node id -> how results name the node (a nodes.json's rows: its `name`, else its partition)."""
    if not isinstance(rows, list):
        return {}
    return {row.get("node-id"): row.get("name") or f"partition-{row.get('partition-id')}"
            for row in rows if isinstance(row, dict)}


def _site_names(folder: Path) -> dict[Any, str]:
    """site_names of the folder's nodes.json, where it has one."""
    path = folder / "nodes.json"
    return site_names(json.loads(path.read_text())) if path.is_file() else {}


def node_name(names: dict[Any, str], record: dict[str, Any]) -> str:
    """A failure's or a wait's node as results name it: its site name, else `partition-<p>`, else `node <id>`."""
    node, partition = record.get("node"), record.get("partition")
    if node in names:
        return names[node]
    return f"partition-{partition}" if isinstance(partition, int) else f"node {node}"


def dropped_lines(rounds: list[dict[str, Any]], names: dict[Any, str]) -> list[str]:
    """'round R: who: reason' for each round whose record lists dropped replies."""
    lines = []
    for record in rounds:
        failures = record.get("failures") or []
        if isinstance(record.get("round"), int) and isinstance(failures, list) and failures:
            who = "; ".join(f"{node_name(names, f)}: {f.get('reason')}"
                            for f in failures if isinstance(f, dict))
            lines.append(f"round {record['round']}: {who}")
    return lines


def wait_lines(rounds: list[dict[str, Any]], names: dict[Any, str]) -> list[str]:
    """'round R: who: N s, outcome' for each wait of a round for a node the SuperLink reported unavailable."""
    lines = []
    for record in rounds:
        waits = record.get("node-returns") or []
        if isinstance(record.get("round"), int) and isinstance(waits, list) and waits:
            who = "; ".join(f"{node_name(names, w)}: {w.get('waited')} s, "
                            f"{w.get('outcome')}" for w in waits if isinstance(w, dict))
            lines.append(f"round {record['round']}: {who}")
    return lines


def trained_rounds(rounds: list[dict[str, Any]]) -> list[int]:
    """The training rounds recorded (not round 0, not a phase such as FedDDPM's warm-up)."""
    return [r["round"] for r in rounds if isinstance(r.get("round"), int) and r["round"] >= 1
            and r.get("phase") is None]


@dataclass(frozen=True)
class Outcome:
    """How a run ended, as its summary.json says: `fedsynth run`'s exit code, the status and its reason.

    `status` is summary.json's (`ok`, `completed-with-failed-rounds`, `failed`, `interrupted`), or
    `not-finished` (no summary yet) or `not-a-summary` (a damaged or replaced summary.json, `reason` says how).
    """

    code: int
    status: str
    reason: str
    failed_rounds: tuple[int, ...] = ()


NOT_FINISHED = "not-finished"
NOT_A_SUMMARY = "not-a-summary"


def outcome(summary: Any, rounds: list[dict[str, Any]]) -> Outcome:
    """The outcome of a run from its parsed summary.json (None: there is none; a str: why it could not be read)."""
    if summary is None:
        return Outcome(EXIT_NOT_FINISHED, NOT_FINISHED, "no summary.json yet")
    if not isinstance(summary, dict):  # a summary is written atomically: this one was damaged or replaced
        return Outcome(EXIT_NO_RUN, NOT_A_SUMMARY, summary if isinstance(summary, str) else type(summary).__name__)
    status = str(summary.get("status", STATUS_OK))
    code = {STATUS_OK: EXIT_OK, STATUS_FAILED_ROUNDS: EXIT_FAILED_ROUNDS, STATUS_FAILED: EXIT_FAILED}
    return Outcome(code.get(status, EXIT_FAILED), status, str(summary.get("status-reason", "")),
                   tuple(failed_rounds(rounds)))


def run_status(folder: Path) -> tuple[int, list[str]]:
    """(exit code, lines to print) for the run whose results are in `folder`."""
    summary_path, metrics_path = folder / "summary.json", folder / "metrics.jsonl"
    if not folder.is_dir() or not (summary_path.is_file() or metrics_path.is_file()):
        return EXIT_NO_RUN, [f"fedsynth status: {folder} is not a run's results folder (no summary.json or "
                             "metrics.jsonl; the path is printed as 'results folder: ...' when a run starts)"]
    metrics = parse_json_lines(metrics_path.read_bytes()) if metrics_path.is_file() else JsonLines()
    rounds = metrics.records
    trained = trained_rounds(rounds)
    summary: Any = None
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            summary = f"{type(err).__name__}: {err}"
    end = outcome(summary, rounds)
    if end.status == NOT_FINISHED:
        return end.code, [f"status: not finished (no summary.json yet; last round recorded: "
                          f"{max(trained, default=0)}): the run is still running, or its process was "
                          "killed (resume it with resume=true)"]
    if end.status == NOT_A_SUMMARY:
        return end.code, [f"fedsynth status: {summary_path} is not a run summary (a JSON object): {end.reason}"]
    lines = [f"status: {end.status}" + (f" ({end.reason})" if end.reason else ""), f"rounds recorded: {len(trained)}"]
    if end.failed_rounds or end.status == STATUS_FAILED_ROUNDS:
        lines.append("failed rounds (fewer than min-nodes usable replies): "
                     f"{', '.join(map(str, end.failed_rounds)) or '?'}")
    names = _site_names(folder)
    lines += [f"dropped replies: {line}" for line in dropped_lines(rounds, names)]
    lines += [f"waited for a node to come back: {line}" for line in wait_lines(rounds, names)]
    if metrics.malformed:
        lines.append(f"metrics.jsonl: {metrics.malformed} malformed line(s) skipped")
    for key in ("final-central-accuracy", "final-local-test-accuracy", "final-fid"):
        if key in summary:
            lines.append(f"{key}: {summary[key]}")
    return end.code, lines
