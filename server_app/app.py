"""The ServerApp: validate the run config, learn the nodes, run the algorithm, write results."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from common.imports import server_imports, site_imports
from common.run.config import RunConfig, parse_run_config
from common.run.interrupt import RunInterrupted
from common.run.results import RunResults
from server_app.handshake import HandshakeError, handshake_outcome, joined_nodes
from server_app.wire import is_transient
from server_app.messaging import polling_grid
from server_app.recorder import RunRecorder
from server_app.decentralized_report import warn_if_ole_diverges
from server_app.registry import SERVER_STRATEGIES, build_strategy, strategy_class, train_config
from server_app.strategies.base import RoundStrategy, TooManyFailedRounds

app = ServerApp()


def serve(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """Handshake, strategy, Flower's `Strategy.start()`, results; returns the summary.

    The results folder is opened first, so that a run refused at the handshake (a site's bad
    data) still leaves a summary.json with status "failed" and the nodes' reasons. The strategy
    runs through the same `start()` a Flower developer calls, with fedsynth's results,
    checkpoints and progress lines as its `evaluate_fn` (server_app/recorder.py) and a grid
    that notices replies within `reply-poll-interval` (server_app/messaging.py).
    """
    strategy_class(cfg.algorithm)  # a plugin's class must be fedsynth's: refused before the nodes are asked
    with RunResults(cfg) as results:
        try:
            nodes, failures = handshake_outcome(grid, cfg)
        except HandshakeError as err:
            if not results.resuming:  # each lost node and its reason, for the operator
                results.write_summary({"status": "failed", "status-reason": f"handshake: {err}",
                                       "handshake-failures": err.failures, "results-dir": str(results.path)})
            raise
        results.handshake_failures = failures
        if not results.resuming:  # a resume keeps the folder as it was until its checkpoint is checked
            results.write_nodes(nodes)
        strategy = build_strategy(cfg, nodes)
        warn_if_ole_diverges(cfg, len(nodes))
        table = strategy.node_table
        table.rejoin = partial(joined_nodes, cfg=cfg)  # a site that restarts under a new id, or joins late
        # a node refused at the handshake for what it claimed stays refused; one that was lost (an error, a
        # timeout) may still join late
        table.refuse(int(f["node"]) for f in failures
                     if isinstance(f.get("node"), int) and not is_transient(str(f.get("reason", ""))))
        return run_strategy(grid, cfg, strategy, results)


def run_strategy(grid: Grid, cfg: RunConfig, strategy: RoundStrategy, results: RunResults) -> dict[str, Any]:
    """`strategy.start()` with the run's recorder as its evaluate_fn, then the final evaluation and summary."""
    grid = polling_grid(grid, cfg.reply_poll_interval, cfg.node_return_wait)
    recorder = RunRecorder(cfg, strategy, results, grid)
    initial_arrays = recorder.initial_arrays()
    try:
        result = strategy.start(grid, initial_arrays, num_rounds=cfg.num_server_rounds, timeout=cfg.round_timeout,
                                train_config=ConfigRecord(train_config(cfg)), evaluate_fn=recorder)
    except RunInterrupted:
        recorder.on_interrupt()
        raise
    except TooManyFailedRounds:
        recorder.on_failed_round()
        raise
    return recorder.finish(grid, result)


def serve_run_config(grid: Grid, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a run config and serve it, every import path it names resolved as this ServerApp's host permits
    (common/imports.py: fedsynth's own packages, the run's Flower app, `FEDSYNTH_ALLOWED_IMPORTS`)."""
    with site_imports(server_imports()):
        return serve(grid, parse_run_config(run_config, SERVER_STRATEGIES))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of a run, in simulation and in deployment alike."""
    serve_run_config(grid, context.run_config)
