"""One study run in a process of its own: `python -m fedsynth.study_worker '<job as JSON>'`.

The job names the app directory, the run's overrides and the simulation's
resources; the run goes through `fedsynth.cli.run_simulation`, the path of
`fedsynth run`, and the process exits as `fedsynth run` does: 0 for a
finished run, 2 for a configuration error, 1 for a failed run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    from common.config import ConfigError
    from fedsynth.cli import run_simulation

    try:
        folder = run_simulation(Path(job["app-dir"]), job["overrides"], int(job["num-supernodes"]),
                                float(job["cpus-per-client"]), float(job.get("gpus-per-client", 0.0)))
    except ConfigError as err:
        print(f"fedsynth: configuration error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - a failed run is an exit code for the study, as for `fedsynth run`
        print(f"fedsynth: run failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(f"results: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
