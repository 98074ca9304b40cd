"""What decides a study run beside its run config: the client count and the data's identity.

A run config does not say how many clients a simulation starts (the study's
`num-supernodes`), nor which bytes its `dataset` names on this machine (the files
under `data-dir`, a key that says only where they are). Both change the result: a
3-client study must not take a 2-client run, nor a run on other files under the
same name. So the run key (key version 2, `fedsynth.study.effective.run_key`)
digests these inputs beside the effective config:

- `num-supernodes`: how many ClientApps the run's simulation starts;
- `data`: a digest of the dataset's arrays as the app loads them (train and test
  images and labels, with their dtypes and shapes), so the same data in another
  folder or file format is the same input, and a changed file is another. A run
  whose nodes read their own folders (`partition = "node"`) has no data the study
  can see: its identity says so. A dataset this machine cannot load gives an
  identity that names why (its runs would fail anyway).

The partition is a function of these inputs and the effective config (the
partitioner's keys and the seed); what a run actually got is recorded after it,
from the handshake's per-node example counts (`partition_record`), and two
entries under one key that disagree on it are refused as two runs
(fedsynth/study/checks.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NODES_FILE = "nodes.json"  # who took part, as the handshake learned it (common/run/results.py write_nodes)
MAX_RECORDED_NODES = 100  # a ledger entry lists the counts of at most this many nodes (their digest always)


def run_inputs(effective: Mapping[str, Any], num_supernodes: int) -> dict[str, Any]:
    """The run's inputs outside its run config, as its key digests them."""
    return {"num-supernodes": int(num_supernodes), "data": data_identity(effective)}


def data_identity(effective: Mapping[str, Any]) -> str:
    """A digest of the run's dataset as the app loads it, or why there is none (see the module's docstring)."""
    if effective.get("partition") == "node":
        return "each node's own folder (partition = node): not seen by the study"
    return _dataset_digest(str(effective.get("dataset", "")), str(effective.get("data-dir", "")),
                           str(effective.get("hf-image-column", "")), str(effective.get("hf-label-column", "")))


@functools.lru_cache(maxsize=32)
def _dataset_digest(name: str, data_dir: str, image_column: str, label_column: str) -> str:
    """sha256 (16 hex digits) over the loaded arrays, once per dataset and folder in a process."""
    from common.data.datasets import load_dataset

    try:
        arrays = load_dataset(name, data_dir, image_column, label_column)
    except Exception as err:  # noqa: BLE001 - any failure to load is named in the identity, not raised
        return f"not loadable here ({type(err).__name__}: {str(err)[:200]})"
    digest = hashlib.sha256()
    for part in (arrays.x_train, arrays.y_train, arrays.x_test, arrays.y_test):
        digest.update(f"{part.dtype.str}|{part.shape}|".encode())
        digest.update(part.tobytes())
    return "sha256:" + digest.hexdigest()[:16]


def partition_record(folder: Path) -> dict[str, Any] | None:
    """The partition a finished run got: its nodes' [partition id, train, test example counts] (up to
    MAX_RECORDED_NODES of them) and their digest, from the run folder's nodes.json; None when the run left none."""
    try:
        rows = json.loads((Path(folder) / NODES_FILE).read_text())
        counts = sorted([int(r["partition-id"]), int(r["num-train-examples"]), int(r["num-test-examples"])]
                        for r in rows)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    text = json.dumps(counts)
    record: dict[str, Any] = {"nodes": len(counts), "digest": hashlib.sha256(text.encode()).hexdigest()[:12]}
    if len(counts) <= MAX_RECORDED_NODES:
        record["counts"] = counts
    return record
