"""`fedsynth status RESULTS_DIR`: how a run really ended, from its summary.json and metrics.jsonl.

Flower's `flwr ls` reports a run `finished:completed` when its ServerApp returned,
also when some of its rounds were skipped (fewer than `min-nodes` usable replies):
only fedsynth's own `summary.json` says `completed-with-failed-rounds`. This
command prints the run's status, why, which rounds failed, which rounds
dropped whose replies and which waited for a node to come back, and exits with the code `fedsynth run` would have
(EXIT_* in fedsynth/cli.py), so a script or an operator can act on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.run.results import read_metrics
from fedsynth.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_FAILED_ROUNDS, EXIT_OK
from server_app.outcome import STATUS_FAILED, STATUS_FAILED_ROUNDS, STATUS_OK, failed_rounds

# besides `fedsynth run`'s codes (an interrupted run is EXIT_FAILED here: it stopped before its last round)
EXIT_NO_RUN = EXIT_BAD_INPUT  # no run's results folder at that path
EXIT_NOT_FINISHED = 4         # no summary.json yet: the run is still running, or its process was killed


def _site_names(folder: Path) -> dict[Any, str]:
    """Node id -> how results name the node (nodes.json: its `name`, else its partition), where known."""
    path = folder / "nodes.json"
    if not path.is_file():
        return {}
    return {row.get("node-id"): row.get("name") or f"partition-{row.get('partition-id')}"
            for row in json.loads(path.read_text()) if isinstance(row, dict)}


def _dropped(rounds: list[dict[str, Any]], names: dict[Any, str]) -> list[str]:
    """'round R: who: reason' for each round whose record lists dropped replies."""
    lines = []
    for record in rounds:
        failures = record.get("failures") or []
        if isinstance(record.get("round"), int) and failures:
            who = "; ".join(f"{names.get(f.get('node'), 'node ' + str(f.get('node')))}: {f.get('reason')}"
                            for f in failures if isinstance(f, dict))
            lines.append(f"round {record['round']}: {who}")
    return lines


def _waits(rounds: list[dict[str, Any]], names: dict[Any, str]) -> list[str]:
    """'round R: who: N s, outcome' for each wait of a round for a node the SuperLink reported unavailable."""
    lines = []
    for record in rounds:
        waits = record.get("node-returns") or []
        if isinstance(record.get("round"), int) and waits:
            who = "; ".join(f"{names.get(w.get('node'), 'node ' + str(w.get('node')))}: {w.get('waited')} s, "
                            f"{w.get('outcome')}" for w in waits if isinstance(w, dict))
            lines.append(f"round {record['round']}: {who}")
    return lines


def run_status(folder: Path) -> tuple[int, list[str]]:
    """(exit code, lines to print) for the run whose results are in `folder`."""
    summary_path, metrics_path = folder / "summary.json", folder / "metrics.jsonl"
    if not folder.is_dir() or not (summary_path.is_file() or metrics_path.is_file()):
        return EXIT_NO_RUN, [f"fedsynth status: {folder} is not a run's results folder (no summary.json or "
                             "metrics.jsonl; the path is printed as 'results folder: ...' when a run starts)"]
    rounds = read_metrics(metrics_path) if metrics_path.is_file() else []
    trained = [r["round"] for r in rounds if isinstance(r.get("round"), int) and r["round"] >= 1
               and r.get("phase") is None]
    if not summary_path.is_file():
        return EXIT_NOT_FINISHED, [f"status: not finished (no summary.json yet; last round recorded: "
                                   f"{max(trained, default=0)}): the run is still running, or its process was "
                                   "killed (resume it with resume=true)"]
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        summary = f"{type(err).__name__}: {err}"
    if not isinstance(summary, dict):  # a summary is written atomically: this one was damaged or replaced
        return EXIT_NO_RUN, [f"fedsynth status: {summary_path} is not a run summary (a JSON object): "
                             f"{summary if isinstance(summary, str) else type(summary).__name__}"]
    status = str(summary.get("status", STATUS_OK))
    reason = str(summary.get("status-reason", ""))
    lines = [f"status: {status}" + (f" ({reason})" if reason else ""), f"rounds recorded: {len(trained)}"]
    failed = failed_rounds(rounds)
    if failed or status == STATUS_FAILED_ROUNDS:
        lines.append(f"failed rounds (fewer than min-nodes usable replies): {', '.join(map(str, failed)) or '?'}")
    names = _site_names(folder)
    lines += [f"dropped replies: {line}" for line in _dropped(rounds, names)]
    lines += [f"waited for a node to come back: {line}" for line in _waits(rounds, names)]
    for key in ("final-central-accuracy", "final-local-test-accuracy", "final-fid"):
        if key in summary:
            lines.append(f"{key}: {summary[key]}")
    code = {STATUS_OK: EXIT_OK, STATUS_FAILED_ROUNDS: EXIT_FAILED_ROUNDS, STATUS_FAILED: EXIT_FAILED}
    return code.get(status, EXIT_FAILED), lines
