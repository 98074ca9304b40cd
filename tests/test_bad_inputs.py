"""Bad input everywhere a user types something fails fast with a message naming the problem.

One table: run config, node config, data directories and checkpoints. Each row
builds the bad input, calls the code a run would call first, and checks the
error type and the words a user needs to fix it.
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client_app.app import node_settings
from common.data import torchvision_files
from common.run.config import ConfigError, parse_run_config
from common.data.datasets import DatasetMissingError, load_dataset
from common.records import model_weights
from common.run.results import ResultsFolderError, RunResults
from common.run.task import make_model
from server_app.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from server_app.registry import SERVER_STRATEGIES


def cfg(**raw):
    return parse_run_config(raw, SERVER_STRATEGIES)


def node(config: dict):
    return node_settings(Context(run_id=1, node_id=1, node_config=config, state=RecordDict(), run_config={}), cfg())


def saved_checkpoint(tmp: Path, **raw) -> Path:
    run_cfg = cfg(**raw)
    folder = tmp / "run"
    save_checkpoint(folder, run_cfg, Checkpoint(2, model_weights(make_model(run_cfg, seeded=True)), {}, {}, []))
    return folder


def resume(folder: Path, **raw):
    run_cfg = cfg(**raw)
    return load_checkpoint(folder, run_cfg, model_weights(make_model(run_cfg)))


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


class Evil:
    def __reduce__(self):
        import os

        return (os.system, ("true",))


def fake_fashion(root: Path, truncate: bool = False) -> Path:
    raw = root / "FashionMNIST" / "raw"
    images = bytes([0, 0, 8, 3]) + (2).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + bytes(2 * 784 - (100 if truncate else 0))
    labels = bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big") + bytes(2)
    for prefix in ("train", "t10k"):
        write_bytes(raw / f"{prefix}-images-idx3-ubyte.gz", gzip.compress(images))
        write_bytes(raw / f"{prefix}-labels-idx1-ubyte.gz", gzip.compress(labels))
    return root


def evil_cifar(root: Path) -> Path:
    base = root / "cifar-10-batches-py"
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        write_bytes(base / name, pickle.dumps({b"data": Evil(), b"labels": [0]}))
    return root


def nan_checkpoint(tmp: Path) -> Path:
    run_cfg = cfg()
    weights = {k: np.full_like(v, np.nan) for k, v in model_weights(make_model(run_cfg, seeded=True)).items()}
    folder = tmp / "run"
    save_checkpoint(folder, run_cfg, Checkpoint(2, weights, {}, {}, []))
    return folder


def fashion_with_extra_images(root: Path) -> Path:
    raw = root / "FashionMNIST" / "raw"
    fake_fashion(root)
    images = bytes([0, 0, 8, 3]) + (3).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + bytes(3 * 784)
    write_bytes(raw / "train-images-idx3-ubyte.gz", gzip.compress(images))
    return root


def fashion_not_gzipped(root: Path) -> Path:
    fake_fashion(root)
    write_bytes(root / "FashionMNIST" / "raw" / "train-images-idx3-ubyte.gz", b"not gzip at all")
    return root


def cifar_without_labels(root: Path) -> Path:
    base = root / "cifar-10-batches-py"
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        write_bytes(base / name, pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}))
    return root


def corrupt_partition_cache(tmp: Path):
    from common.data.partition import PartitionSpec, load_client_data, partition_cache_folder

    spec = PartitionSpec(dataset="fashion-mnist", partition="iid", num_partitions=2, seed=0, alpha=0.3,
                         classes_per_client=2, local_test_fraction=0.2)
    folder = partition_cache_folder(spec, "", str(tmp / "cache"))
    write_bytes(folder / "client-0.npz", b"PK\x03\x04 truncated")
    return load_client_data(spec, 0, "", str(tmp / "cache"))


def resumed_with(tmp: Path, **changed):
    folder = saved_checkpoint(tmp)
    return resume(folder, **{"run-name": "run", "resume": True, **changed})


def results_of(tmp: Path, **raw) -> RunResults:
    return RunResults(cfg(**{"results-dir": str(tmp / "results"), "run-name": "run", **raw}))


def reused_run_name(tmp: Path):
    results_of(tmp).close()
    return results_of(tmp)


def folder_in_use(tmp: Path):
    held = results_of(tmp)
    try:
        return results_of(tmp, overwrite=True)
    finally:
        held.close()


def unwritable_results_dir(tmp: Path):
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)
    return RunResults(cfg(**{"results-dir": str(tmp / "ro"), "run-name": "run"}))


def cli_preflight(tmp: Path, num_supernodes: int = 10, cpus: float = 1.0, **raw):
    from fedsynth.simulation import preflight

    return preflight(cfg(**raw), tmp / "results" / "run", num_supernodes, cpus)


CASES = [
    # ----- run config -----
    ("unknown algorithm", lambda t: cfg(algorithm="fedfoo"), ConfigError, ["'algorithm'", "fedavg", "scaffold"]),
    ("negative alpha", lambda t: cfg(alpha=-0.5), ConfigError, ["'alpha'", "> 0"]),
    ("too many classes per client", lambda t: cfg(**{"classes-per-client": 11}), ConfigError, ["'classes-per-client'", "1..10"]),
    ("model does not fit dataset", lambda t: cfg(model="mlp", dataset="cifar10"), ConfigError, ["'model'", "cifar10", "784"]),
    ("fraction outside (0, 1]", lambda t: cfg(**{"fraction-train": 0.0}), ConfigError, ["'fraction-train'", "(0, 1]"]),
    ("resume without run-name", lambda t: cfg(resume=True), ConfigError, ["'run-name'", "resume"]),
    ("negative checkpoint-every", lambda t: cfg(**{"checkpoint-every": -1}), ConfigError, ["'checkpoint-every'"]),
    ("unknown key", lambda t: cfg(**{"learning-rate": 0.1}), ConfigError, ["learning-rate", "known keys"]),
    ("unknown device", lambda t: cfg(device="tpu"), ConfigError, ["'device'", "cuda:N"]),
    ("infinite lr", lambda t: cfg(lr=float("inf")), ConfigError, ["'lr'", "finite"]),
    ("string for an integer", lambda t: cfg(**{"num-server-rounds": "ten"}), ConfigError, ["'num-server-rounds'", "integer"]),
    # ----- node config -----
    ("missing partition-id", lambda t: node({"num-partitions": 2}), ConfigError, ["'partition-id'", "--node-config"]),
    ("partition-id out of range", lambda t: node({"partition-id": 2, "num-partitions": 2}), ConfigError, ["'partition-id'", "0..num-partitions-1"]),
    ("non-integer partition-id", lambda t: node({"partition-id": "a", "num-partitions": 2}), ConfigError, ["'partition-id'", "integer"]),
    ("zero partitions", lambda t: node({"partition-id": 0, "num-partitions": 0}), ConfigError, ["num-partitions"]),
    ("CUDA asked for on a CPU node", lambda t: node({"partition-id": 0, "num-partitions": 1, "device": "cuda"}), ConfigError, ["'device'", "CUDA is not available"]),
    # ----- data -----
    ("missing MNIST", lambda t: load_dataset("mnist", t), DatasetMissingError, ["mnist", "train-images-idx3-ubyte", "data-dir", "download=True"]),
    ("missing CIFAR-10", lambda t: load_dataset("cifar10", t), DatasetMissingError, ["cifar10", "data_batch_1", "data-dir"]),
    ("missing CIFAR-100", lambda t: load_dataset("cifar100", t), DatasetMissingError, ["cifar100", "cifar-100-python"]),
    ("truncated IDX file", lambda t: load_dataset("fashion-mnist", fake_fashion(t, truncate=True)), ValueError, ["header says"]),
    ("CIFAR file with a code object", lambda t: load_dataset("cifar10", evil_cifar(t)), pickle.UnpicklingError, ["refusing", "system"]),
    # ----- checkpoints -----
    ("resume with no checkpoint", lambda t: resume(t / "nothing", **{"run-name": "x", "resume": True}), CheckpointError, ["no checkpoint", "run-name"]),
    ("corrupt checkpoint", lambda t: resume(write_bytes(t / "run" / "checkpoint.safetensors", b"\x00garbage").parent), CheckpointError, ["corrupt", "delete it"]),
    ("truncated checkpoint", lambda t: resume(_truncate(saved_checkpoint(t))), CheckpointError, ["corrupt"]),
    ("checkpoint from another model", lambda t: resume(saved_checkpoint(t, model="mlp"), model="cnn"), CheckpointError, ["'model' is 'mlp'", "another run"]),
    ("checkpoint from another algorithm", lambda t: resume(saved_checkpoint(t, algorithm="scaffold")), CheckpointError, ["'algorithm' is 'scaffold'"]),
    ("checkpoint from another dataset", lambda t: resume(saved_checkpoint(t, dataset="mnist")), CheckpointError, ["'dataset' is 'mnist'"]),
    # ----- issue 20: no silent substitution, results never lost, a failed run fails -----
    ("misspelt key", lambda t: cfg(**{"num-server-round": 3}), ConfigError, ["num-server-round", "did you mean 'num-server-rounds'"]),
    ("trim fraction of one half", lambda t: cfg(**{"aggregation": "trimmed-mean", "trim-fraction": 0.5}), ConfigError, ["'trim-fraction'", "[0, 0.5)"]),
    ("unknown update-norm action", lambda t: cfg(**{"update-norm-action": "drop"}), ConfigError, ["'update-norm-action'", "clip", "refuse"]),
    ("negative max-update-norm", lambda t: cfg(**{"max-update-norm": -1.0}), ConfigError, ["'max-update-norm'"]),
    ("robust aggregation with a decentralized algorithm", lambda t: cfg(algorithm="dfedavg", aggregation="median"), ConfigError, ["'aggregation'", "decentralized"]),
    ("explicit data-dir that does not exist", lambda t: load_dataset("fashion-mnist", t / "nowhere"), DatasetMissingError, ["'data-dir'", "nowhere", "not a directory"]),
    ("more images than labels", lambda t: load_dataset("fashion-mnist", fashion_with_extra_images(t)), ValueError, ["train-images-idx3-ubyte.gz", "3 images", "2 labels"]),
    ("IDX file that is not gzip", lambda t: load_dataset("fashion-mnist", fashion_not_gzipped(t)), ValueError, ["train-images-idx3-ubyte.gz", "gzipped IDX"]),
    ("CIFAR batch without labels", lambda t: load_dataset("cifar10", cifar_without_labels(t)), ValueError, ["data_batch_1", "b'labels'"]),
    ("damaged partition cache file", corrupt_partition_cache, ValueError, ["client-0.npz", "delete the folder"]),
    ("non-finite checkpoint", lambda t: resume(nan_checkpoint(t)), CheckpointError, ["non-finite", "cannot be resumed"]),
    ("resume with a changed lr and partition", lambda t: resumed_with(t, lr=0.5, partition="iid"), CheckpointError, ["'lr' is 0.05", "'partition' is 'dirichlet'", "differing keys"]),
    ("run-name reused without resume", reused_run_name, ResultsFolderError, ["already holds a run", "run-name", "overwrite = true"]),
    ("resume of a folder without checkpoint", lambda t: results_of(t, resume=True), ResultsFolderError, ["no checkpoint", "overwrite = true"]),
    ("results folder in use by another run", folder_in_use, ResultsFolderError, ["in use by another run"]),
    ("more CPUs per client than the machine has", lambda t: cli_preflight(t, cpus=4096.0), ConfigError, ["--cpus-per-client", "CPUs of this machine"]),
    ("min-nodes above the node count", lambda t: cli_preflight(t, num_supernodes=2, **{"min-nodes": 3}), ConfigError, ["--num-supernodes 2", "'min-nodes' = 3"]),
    ("missing dataset caught before the engine starts", lambda t: cli_preflight(t, dataset="mnist", **{"data-dir": str(t)}), DatasetMissingError, ["mnist", "train-images-idx3-ubyte"]),
]
if os.geteuid() != 0:  # root writes anywhere
    CASES.append(("unwritable results-dir", unwritable_results_dir, ResultsFolderError, ["cannot write", "'results-dir'"]))


def _truncate(folder: Path) -> Path:
    path = folder / "checkpoint.safetensors"
    path.write_bytes(path.read_bytes()[:-500])
    return folder


@pytest.mark.parametrize("name, make, error, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_fast_with_a_message_naming_it(tmp_path, monkeypatch, name, make, error, words):
    monkeypatch.setattr(torchvision_files, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")
    if "CUDA" in name and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(error) as info:
        make(tmp_path)
    message = str(info.value)
    for word in words:
        assert word in message, f"{name}: {word!r} not in {message!r}"


def test_there_are_at_least_25_cases():
    assert len(CASES) >= 25


def test_a_quoted_value_that_looks_like_a_number_stays_a_string():
    from common.run.config import parse_overrides

    raw = parse_overrides("run-name='2024' dataset=\"mnist\" num-server-rounds=3")
    assert raw == {"run-name": "2024", "dataset": "mnist", "num-server-rounds": 3}
    assert cfg(**parse_overrides("run-name='nan'")).run_name == "nan"
