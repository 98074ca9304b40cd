"""The ServerApp: validate the run config, learn the nodes, run the algorithm, write results."""

from __future__ import annotations

from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from common.config import RunConfig, parse_run_config
from common.results import RunResults
from server_app.handshake import HandshakeError, handshake_outcome
from server_app.registry import SERVER_STRATEGIES

app = ServerApp()


def serve(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """Handshake, strategy, rounds; returns the summary.

    The results folder is opened first, so that a run refused at the handshake (a site's bad
    data) still leaves a summary.json with status "failed" and the nodes' reasons.
    """
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
        strategy = SERVER_STRATEGIES[cfg.algorithm](cfg, nodes)
        return strategy.run(grid, results)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of a run, in simulation and in deployment alike."""
    serve(grid, parse_run_config(context.run_config, SERVER_STRATEGIES))
