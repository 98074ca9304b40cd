"""The adaptive waits in a real deployment, on (the default) and off (FEDSYNTH_ADAPTIVE_WAITS=0): both arms finish
the same 2-round run with bitwise the same model, and each SuperNode says which waits it runs.

deploy/supernode-waits.py changes only when Flower's SuperNode pulls, looks for the reply and retries an object, and
server_app/reply_pulls.py only when the ServerApp retries a reply's object; the messages are the same, and training
is seeded per node and round, so the final model must not depend on the waits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedsynth.loopback import LoopbackFederation
from tests.test_warm_clientapp_deployment import final_model

pytestmark = pytest.mark.slow

SAYS = {True: "supernode-waits.py: adaptive waits on", False: "supernode-waits.py: FEDSYNTH_ADAPTIVE_WAITS=0"}


def _arm(tmp_path: Path, tiny_data_dir: Path, flower_app: Path, adaptive: bool) -> dict[str, np.ndarray]:
    name = "adaptive" if adaptive else "flower-waits"
    with LoopbackFederation(tmp_path / f"{name}-federation", num_nodes=2, extra_env={"OMP_NUM_THREADS": "1"},
                            adaptive_waits=adaptive) as federation:
        model = final_model(federation, flower_app, tiny_data_dir, tmp_path / name)
        logs = [f.read_text(errors="replace") for f in sorted(federation.logs.glob("supernode-*.log"))]
    assert len(logs) == 2 and all(SAYS[adaptive] in log and SAYS[not adaptive] not in log for log in logs), logs
    return model


def test_the_adaptive_waits_on_and_off_finish_the_same_run_with_bitwise_the_same_model(tmp_path, tiny_data_dir,
                                                                                      flower_app):
    on = _arm(tmp_path, tiny_data_dir, flower_app, adaptive=True)
    off = _arm(tmp_path, tiny_data_dir, flower_app, adaptive=False)
    assert on.keys() == off.keys()
    for name in on:
        assert on[name].dtype == off[name].dtype and np.array_equal(on[name], off[name]), name
