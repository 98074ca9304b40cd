"""The monitor's `/metrics`: the runs and studies under its root in Prometheus' text format (prometheus-client).

Names follow Prometheus' conventions (https://prometheus.io/docs/practices/naming/): prefix `fedsynth_`, base
units (`_seconds`, `_bytes`), `_total` for counters (a resumed run re-runs the rounds after its checkpoint, so a
counter can go down: Prometheus reads that as a counter reset). Labels: `run` (the run folder, relative to the
monitor's root), `node` (as results name it), `reason` (a dropped reply's kind: the words before its first `:`
or `(`, so the label's values stay few; the page shows the whole reason). Each round's model metrics
(`central-accuracy`, `train-loss`, `fid`, ...) are `fedsynth_round_<key>` gauges of their latest value (keys that
name one metric, `train-loss` and Flower's `train_loss`, give one; a key that would name a metric above, none).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

STATES = ("running", "completed", "completed with failed rounds", "failed", "stopped", "unknown")


def metric_name(key: str) -> str:
    """`fedsynth_round_<key>` with every character outside [a-zA-Z0-9_] an underscore: central-accuracy -> ..._central_accuracy."""
    return "fedsynth_round_" + re.sub(r"[^a-zA-Z0-9_]", "_", key).lower()


def reason_kind(reason: str) -> str:
    """The kind of a dropped reply's reason: `error: injected failure` -> `error`, `timeout` -> `timeout`."""
    return re.split(r"[:(]", reason, maxsplit=1)[0].strip()[:60] or "unknown"


class MonitorCollector(Collector):
    """Collects the metrics of the views `views()` returns at each scrape (fedsynth/monitor/views.py)."""

    def __init__(self, views: Callable[[], list[dict[str, Any]]]) -> None:
        self.views = views

    def collect(self) -> Iterator[Metric]:
        views = self.views()
        runs = [v for v in views if v["kind"] == "run"]
        studies = [v for v in views if v["kind"] == "study"]
        yield from run_metrics(runs)
        yield from study_metrics(studies)


RUN, NODE = ("run",), ("run", "node")
# key: (family, name, help, labels) of each run metric but the per-key `fedsynth_round_<key>` gauges
RUN_FAMILIES: dict[str, tuple[type, str, str, tuple[str, ...]]] = {
    "state": (GaugeMetricFamily, "fedsynth_run_state", "1 for the run's current state (running, completed, "
              "completed with failed rounds, failed, stopped, unknown), 0 for the others", ("run", "state")),
    "last": (GaugeMetricFamily, "fedsynth_run_last_round", "the last training round recorded in metrics.jsonl", RUN),
    "planned": (GaugeMetricFamily, "fedsynth_run_planned_rounds", "num-server-rounds of the run's config", RUN),
    "failed": (CounterMetricFamily, "fedsynth_run_failed_rounds", "rounds with fewer than min-nodes usable replies",
               RUN),
    "up": (CounterMetricFamily, "fedsynth_run_uplink_bytes", "bytes of the replies' records, all rounds", RUN),
    "down": (CounterMetricFamily, "fedsynth_run_downlink_bytes", "bytes of the sent messages' records, all rounds",
             RUN),
    "duration": (SummaryMetricFamily, "fedsynth_round_duration_seconds", "seconds of each training round", RUN),
    "last-duration": (GaugeMetricFamily, "fedsynth_last_round_duration_seconds", "seconds of the last round", RUN),
    "skipped": (CounterMetricFamily, "fedsynth_monitor_malformed_lines", "lines of metrics.jsonl the monitor skipped "
                "as malformed", RUN),
    "answered": (CounterMetricFamily, "fedsynth_node_answered_replies", "rounds whose reply of the node was used",
                 NODE),
    "dropped": (CounterMetricFamily, "fedsynth_node_dropped_replies", "replies of the node left out, by the kind of "
                "their reason", ("run", "node", "reason")),
    "online": (GaugeMetricFamily, "fedsynth_node_answered_last_round", "1 when the node answered the latest round",
               NODE),
    "examples": (GaugeMetricFamily, "fedsynth_node_train_examples", "the node's training examples (handshake)", NODE),
}


def run_metrics(runs: list[dict[str, Any]]) -> Iterator[Metric]:
    """The metric families of the runs' views."""
    families = {key: kind(name, doc, labels=list(labels)) for key, (kind, name, doc, labels) in RUN_FAMILIES.items()}
    reserved = {family.name for family in families.values()}
    latest: dict[str, GaugeMetricFamily] = {}
    for run in runs:
        rid = run["id"]
        for name in STATES:
            families["state"].add_metric([rid, name], 1.0 if run["state"] == name else 0.0)
        families["last"].add_metric([rid], run["last-round"])
        if run["planned-rounds"] is not None:
            families["planned"].add_metric([rid], run["planned-rounds"])
        trained = [r for r in run["rounds"] if r["round"] >= 1]
        families["failed"].add_metric([rid], sum(1 for r in trained if r["skipped"]))
        families["up"].add_metric([rid], sum(r["uplink-bytes"] or 0 for r in trained))
        families["down"].add_metric([rid], sum(r["downlink-bytes"] or 0 for r in trained))
        times = [r["round-time"] for r in trained if r["round-time"] is not None]
        families["duration"].add_metric([rid], count_value=len(times), sum_value=sum(times))
        if times:
            families["last-duration"].add_metric([rid], times[-1])
        families["skipped"].add_metric([rid], run["skipped-lines"])
        for node in run["nodes"]:
            families["answered"].add_metric([rid, node["name"]], node["answered-rounds"])
            kinds: dict[str, int] = {}
            for drop in node["dropped"]:
                kinds[reason_kind(drop["reason"])] = kinds.get(reason_kind(drop["reason"]), 0) + 1
            for kind, count in sorted(kinds.items()):
                families["dropped"].add_metric([rid, node["name"], kind], count)
            families["online"].add_metric([rid, node["name"]], 1.0 if node["online"] else 0.0)
            if node["examples"] is not None:
                families["examples"].add_metric([rid, node["name"]], node["examples"])
        values: dict[str, float] = {}
        for row in run["rounds"]:
            values.update(row["metrics"])  # each key's latest value (central-accuracy: every eval-every rounds)
        named: dict[str, float] = {}  # `train-loss` and Flower's `train_loss` are one name: the first key wins
        for key, value in sorted(values.items()):
            if metric_name(key) not in reserved:
                named.setdefault(metric_name(key), value)
        for name, value in named.items():
            family = latest.setdefault(name, GaugeMetricFamily(name, "the latest value of its key in metrics.jsonl",
                                                               labels=["run"]))
            family.add_metric([rid], value)
    yield from (*families.values(), *latest.values())


def study_metrics(studies: list[dict[str, Any]]) -> Iterator[Metric]:
    """The metric families of the studies' views: runs finished and failed per arm, runs under way."""
    finished = CounterMetricFamily("fedsynth_study_finished_runs", "runs of the arm in the study's ledger",
                                   labels=["study", "arm"])
    failed = CounterMetricFamily("fedsynth_study_failed_runs", "runs of the arm that failed (their ledger entry)",
                                 labels=["study", "arm"])
    under_way = GaugeMetricFamily("fedsynth_study_runs_under_way", "runs claimed by a study process now",
                                  labels=["study"])
    for study in studies:
        for arm in study["arms"]:
            finished.add_metric([study["id"], arm["arm"]], arm["finished"])
            failed.add_metric([study["id"], arm["arm"]], arm["failed"])
        under_way.add_metric([study["id"]], study["runs-under-way"])
    yield from (finished, failed, under_way)
