"""What the monitor shows of a run or a study, computed from the files it already wrote (fedsynth/monitor/files.py).

A run's status is `fedsynth status`'s reading of its summary.json (fedsynth/status.py `outcome`), with one
more fact a monitor beside a live run can see: whether a process holds the run's folder lock (then it is
running, also when a resumed run's old summary.json is still there). Five states, each with its reason:
running, completed, completed with failed rounds, failed, stopped (interrupted, or killed without a summary).

Per node it shows what metrics.jsonl and nodes.json say: the handshake's nodes (nodes.json) and any node that
first appears in a later round (it joined late, in that round), the rounds it answered, its dropped replies
with their reasons, and whether it answered the latest round; a node whose latest appearance is a dropped reply,
or that was not in a latest round that asked every known node, is away since then.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fedsynth.monitor.files import FolderReader, JsonLines, Unreadable
from fedsynth.status import (NOT_A_SUMMARY, NOT_FINISHED, dropped_lines, node_name, outcome, site_names,
                             trained_rounds, wait_lines)
from server_app.outcome import STATUS_FAILED, STATUS_FAILED_ROUNDS, STATUS_OK

RUNNING, COMPLETED, COMPLETED_FAILED_ROUNDS, FAILED, STOPPED, UNKNOWN = (
    "running", "completed", "completed with failed rounds", "failed", "stopped", "unknown")
_LABELS = {STATUS_OK: COMPLETED, STATUS_FAILED_ROUNDS: COMPLETED_FAILED_ROUNDS, STATUS_FAILED: FAILED,
           "interrupted": STOPPED}
# a round record's keys that are not metrics of the model (they have their own columns and Prometheus metrics)
ROUND_KEYS = frozenset({"round", "sampled", "answered", "answered-nodes", "failed", "failures", "node-returns",
                        "uplink-bytes", "downlink-bytes", "uplink-float32-bytes", "round-time", "server-time",
                        "phase", "skipped", "below-min-nodes"})


def run_state(summary: Any, rounds: list[dict[str, Any]], lock_held: bool | None,
              planned: int | None) -> tuple[str, str]:
    """(state, reason) of a run: one of the five states above, or `unknown` with why."""
    last = max(trained_rounds(rounds), default=0)
    if lock_held:
        return RUNNING, f"round {last} of {planned if planned else '?'} recorded"
    if isinstance(summary, Unreadable):
        summary = str(summary)
    end = outcome(summary, rounds)
    if end.status == NOT_FINISHED:
        if lock_held is None:
            return UNKNOWN, (f"no summary.json yet, last round recorded {last}: running, or its process was killed "
                             "(this host cannot tell)")
        return STOPPED, (f"no summary.json and no process holds the folder: the run was killed after round {last}; "
                         "resume it with resume=true")
    if end.status == NOT_A_SUMMARY:
        return UNKNOWN, f"summary.json is not a run summary: {end.reason}"
    return _LABELS.get(end.status, end.status), end.reason


def _number(value: Any) -> float | None:
    """A finite number of a record, else None (JSON allows NaN and Infinity, the page and Prometheus skip them)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int of 400 digits
            return None
        return number if math.isfinite(number) else None
    return None


MAX_ROUND = 10**9  # a record whose round is not an int in [0, MAX_ROUND] is left out as malformed


def sane_records(lines: JsonLines) -> tuple[list[dict[str, Any]], int]:
    """The records whose `round` is an int in [0, MAX_ROUND], and how many others there were."""
    good = [r for r in lines.records if type(r.get("round")) is int and 0 <= r["round"] <= MAX_ROUND]
    return good, lines.malformed + len(lines.records) - len(good)


def round_rows(records: list[dict[str, Any]], names: dict[Any, str]) -> list[dict[str, Any]]:
    """One row per recorded round (phases left out; a round recorded twice: its last record), in round order."""
    by_round: dict[int, dict[str, Any]] = {}
    for record in records:
        number = record.get("round")
        if not isinstance(number, int) or isinstance(number, bool) or record.get("phase") is not None:
            continue
        failures = record.get("failures") if isinstance(record.get("failures"), list) else []
        by_round[number] = {
            "round": number,
            "sampled": _number(record.get("sampled")),
            "answered": _number(record.get("answered")),
            "failed": _number(record.get("failed")),
            "skipped": bool(record.get("skipped") or record.get("below-min-nodes")),
            "dropped": [{"node": node_name(names, f), "reason": str(f.get("reason"))}
                        for f in failures if isinstance(f, dict)],
            "uplink-bytes": _number(record.get("uplink-bytes")),
            "downlink-bytes": _number(record.get("downlink-bytes")),
            "round-time": _number(record.get("round-time")),
            "metrics": {str(k): float(v) for k, v in record.items()
                        if k not in ROUND_KEYS and _number(v) is not None},
        }
    return [by_round[r] for r in sorted(by_round)]


