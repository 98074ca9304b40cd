"""`import fedsynth.strategies` changes no environment variable of its own (issue 52, deliver 8).

Flower's `import flwr.serverapp` sets GRPC_VERBOSITY=error when it is unset (flwr/supercore/grpc.py), and every
strategy subclasses Flower's `Strategy`, so importing fedsynth's strategies changes exactly what importing Flower
changes, and nothing else. Each import runs in a fresh interpreter, as a developer's ServerApp does.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, sys
before = dict(os.environ)
import {module}
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps({{"changed": changed, "torch": "torch" in sys.modules}}))
"""


@functools.lru_cache(maxsize=None)
def probe(module: str) -> dict:
    """What importing `module` in a fresh interpreter changed in os.environ, and whether it loaded torch."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_strategies_changes_no_environment_variable_beyond_flowers():
    flower, ours = probe("flwr.serverapp"), probe("fedsynth.strategies")
    assert flower["changed"] == ["GRPC_VERBOSITY"]  # Flower's own, on import
    assert ours["changed"] == flower["changed"]


@pytest.mark.xfail(strict=True, reason="not yet: the centralized strategies import torch through common.records, "
                   "common.run.config (model and sampler names in torch modules), server_app.fid_reference, "
                   "perturbation, checkpoint and common.algorithms.losses (see the issue 52 note)")
def test_importing_the_strategies_does_not_load_torch():
    assert probe("fedsynth.strategies")["torch"] is False
