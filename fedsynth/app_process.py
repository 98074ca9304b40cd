"""The environment of a child process that imports the apps (a study run, a sharpness measurement).

Both need the app folder first on `PYTHONPATH` (the apps import as top-level
`common`, `client_app`, `server_app`) and a cap on torch's threads: torch in N
processes at once with its default threads oversubscribes the cores (37 s vs
0.8 s measured on 2 cores). A thread count the caller already set wins.
"""

from __future__ import annotations

import os
from pathlib import Path


def app_process_env(app_dir: Path, threads: int) -> dict[str, str]:
    """This process's environment with `app_dir` prepended to PYTHONPATH and OMP_NUM_THREADS defaulted to `threads`."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, threads)))
    env["PYTHONPATH"] = os.pathsep.join([str(app_dir), *filter(None, [env.get("PYTHONPATH")])])
    return env