def node_rows(nodes: Any, records: list[dict[str, Any]], names: dict[Any, str]) -> list[dict[str, Any]]:
    """Per node: name, examples, the rounds it answered, its dropped replies, when it joined late or went away."""
    rows: dict[str, dict[str, Any]] = {}
    for row in nodes if isinstance(nodes, list) else []:
        if isinstance(row, dict):
            name = str(row.get("name") or f"partition-{row.get('partition-id')}")
            rows[name] = {"name": name, "examples": _number(row.get("num-train-examples")), "joined": None}
    rounds = round_rows(records, names)
    trained = [r for r in rounds if r["round"] >= 1]
    seen: dict[str, list[tuple[int, str]]] = {}  # name -> [(round, "answered" | reason)]
    for record in records:
        number = record.get("round")
        if not isinstance(number, int) or number < 1 or record.get("phase") is not None:
            continue
        answered = record.get("answered-nodes") if isinstance(record.get("answered-nodes"), list) else []
        for name in answered:
            seen.setdefault(str(name), []).append((number, "answered"))
        for failure in record.get("failures") if isinstance(record.get("failures"), list) else []:
            if isinstance(failure, dict):
                seen.setdefault(node_name(names, failure), []).append((number, str(failure.get("reason"))))
    handshake = isinstance(nodes, list)  # without nodes.json (the handshake not done yet) no node joined "late"
    for name, events in seen.items():
        if name not in rows:
            rows[name] = {"name": name, "examples": None, "joined": min(r for r, _ in events) if handshake else None}
    latest = trained[-1] if trained else None
    for name, row in rows.items():
        events = sorted(seen.get(name, []), key=lambda e: e[0])
        answered_rounds = [r for r, what in events if what == "answered"]
        drops = [{"round": r, "reason": what} for r, what in events if what != "answered"]
        online = latest is not None and (latest["round"], "answered") in events
        away = None
        if latest is not None and not online and events:
            last_round, last_what = events[-1]
            if last_what != "answered":
                away = last_round
            elif (latest["sampled"] or 0) >= len(rows):  # the latest round asked every known node; this one was gone
                away = last_round + 1
        row.update({"answered-rounds": len(answered_rounds), "last-answered": max(answered_rounds, default=None),
                    "dropped": drops, "online": online, "away-since": away})
    return list(rows.values())


def run_view(reader: FolderReader, rel: str) -> dict[str, Any]:
    """Everything the page and /metrics show of the run in `rel` (relative to the monitor's root)."""
    prefix = "" if rel == "." else rel + "/"
    config = reader.json(prefix + "config.json")
    config = config if isinstance(config, dict) else {}
    metrics: JsonLines = reader.json_lines(prefix + "metrics.jsonl")
    records, malformed = sane_records(metrics)
    nodes = reader.json(prefix + "nodes.json")
    names = site_names(nodes)
    planned = config.get("num-server-rounds")
    planned = planned if type(planned) is int and 0 <= planned <= MAX_ROUND else None
    state, reason = run_state(reader.json(prefix + "summary.json"), records, reader.lock_held(rel), planned)
    rounds = round_rows(records, names)
    events = [f"dropped replies: {line}" for line in dropped_lines(records, names)]
    events += [f"waited for a node to come back: {line}" for line in wait_lines(records, names)]
    events += [f"round {r['round']}: failed (fewer than min-nodes usable replies)" for r in rounds if r["skipped"]]
    node_list = node_rows(nodes, records, names)
    events += [f"round {n['joined']}: {n['name']} joined late" for n in node_list if n["joined"]]
    events += [f"round {n['away-since']}: {n['name']} away since this round ("
               + (f"last answered round {n['last-answered']})" if n["last-answered"] else "never answered)")
               for n in node_list if n["away-since"]]
    return {
        "id": rel, "kind": "run", "state": state, "reason": reason,
        "algorithm": str(config.get("algorithm", "")), "dataset": str(config.get("dataset", "")),
        "planned-rounds": planned, "last-round": max(trained_rounds(records), default=0),
        "rounds": rounds, "nodes": node_list, "events": sorted(events, key=_event_order),
        "skipped-lines": malformed, "partial-line": metrics.partial, "truncated": metrics.truncated,
    }


def _event_order(line: str) -> tuple[int, str]:
    match = re.search(r"round (\d+)", line)
    return (int(match.group(1)) if match else 0, line)


_FINISHED = re.compile(r"(\d+) of (\d+) runs finished")


def report_claims(report: str) -> list[dict[str, str]]:
    """The rows of report.md's claims table (fedsynth/study/report.py writes it): claim, variant, ..., verdict."""
    lines = report.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("| claim |"))
    except StopIteration:
        return []
    header = [cell.strip() for cell in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells)))
    return rows


def study_view(reader: FolderReader, rel: str) -> dict[str, Any]:
    """A study's arms' progress (its ledger and claims/) and, once report.md exists, its claims with intervals."""
    prefix = "" if rel == "." else rel + "/"
    ledger = reader.json_lines(prefix + "ledger.jsonl")
    latest: dict[str, dict[str, Any]] = {}
    for entry in ledger.records:
        if isinstance(entry.get("key"), str):
            latest[entry["key"]] = entry  # the last entry of a key wins, as the ledger reads itself
    arms: dict[str, dict[str, Any]] = {}
    for entry in latest.values():
        cell = str(entry.get("cell") or entry.get("arm") or "?")
        arm = arms.setdefault(cell, {"arm": cell, "finished": 0, "failed": 0, "seeds": []})
        ok = entry.get("exit-code") in (0, 3)
        arm["finished" if ok else "failed"] += 1
        if ok and entry.get("phase") == "report" and isinstance(entry.get("seed"), int):
            arm["seeds"] = sorted({*arm["seeds"], entry["seed"]})
    report = reader.text(prefix + "report.md")
    finished = _FINISHED.search(report or "")
    return {
        "id": rel, "kind": "study", "runs-finished": sum(a["finished"] for a in arms.values()),
        "runs-failed": sum(a["failed"] for a in arms.values()),
        "runs-under-way": sum(1 for name in reader.names(prefix + "claims") if name.endswith(".claim")),
        "runs-planned": int(finished.group(2)) if finished else None,
        "arms": [arms[k] for k in sorted(arms)], "report": report is not None,
        "claims": report_claims(report) if report else [], "skipped-lines": ledger.malformed,
    }
