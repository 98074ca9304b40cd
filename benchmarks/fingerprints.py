"""Fingerprints of fedsynth's own runs: a sha256 of each short run's final model.

A refactor that must not change results (issue 44: "results of fedsynth's own
runs are bitwise unchanged for models without buffers") is checked by running
this script before and after it and comparing the lines. Each run goes through
`fedsynth run --engine inprocess` (`fedsynth.simulation.run_simulation`), so the whole
app is exercised: handshake, strategy, ClientApp, codec, aggregation, results.

The fingerprint hashes each array of the saved `model.safetensors` with its
name, dtype and shape, in name order, so it depends on the model's values and
nothing else (not on the file's metadata or key order). The final central
accuracy is printed beside it for the reader; the hash is what is compared.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fingerprints.py [--out FILE] [--only fedavg-mlp ...]

Data: Fashion-MNIST from `--data-dir` (default: the Debian package's folder),
a few local steps of small batches on 3 nodes, 3 rounds; about a minute in all
on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

# One BLAS/OpenMP thread, as the tests and studies run: the last bits of torch's sums depend on the thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402 - after the thread count

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
NUM_NODES = 3

# Shared by every run: small and fast, yet every algorithm's server and client rules take part.
COMMON: dict[str, Any] = {
    "dataset": "fashion-mnist", "num-server-rounds": 3, "local-steps": 3, "batch-size": 16, "seed": 0,
}

# name -> the run config keys that make the run (beside COMMON and the model)
ALGORITHMS: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg"},
    "scaffold": {"algorithm": "scaffold"},
    "fedsynsam-qsgd4": {
        "algorithm": "fedsynsam", "compression": "qsgd", "bits": 4,
        "trajectory-rounds": 1, "distill-iterations": 5, "synthetic-ipc": 2,
    },
    "fedcog": {"algorithm": "fedcog", "gen-steps": 3, "gen-budget": 16, "cog-start-round": 2},
    "dfedavg": {"algorithm": "dfedavg"},
    "oledfl-sgd": {"algorithm": "oledfl-sgd"},
}
MODELS = ("mlp", "cnn")


def runs() -> dict[str, dict[str, Any]]:
    """Every fingerprinted run: `<algorithm>-<model>` -> its run config overrides."""
    return {f"{name}-{model}": {**COMMON, **keys, "model": model}
            for name in ALGORITHMS for model in MODELS for keys in [ALGORITHMS[name]]}


def model_fingerprint(path: Path) -> str:
    """sha256 over (name, dtype, shape, bytes) of every array of a safetensors file, in name order."""
    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    for name, array in sorted(load_file(str(path)).items()):
        array = np.ascontiguousarray(array)
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def fingerprint_run(name: str, overrides: dict[str, Any], data_dir: str, workdir: Path) -> dict[str, Any]:
    """One run through `fedsynth run --engine inprocess`; its fingerprint and final accuracy."""
    from fedsynth.simulation import find_app_dir, run_simulation

    keys = {**overrides, "data-dir": data_dir, "cache-dir": str(workdir / "cache"),
            "results-dir": str(workdir / "results"), "run-name": name}
    folder = run_simulation(find_app_dir(), keys, num_supernodes=NUM_NODES, cpus_per_client=1.0, engine="inprocess")
    summary = json.loads((folder / "summary.json").read_text())
    return {"run": name, "sha256": model_fingerprint(folder / "model.safetensors"),
            "final-central-accuracy": summary.get("final-central-accuracy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="folder holding Fashion-MNIST's IDX files")
    parser.add_argument("--only", nargs="*", default=None, help="run names to fingerprint (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="also write the lines to this file")
    args = parser.parse_args()
    selected = runs()
    if args.only:
        unknown = sorted(set(args.only) - set(selected))
        if unknown:
            raise SystemExit(f"unknown runs {unknown}; known: {sorted(selected)}")
        selected = {name: selected[name] for name in args.only}
    lines = []
    with tempfile.TemporaryDirectory(prefix="fingerprints-") as tmp:
        for name, overrides in selected.items():
            row = fingerprint_run(name, overrides, args.data_dir, Path(tmp))
            line = f"{row['run']:<22} {row['sha256']}  accuracy={row['final-central-accuracy']}"
            print(line, flush=True)
            lines.append(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
