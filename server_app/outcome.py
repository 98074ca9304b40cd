"""How a run ended, so that a failed run fails: ok, completed with failed rounds, or failed.

A run that never aggregated a round, or whose final global model holds a NaN or
an infinity, has produced nothing worth keeping: it is `failed`, its summary
says why, no model file is written and the ServerApp raises `RunFailed` (so
`fedsynth run` exits 1 and `flwr run` shows the run as failed). A run that
finished but skipped some rounds (fewer than `min-nodes` usable replies) is
`completed-with-failed-rounds`: its results are written and `fedsynth run`
exits 3. Everything else is `ok` (exit 0). docs/reliability.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STATUS_OK = "ok"
STATUS_FAILED_ROUNDS = "completed-with-failed-rounds"
STATUS_FAILED = "failed"


class RunFailed(RuntimeError):
    """The run produced no usable model (never aggregated, or a non-finite final model)."""


def non_finite_arrays(weights: Mapping[str, np.ndarray]) -> list[str]:
    """Names of the arrays holding a NaN or an infinity."""
    return [name for name, value in weights.items() if not np.all(np.isfinite(value))]


def _trained(rounds: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rounds if isinstance(r.get("round"), int) and r["round"] >= 1 and r.get("phase") is None]


def _failed(record: Mapping[str, Any]) -> bool:
    """A round below min-nodes: `skipped` (centralized, model unchanged) or `below-min-nodes` (decentralized)."""
    return bool(record.get("skipped") or record.get("below-min-nodes"))


def failed_rounds(rounds: Sequence[Mapping[str, Any]]) -> list[int]:
    """The rounds that failed (fewer than min-nodes usable replies), in order."""
    return [r["round"] for r in _trained(rounds) if _failed(r)]


def run_outcome(rounds: Sequence[Mapping[str, Any]], weights: Mapping[str, np.ndarray]) -> tuple[str, str]:
    """(status, one-line reason) of a run from its round records and its final model."""
    trained = _trained(rounds)
    skipped = failed_rounds(rounds)
    bad = non_finite_arrays(weights)
    if bad:
        return STATUS_FAILED, (f"the final global model is not finite (NaN or inf in {len(bad)} array(s), e.g. "
                               f"'{bad[0]}'); lower lr or server-lr")
    if trained and len(skipped) == len(trained):
        return STATUS_FAILED, (f"no round was aggregated: in all {len(trained)} round(s) fewer than min-nodes nodes "
                               "sent a usable reply (see 'failures' in metrics.jsonl)")
    if skipped:
        return STATUS_FAILED_ROUNDS, (f"{len(skipped)} of {len(trained)} round(s) failed (fewer than min-nodes usable "
                                      f"replies): rounds {skipped[:10]}")
    return STATUS_OK, ""


def status_fields(status: str, reason: str, rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What summary.json records about the outcome."""
    trained = _trained(rounds)
    return {
        "status": status,
        "status-reason": reason,
        "failed-rounds": sum(1 for r in trained if _failed(r)),
        "rounds-with-dropped-replies": sum(1 for r in trained if r.get("failed")),
    }


def conclude(summary: dict[str, Any], results: Any, weights: Mapping[str, np.ndarray]) -> None:
    """Add the outcome to `summary`; a failed run writes it (no model file: nothing worth keeping) and raises RunFailed."""
    status, reason = run_outcome(results.rounds, weights)
    summary.update(status_fields(status, reason, results.rounds))
    summary["handshake-failures"] = list(getattr(results, "handshake_failures", []))
    summary["results-dir"] = str(results.path)
    if status == STATUS_FAILED:
        results.write_summary(summary)
        raise RunFailed(reason)
