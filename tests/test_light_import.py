"""A light import (issue 52, deliver 8): `import fedsynth.strategies` loads no torch and changes no environment variable.

Flower's `import flwr.serverapp` sets GRPC_VERBOSITY=error when it is unset (flwr/supercore/grpc.py), and every
strategy subclasses Flower's `Strategy`, so importing fedsynth's strategies changes exactly what importing Flower
changes, and nothing else. torch is loaded only where a strategy needs a model on the server (FedSynSAM's and
DynaFed's distillation, FedDDPM's sampling): a FedAvg is built and runs a round (`configure_train`, then
`aggregate_train` on hand-made replies) on numpy alone. Each probe runs in a fresh interpreter, as a developer's
ServerApp does. benchmarks/import_cost.py measures what this saves.
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


def test_importing_the_strategies_does_not_load_torch():
    assert probe("fedsynth.strategies")["torch"] is False


# One FedAvg round as a Flower developer's ServerApp runs it, with a grid that knows three nodes and replies made
# by hand: weights 1, 2, 3 on 10, 20, 30 examples give the sample-weighted mean 14/6 in every float entry.
ROUND = """
import json, sys
import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from fedsynth.strategies import FedAvg

class Grid:
    def get_node_ids(self):
        return [11, 12, 13]

def record(value, count):
    return ArrayRecord({"w": Array(np.full((2, 3), value, dtype=np.float32)),
                        "count": Array(np.array(count, dtype=np.int64))})

TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
strategy = FedAvg()
built = "torch" in sys.modules
sent = list(strategy.configure_train(1, record(0.0, 0), ConfigRecord({"lr": 0.1}), Grid()))
for number, message in enumerate(sent):
    message.metadata.__dict__["_message_id"] = f"m{number}"  # as the grid sets it when it pushes
replies = [Message(RecordDict({"arrays": record(float(k + 1), k + 1),
                               "metrics": MetricRecord({"num-examples": 10 * (k + 1), "train-loss": 0.5})}),
                   reply_to=message) for k, message in enumerate(sent)]
arrays, metrics = strategy.aggregate_train(1, replies)
w, count = arrays["w"].numpy(), arrays["count"].numpy()
print(json.dumps({"built": built, "sent": len(sent), "w": w.tolist(), "w-dtype": str(w.dtype),
                  "count-dtype": str(count.dtype), "count-shape": list(count.shape),
                  "train-loss": metrics["train_loss"], "torch": "torch" in sys.modules}))
"""


def test_building_a_fedavg_and_running_its_round_does_not_load_torch():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", ROUND], env=env, cwd=ROOT, check=True, capture_output=True,
                         text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] == 3
    assert result["w"] == [[pytest.approx(14 / 6)] * 3] * 2  # the round really aggregated the three replies
    assert (result["w-dtype"], result["count-dtype"], result["count-shape"]) == ("float32", "int64", [])
    assert result["train-loss"] == pytest.approx(0.5)
    assert result["built"] is False
    assert result["torch"] is False
