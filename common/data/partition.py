"""Non-IID splits of a dataset over clients, and the on-disk cache of each client's data.

Splits use `flwr-datasets` partitioners on a table holding only the labels (the
partitioners look at nothing else), so a split is reproducible from
(dataset, partitioner, parameters, num-partitions, seed). The `pairs` split,
which no flwr-datasets partitioner gives, is `pairs_indices` below. Each
client's partition is then cut into a local train and a local test split.

In deployment every ClientApp message runs in a fresh process, so a client must
not reload and re-split the whole dataset every round: the first call computes
all partitions once and writes one small `.npz` per client; later calls read
only their own file.

A Hugging Face dataset (`hf:<repo>`) is split by flwr-datasets' FederatedDataset
with the same partitioners, partitioning by its label column.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.data.client_data import ClientData, default_cache_dir, split_local, write_atomic_npz
from common.errors import ConfigError
from common.data.datasets import DatasetArrays, dataset_info, load_dataset
from common.data.read_cache import read_arrays

CACHE_VERSION = 1


@dataclass(frozen=True)
class PartitionSpec:
    """Everything that determines a split; its hash names the cache folder."""

    dataset: str
    partition: str
    num_partitions: int
    seed: int
    alpha: float = 0.3
    classes_per_client: int = 2
    local_test_fraction: float = 0.2
    image_column: str = ""
    label_column: str = ""

    def cache_key(self) -> str:
        """A stable short hash of the spec (and the cache format version)."""
        # Empty column keys (every non-hf dataset) leave the hash as it was before they existed.
        fields = {k: v for k, v in self.__dict__.items() if v != "" or k not in ("image_column", "label_column")}
        text = json.dumps({**fields, "version": CACHE_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _partitioner(spec: PartitionSpec, partition_by: str = "label"):
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    n = spec.num_partitions
    if spec.partition == "iid":
        return IidPartitioner(num_partitions=n)
    if spec.partition == "dirichlet":
        return DirichletPartitioner(
            num_partitions=n, partition_by=partition_by, alpha=spec.alpha,
            min_partition_size=2, self_balancing=False, shuffle=True, seed=spec.seed,
        )
    if spec.partition == "shard":
        # FedDDPM's split: sort by label, cut 2N shards, two per client.
        return ShardPartitioner(
            num_partitions=n, partition_by=partition_by, num_shards_per_partition=2,
            shuffle=True, seed=spec.seed,
        )
    if spec.partition == "pathological":
        return PathologicalPartitioner(
            num_partitions=n, partition_by=partition_by,
            num_classes_per_partition=spec.classes_per_client,
            # client i's first class is i mod C, so with N >= C every class is used
            class_assignment_mode="first-deterministic", shuffle=True, seed=spec.seed,
        )
    raise ValueError(f"unknown partition {spec.partition!r}")


def class_groups(num_classes: int, classes_per_client: int, num_partitions: int) -> list[list[int]]:
    """The classes of each client under the `pairs` split: client i holds group i mod G.

    The classes are cut into G = C / k disjoint groups of k consecutive classes
    ((0, 1), (2, 3), ... for k = 2), and each group is shared by N / G clients.
    Refuses counts that do not divide: the split exists only when k divides C
    and G divides N.
    """
    if classes_per_client < 1 or num_classes % classes_per_client:
        raise ConfigError(
            f"partition 'pairs' needs 'classes-per-client' to divide the {num_classes} classes of the dataset; "
            f"got {classes_per_client} (accepted: "
            + ", ".join(str(k) for k in range(1, num_classes + 1) if num_classes % k == 0) + ")"
        )
    groups = num_classes // classes_per_client
    if num_partitions % groups:
        raise ConfigError(
            f"partition 'pairs' with classes-per-client = {classes_per_client} makes {groups} disjoint class "
            f"groups, each shared by the same number of clients, so the number of nodes ('num-partitions') "
            f"must be a multiple of {groups}; got {num_partitions}"
        )
    return [list(range((i % groups) * classes_per_client, (i % groups + 1) * classes_per_client))
            for i in range(num_partitions)]


def pairs_indices(labels: np.ndarray, num_classes: int, classes_per_client: int, num_partitions: int,
                  seed: int) -> list[np.ndarray]:
    """FedCOG's NIID-2 split: disjoint class groups, each group's samples split evenly over its clients.

    With 10 classes, 2 classes per client and 10 clients: classes (0, 1) go to
    clients 0 and 5, (2, 3) to clients 1 and 6, and so on; each class's samples
    are shuffled (seeded) and cut into N / G parts whose sizes differ by at most
    one, and client i takes part i // G of each of its classes. This is the
    authors' `noniid-skew-2` split (their code keeps the dataset's order instead
    of shuffling and drops the remainder of each class).
    """
    groups = class_groups(num_classes, classes_per_client, num_partitions)
    num_groups = num_classes // classes_per_client
    sharing = num_partitions // num_groups
    rng = np.random.default_rng([seed, 19])
    parts_of_class = [
        np.array_split(rng.permutation(np.flatnonzero(labels == c)), sharing) for c in range(num_classes)
    ]
    return [
        np.sort(np.concatenate([parts_of_class[c][i // num_groups] for c in groups[i]])).astype(np.int64)
        for i in range(num_partitions)
    ]


def partition_indices(labels: np.ndarray, spec: PartitionSpec) -> list[np.ndarray]:
    """Indices into `labels` of each partition, per the spec's partitioner."""
    from datasets import Dataset

    if len(labels) < spec.num_partitions:
        raise ValueError(f"dataset {spec.dataset!r} has {len(labels)} training samples, fewer than the "
                         f"{spec.num_partitions} partitions (num-partitions / --num-supernodes): every node needs "
                         "at least one; use fewer nodes or more data")
    if spec.partition == "pairs":
        parts = pairs_indices(labels, dataset_info(spec.dataset).num_classes, spec.classes_per_client,
                              spec.num_partitions, spec.seed)
        empty = [i for i, part in enumerate(parts) if len(part) == 0]
        if empty:
            raise ValueError(f"partition 'pairs' left partitions {empty} empty: too few samples for "
                             f"{spec.num_partitions} partitions")
        return parts

    table = Dataset.from_dict({"label": labels.astype(np.int64), "index": np.arange(len(labels))})
    if spec.partition == "iid":
        # IidPartitioner cuts contiguous blocks and relies on FederatedDataset having
        # shuffled first; shuffle here so the split depends on the seed, not the file order.
        table = table.shuffle(seed=spec.seed)
    partitioner = _partitioner(spec)
    partitioner.dataset = table
    return _checked_partitions(
        lambda i: np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64), spec, len(labels)
    )


