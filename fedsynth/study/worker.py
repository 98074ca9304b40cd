"""One study run in a process of its own: `python -m fedsynth.study.worker '<job as JSON>'`.

The job names the app directory, the run's overrides and the simulation's
resources; the run goes through `fedsynth.cli.run_command`, the path of
`fedsynth run` (on the Ray cluster the job names, if any, or on the in-process grid with engine
"inprocess"), and the process exits with its codes (0 ok,
1 failed, 2 refused, 3 completed with failed rounds, 130 / 143 stopped by SIGINT / SIGTERM, from the study or
because the study itself died).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    from fedsynth.workers import stop_when_parent_dies

    stop_when_parent_dies()  # a study killed outright: this run stops itself cleanly (fedsynth/workers.py)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")  # SIGTERM stops the run cleanly (fedsynth/cli.py)
    from fedsynth.cli import run_command

    return run_command(Path(job["app-dir"]), job["overrides"], int(job["num-supernodes"]),
                       float(job["cpus-per-client"]), float(job.get("gpus-per-client", 0.0)), job.get("ray-address"),
                       job.get("engine", "simulation"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
