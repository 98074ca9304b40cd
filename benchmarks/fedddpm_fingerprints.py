"""Fingerprints of FedDDPM's and FedDDPM+'s runs: what a refactor of their server side must leave unchanged.

benchmarks/fingerprints.py covers the classifiers' algorithms; the diffusion task needs its own, because what
FedDDPM computes beside the final model matters too. For four tiny in-process runs (3 nodes, 2 rounds of the
tests' 8x8 U-Net on written Fashion-MNIST files) this prints a sha256 prefix of

- `model`: the saved final model (each array with its name, dtype and shape, in name order);
- `aux`: the server's auxiliary set A (sampled from the nodes' warm models);
- `sent`: every message the server sent (its config records, and the hash of each array record);
- `metrics`: the run's round records, times left out;

and how many messages were sent. The runs: FedDDPM; the same run resumed from its round-2 checkpoint to
round 3; FedDDPM+ with QuickTest against the auxiliary set; FedDDPM+ against the nodes' pooled feature sums.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fedddpm_fingerprints.py [--out FILE]

About a minute on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the last bits of torch's sums depend on the thread count

import numpy as np  # noqa: E402 - after the thread count
import torch  # noqa: E402
from flwr.app import Message  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from common.records import from_record  # noqa: E402
from fedsynth.inprocess import InProcessGrid  # noqa: E402
from tests.conftest import write_fashion_mnist  # noqa: E402
from tests.diffusion_tiny import TINY_DIFFUSION  # noqa: E402
from tests.test_inprocess_runs import base_config, run_inprocess  # noqa: E402

RUNS: dict[str, dict[str, Any]] = {
    "fedddpm": {"algorithm": "fedddpm", "checkpoint-every": 1},
    "fedddpm+": {"algorithm": "fedddpm+", "quicktest-every": 1, "quicktest-threshold": 1e-9},
    "fedddpm+clients": {"algorithm": "fedddpm+", "quicktest-every": 1, "quicktest-threshold": 1e-9,
                        "quicktest-reference": "clients"},
}


def weights_hash(weights: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name])
        for part in (name, str(array.dtype), str(array.shape)):
            digest.update(part.encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def messages_hash(messages: Iterable[Message]) -> str:
    digest = hashlib.sha256()
    for message in messages:
        digest.update(f"{message.metadata.dst_node_id}|{message.metadata.message_type}".encode())
        for name, record in sorted(message.content.config_records.items()):
            digest.update(name.encode() + json.dumps(dict(record), sort_keys=True, default=str).encode())
        for name, record in sorted(message.content.array_records.items()):
            digest.update(name.encode() + weights_hash(from_record(record)).encode())
    return digest.hexdigest()[:16]


def metrics_hash(rounds: Sequence[Mapping[str, Any]]) -> str:
    clean = [{key: value for key, value in record.items() if "time" not in key} for record in rounds]
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=str).encode()).hexdigest()[:16]


def line(name: str, results: Any, strategy: Any, grid: InProcessGrid) -> str:
    model = load_file(str(results.path / "model.safetensors"))
    return (f"{name:<16} model {weights_hash(model)} aux {hashlib.sha256(strategy.auxiliary.tobytes()).hexdigest()[:16]} "
            f"sent {messages_hash(grid.sent)} metrics {metrics_hash(results.rounds)} n_sent {len(grid.sent)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the lines to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="fedddpm-fingerprints-"))
    data = write_fashion_mnist(root / "data")
    lines = []
    for name, extra in RUNS.items():
        raw = base_config(root / name, data, **{**TINY_DIFFUSION, **extra, "num-server-rounds": 2})
        _, results, strategy, grid = run_inprocess(raw, num_nodes=3)
        lines.append(line(name, results, strategy, grid))
        print(lines[-1], flush=True)
        if name == "fedddpm":  # resumed from round 2's checkpoint to round 3
            shutil.copytree(results.path, root / name / "resumed" / "run")
            resumed = {**raw, "results-dir": str(root / name / "resumed"), "num-server-rounds": 3, "resume": True}
            grid = InProcessGrid(3, resumed)
            _, results, strategy, _ = run_inprocess(resumed, 3, grid)
            lines.append(line(f"{name}-resumed", results, strategy, grid))
            print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