def _checked_partitions(load, spec: PartitionSpec, num_samples: int) -> list:
    """`load(i)` for every partition i, with the partitioners' errors and empty partitions explained."""
    try:
        parts = [load(i) for i in range(spec.num_partitions)]
    except ValueError as err:
        raise ValueError(
            f"partition {spec.partition!r} cannot split {num_samples} samples into "
            f"{spec.num_partitions} partitions: {err} (check run config keys 'alpha', "
            "'classes-per-client' and the number of nodes)"
        ) from None
    empty = [i for i, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ValueError(
            f"partition {spec.partition!r} left partitions {empty} empty; use a larger "
            "'alpha', more 'classes-per-client' or fewer nodes"
        )
    return parts


def build_client_datasets(data: DatasetArrays, spec: PartitionSpec) -> list[ClientData]:
    """Every client's local train/test data for a spec."""
    clients = []
    for pid, indices in enumerate(partition_indices(data.y_train, spec)):
        train_idx, test_idx = split_local(indices, spec.local_test_fraction, spec.seed, pid)
        clients.append(
            ClientData(data.x_train[train_idx], data.y_train[train_idx],
                       data.x_train[test_idx], data.y_train[test_idx])
        )
    return clients


def build_hf_client_datasets(spec: PartitionSpec, data_dir: str = "") -> list[ClientData]:
    """Every client's local train/test data of an `hf:` dataset, split by FederatedDataset."""
    from common.data.hf_datasets import HfSource, federated_dataset, find_columns, open_dataset, to_arrays

    source = HfSource.from_name(spec.dataset, data_dir, spec.image_column, spec.label_column)
    loaded = open_dataset(source)  # explains a missing dataset before FederatedDataset tries
    image, label = find_columns(loaded["train"].features, spec.image_column, spec.label_column)
    fds = federated_dataset(source, _partitioner(spec, partition_by=label), spec.seed)
    num_samples = len(loaded["train"])
    parts = _checked_partitions(lambda i: fds.load_partition(i, "train"), spec, num_samples)
    clients = []
    for pid, part in enumerate(parts):
        x, y = to_arrays(part, image, label)
        train_idx, test_idx = split_local(np.arange(len(y)), spec.local_test_fraction, spec.seed, pid)
        clients.append(ClientData(x[train_idx], y[train_idx], x[test_idx], y[test_idx]))
    return clients


def partition_cache_folder(spec: PartitionSpec, data_dir: str = "", cache_dir: str = "") -> Path:
    """The cache folder of a split: named by the spec's hash and the data directory's."""
    source = str(Path(data_dir).expanduser().resolve()) if data_dir else ""
    source_key = hashlib.sha256(source.encode()).hexdigest()[:8]
    return (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / f"{spec.cache_key()}-{source_key}"


def load_client_data(spec: PartitionSpec, partition_id: int, data_dir: str = "", cache_dir: str = "") -> ClientData:
    """One client's data, from the cache when present, else built and cached for all clients."""
    if not 0 <= partition_id < spec.num_partitions:
        raise ValueError(
            f"node config 'partition-id' = {partition_id} is outside 0..{spec.num_partitions - 1} "
            f"('num-partitions' = {spec.num_partitions})"
        )
    folder = partition_cache_folder(spec, data_dir, cache_dir)
    path = folder / f"client-{partition_id}.npz"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        if spec.dataset.startswith("hf:"):
            clients = build_hf_client_datasets(spec, data_dir)
        else:
            clients = build_client_datasets(load_dataset(spec.dataset, data_dir), spec)
        for pid, client in enumerate(clients):
            write_atomic_npz(folder / f"client-{pid}.npz", **client.__dict__)
        (folder / "spec.json").write_text(json.dumps(spec.__dict__, indent=1))
        return clients[partition_id]
    try:  # this process's copy when it read the same file before (common/data/read_cache.py)
        return ClientData(**read_arrays(path, _read_client_file))
    except Exception as err:  # noqa: BLE001 - any read failure means the same: a damaged cache file
        raise ValueError(
            f"partition cache file {path} is damaged ({type(err).__name__}: {err}); expected an .npz with "
            f"x_train, y_train, x_test, y_test: delete the folder {folder} (it is rebuilt from the dataset)"
        ) from None


def _read_client_file(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as stored:
        return {key: stored[key] for key in ("x_train", "y_train", "x_test", "y_test")}
