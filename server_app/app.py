"""The ServerApp: validate the run config, learn the nodes, run the algorithm, write results."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from common.config import parse_run_config
from common.results import RunResults
from server_app.handshake import run_handshake
from server_app.registry import SERVER_STRATEGIES

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of a run, in simulation and in deployment alike."""
    cfg = parse_run_config(context.run_config, SERVER_STRATEGIES)
    nodes, failures = run_handshake(grid, cfg)
    strategy = SERVER_STRATEGIES[cfg.algorithm](cfg, nodes)
    with RunResults(cfg) as results:
        results.handshake_failures = failures
        strategy.run(grid, results)
