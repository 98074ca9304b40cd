"""Tests for common.data.partition and common.data.datasets on synthetic labels and tiny files.

No real dataset is needed: partitions run on synthetic label arrays, and the
dataset readers on tiny files written in the torchvision on-disk formats.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

import common.data.torchvision_files as torchvision_files
from common.data.datasets import DatasetMissingError, load_dataset
from common.data.torchvision_files import read_idx
from common.run.config import ConfigError
from common.data.partition import (
    PartitionSpec,
    class_groups,
    load_client_data,
    partition_cache_folder,
    partition_indices,
    split_local,
)

NUM_CLASSES = 10
PER_CLASS = 600
SCHEMES = ("iid", "dirichlet", "shard", "pathological", "pairs")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def sorted_labels() -> np.ndarray:
    """10 classes x 600 samples, sorted by label (0,0,...,1,1,...)."""
    return np.repeat(np.arange(NUM_CLASSES), PER_CLASS)


def shuffled_labels(seed: int = 0) -> np.ndarray:
    """The same multiset of labels in a fixed random order (like the real training files)."""
    return np.random.default_rng(seed).permutation(sorted_labels())


def spec(partition: str, num_partitions: int = 5, seed: int = 0, **kw) -> PartitionSpec:
    return PartitionSpec("fashion-mnist", partition, num_partitions, seed, **kw)


def assert_disjoint(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample is in two partitions"
    assert allidx.min() >= 0 and allidx.max() < n
    for part in parts:
        assert part.dtype == np.int64


def label_skew(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean over clients of the total-variation distance to the global label distribution."""
    glob = np.bincount(labels, minlength=NUM_CLASSES) / len(labels)
    tvs = [
        0.5 * np.abs(np.bincount(labels[p], minlength=NUM_CLASSES) / len(p) - glob).sum()
        for p in parts
    ]
    return float(np.mean(tvs))


# ----- every scheme ------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_gives_disjoint_nonempty_partitions(scheme: str) -> None:
    labels = shuffled_labels()
    parts = partition_indices(labels, spec(scheme, 5))
    assert len(parts) == 5
    assert all(len(p) > 0 for p in parts)
    assert_disjoint(parts, len(labels))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shard"])
def test_schemes_that_use_all_data_cover_every_index(scheme: str) -> None:
    # 6000 samples, 5 clients: 2N = 10 shards of 600 divide the data exactly.
    labels = shuffled_labels()
    parts = partition_indices(labels, spec(scheme, 5))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


def test_iid_is_balanced_on_shuffled_labels() -> None:
    labels = shuffled_labels()
    parts = partition_indices(labels, spec("iid", 5))
    assert [len(p) for p in parts] == [1200] * 5
    for part in parts:
        counts = np.bincount(labels[part], minlength=NUM_CLASSES)
        # 120 expected per class; a random 1200 of 6000 stays well within +-45.
        assert counts.min() >= 75 and counts.max() <= 165, counts
    assert label_skew(labels, parts) < 0.1


def test_iid_is_balanced_on_label_sorted_data() -> None:
    labels = sorted_labels()
    parts = partition_indices(labels, spec("iid", 5))
    for part in parts:
        assert len(np.unique(labels[part])) == NUM_CLASSES
    assert label_skew(labels, parts) < 0.1


# ----- Dirichlet ---------------------------------------------------------------------


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    labels = shuffled_labels()
    seeds = (0, 1, 2)
    skew = {
        alpha: np.mean([
            label_skew(labels, partition_indices(labels, spec("dirichlet", 10, s, alpha=alpha)))
            for s in seeds
        ])
        for alpha in (0.1, 0.3, 1.0, 100.0)
    }
    assert skew[0.1] > skew[0.3] > skew[1.0] > skew[100.0], skew
    assert skew[100.0] < 0.1  # nearly iid
    assert skew[0.1] > 0.5   # most clients dominated by a few classes


# ----- shard -------------------------------------------------------------------------


def _shards(labels: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """The label-sorted order (stable within a label) cut into 2N contiguous equal shards."""
    order = np.argsort(labels, kind="stable")
    size = len(labels) // (2 * num_partitions)
    return [np.sort(order[i * size:(i + 1) * size]) for i in range(2 * num_partitions)]


def _shard_ids_of(part: np.ndarray, shards: list[np.ndarray]) -> list[int]:
    members = set(part.tolist())
    return [i for i, shard in enumerate(shards) if members.issuperset(shard.tolist())]


@pytest.mark.parametrize("labels_fn", [sorted_labels, shuffled_labels], ids=["sorted", "shuffled"])
def test_shard_aligned_with_classes_gives_two_whole_classes(labels_fn) -> None:
    # 10 classes, 5 clients -> 10 shards of 600 = exactly one class each.
    labels = labels_fn()
    parts = partition_indices(labels, spec("shard", 5))
    shards = _shards(labels, 5)
    used = []
    for part in parts:
        ids = _shard_ids_of(part, shards)
        assert len(ids) == 2
        assert np.array_equal(np.sort(part), np.sort(np.concatenate([shards[i] for i in ids])))
        assert len(np.unique(labels[part])) == 2
        assert np.array_equal(np.sort(np.bincount(labels[part], minlength=NUM_CLASSES))[-2:], [600, 600])
        used += ids
    assert sorted(used) == list(range(10))  # every shard handed out exactly once


def test_shard_not_aligned_is_still_two_label_sorted_shards_per_client() -> None:
    # 7 clients -> 14 shards of floor(6000 / 14) = 428; each client is 2 whole shards.
    labels = shuffled_labels(3)
    parts = partition_indices(labels, spec("shard", 7, seed=4))
    shards = _shards(labels, 7)
    used = []
    for part in parts:
        assert len(part) == 2 * 428
        ids = _shard_ids_of(part, shards)
        assert len(ids) == 2, "client's data is not two label-sorted shards"
        assert np.array_equal(np.sort(part), np.sort(np.concatenate([shards[i] for i in ids])))
        assert len(np.unique(labels[part])) <= 4  # two shards, each spans at most 2 labels
        used += ids
    assert sorted(used) == list(range(14))
    # flwr-datasets' ShardPartitioner drops the len % 2N leftover samples (here 8).
    assert sum(len(p) for p in parts) == 6000 - 6000 % 14


# ----- pathological ------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_pathological_gives_exactly_k_classes_per_client(k: int, seed: int) -> None:
    labels = shuffled_labels()
    parts = partition_indices(labels, spec("pathological", 10, seed, classes_per_client=k))
    assert_disjoint(parts, len(labels))
    for part in parts:
        assert len(np.unique(labels[part])) == k


def test_pathological_k_equals_num_classes_is_every_class() -> None:
    labels = shuffled_labels()
    parts = partition_indices(labels, spec("pathological", 4, classes_per_client=NUM_CLASSES))
    for part in parts:
        assert len(np.unique(labels[part])) == NUM_CLASSES
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


def test_impossible_split_is_a_value_error() -> None:
    # 2 samples per class, but 5 partitions each need all 3 classes: cannot be split.
    labels = np.repeat(np.arange(3), 2)
    with pytest.raises(ValueError):
        partition_indices(labels, spec("pathological", 5, classes_per_client=3))


# ----- pairs (FedCOG's NIID-2) ---------------------------------------------------------


def test_pairs_ten_clients_hold_the_papers_class_pairs_in_equal_halves() -> None:
    labels = shuffled_labels()
    parts = partition_indices(labels, spec("pairs", 10, classes_per_client=2))
    assert_disjoint(parts, len(labels))
    # every sample is used: 5 pairs x 2 clients, each client half of each of its two classes
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    for i, part in enumerate(parts):
        counts = np.bincount(labels[part], minlength=NUM_CLASSES)
        pair = [2 * (i % 5), 2 * (i % 5) + 1]
        expected = np.zeros(NUM_CLASSES, dtype=np.int64)
        expected[pair] = PER_CLASS // 2
        assert np.array_equal(counts, expected), (i, counts)
    # clients i and i + 5 share a pair and hold disjoint halves of it
    for i in range(5):
        assert set(labels[parts[i]]) == set(labels[parts[i + 5]])


def test_pairs_class_groups_generalise_to_other_divisible_counts() -> None:
    assert class_groups(10, 2, 10) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]] * 2
    assert class_groups(10, 2, 5) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert class_groups(10, 5, 4) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] * 2
    assert class_groups(10, 1, 20) == [[c] for c in range(10)] * 2


def test_pairs_uneven_class_sizes_split_within_one_sample() -> None:
    labels = np.concatenate([np.repeat(np.arange(NUM_CLASSES), PER_CLASS), [3] * 7])  # class 3 has 607
    parts = partition_indices(labels, spec("pairs", 20, classes_per_client=2))  # 4 clients per pair
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    holders = [i for i, p in enumerate(parts) if 3 in labels[p]]
    assert holders == [1, 6, 11, 16]
    assert sorted(int((labels[parts[i]] == 3).sum()) for i in holders) == [151, 152, 152, 152]
    assert [int((labels[parts[i]] == 2).sum()) for i in holders] == [150] * 4


@pytest.mark.parametrize("num_partitions, k, words",
                         [(7, 2, "multiple of 5"), (10, 3, "divide"), (3, 5, "multiple of 2")])
def test_pairs_refuses_counts_that_do_not_divide(num_partitions: int, k: int, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        partition_indices(shuffled_labels(), spec("pairs", num_partitions, classes_per_client=k))


def test_pairs_config_refuses_classes_per_client_not_dividing_the_classes() -> None:
    from common.run.config import parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    with pytest.raises(ConfigError, match="classes-per-client"):
        parse_run_config({"partition": "pairs", "classes-per-client": 3}, SERVER_STRATEGIES)
    assert parse_run_config({"partition": "pairs", "classes-per-client": 5}, SERVER_STRATEGIES).partition == "pairs"


@pytest.mark.skipif(not (torchvision_files.DEBIAN_FASHION_MNIST / "train-labels-idx1-ubyte.gz").is_file()
                    and not (torchvision_files.DEBIAN_FASHION_MNIST / "train-labels-idx1-ubyte").is_file(),
                    reason="Fashion-MNIST (Debian package) not installed")
def test_pairs_on_fashion_mnist_gives_3000_of_each_of_two_classes() -> None:
    labels = load_dataset("fashion-mnist", "").y_train  # the Debian package's files
    parts = partition_indices(labels, spec("pairs", 10, classes_per_client=2))
    table = np.stack([np.bincount(labels[p], minlength=NUM_CLASSES) for p in parts])
    expected = np.zeros((10, NUM_CLASSES), dtype=np.int64)
    for i in range(10):
        expected[i, [2 * (i % 5), 2 * (i % 5) + 1]] = 3000
    assert np.array_equal(table, expected)


# ----- determinism -------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_spec_gives_identical_indices(scheme: str) -> None:
    labels = shuffled_labels()
    first = partition_indices(labels, spec(scheme, 5, seed=11))
    second = partition_indices(labels, spec(scheme, 5, seed=11))
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_pairs_different_seed_gives_different_halves_but_the_same_classes() -> None:
    labels = shuffled_labels()
    first = partition_indices(labels, spec("pairs", 10, seed=1))
    second = partition_indices(labels, spec("pairs", 10, seed=2))
    assert all(not np.array_equal(a, b) for a, b in zip(first, second))
    assert all(set(labels[a]) == set(labels[b]) for a, b in zip(first, second))


@pytest.mark.parametrize("scheme", ["dirichlet", "shard", "pathological"])
def test_different_seed_gives_different_indices(scheme: str) -> None:
    labels = shuffled_labels()
    first = partition_indices(labels, spec(scheme, 5, seed=1))
    second = partition_indices(labels, spec(scheme, 5, seed=2))
    assert any(not np.array_equal(a, b) for a, b in zip(first, second))


def test_iid_different_seed_gives_different_indices() -> None:
    labels = shuffled_labels()
    first = partition_indices(labels, spec("iid", 5, seed=1))
    second = partition_indices(labels, spec("iid", 5, seed=2))
    assert any(not np.array_equal(a, b) for a, b in zip(first, second))


def test_cache_key_depends_on_every_field() -> None:
    base = spec("dirichlet", 5, seed=0)
    assert base.cache_key() == spec("dirichlet", 5, seed=0).cache_key()
    variants = [
        PartitionSpec("mnist", "dirichlet", 5, 0),
        spec("iid", 5, 0),
        spec("dirichlet", 6, 0),
        spec("dirichlet", 5, 1),
        spec("dirichlet", 5, 0, alpha=0.1),
        spec("dirichlet", 5, 0, classes_per_client=3),
        spec("dirichlet", 5, 0, local_test_fraction=0.1),
    ]
    keys = {v.cache_key() for v in variants}
    assert len(keys) == len(variants) and base.cache_key() not in keys


# ----- split_local -------------------------------------------------------------------


@pytest.mark.parametrize("fraction,expected_test", [(0.0, 0), (0.2, 20), (0.25, 25), (0.5, 50)])
def test_split_local_is_disjoint_complete_and_respects_fraction(fraction: float, expected_test: int) -> None:
    indices = np.arange(1000, 1100, dtype=np.int64)[::-1].copy()
    train, test = split_local(indices, fraction, seed=3, partition_id=2)
    assert len(test) == expected_test
    assert len(train) == 100 - expected_test
    assert not set(train.tolist()) & set(test.tolist())
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.sort(indices))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)  # returned sorted


def test_split_local_is_seeded_per_partition() -> None:
    indices = np.arange(200)
    a = split_local(indices, 0.2, seed=0, partition_id=0)
    b = split_local(indices, 0.2, seed=0, partition_id=0)
    assert np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], split_local(indices, 0.2, seed=0, partition_id=1)[1])
    assert not np.array_equal(a[1], split_local(indices, 0.2, seed=1, partition_id=0)[1])


def test_split_local_always_keeps_one_training_sample() -> None:
    train, test = split_local(np.array([5, 9]), 0.9, seed=0, partition_id=0)
    assert len(train) == 1 and len(test) == 1
    train, test = split_local(np.array([7]), 0.5, seed=0, partition_id=0)
    assert train.tolist() == [7] and len(test) == 0


# ----- tiny datasets on disk ---------------------------------------------------------


def _idx_bytes(array: np.ndarray) -> bytes:
    magic = 0x00000800 | array.ndim  # 0x00000803 for images, 0x00000801 for labels
    header = struct.pack(">i", magic) + b"".join(struct.pack(">i", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_fake_idx(root: Path, folder: str = "FashionMNIST", n_train: int = 300, n_test: int = 40) -> dict[str, np.ndarray]:
    """Gzipped IDX files under root/<folder>/raw; images encode (index, label) so they can be traced."""
    rng = np.random.default_rng(123)
    y_train = np.tile(np.arange(NUM_CLASSES), n_train // NUM_CLASSES).astype(np.uint8)
    y_train = rng.permutation(y_train)
    y_test = (np.arange(n_test) % NUM_CLASSES).astype(np.uint8)
    x_train = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    x_train[:, 0, 0] = y_train  # a pixel that carries the label
    x_test = rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    arrays = {
        "train-images-idx3-ubyte": x_train,
        "train-labels-idx1-ubyte": y_train,
        "t10k-images-idx3-ubyte": x_test,
        "t10k-labels-idx1-ubyte": y_test,
    }
    for stem, arr in arrays.items():
        with gzip.open(raw / f"{stem}.gz", "wb") as handle:
            handle.write(_idx_bytes(arr))
    return arrays


def test_idx_header_matches_the_documented_magic_numbers(tmp_path: Path) -> None:
    images = _idx_bytes(np.zeros((2, 28, 28), np.uint8))
    labels = _idx_bytes(np.zeros(2, np.uint8))
    assert images[:4] == b"\x00\x00\x08\x03" and images[4:8] == b"\x00\x00\x00\x02"
    assert labels[:4] == b"\x00\x00\x08\x01"


def test_read_idx_plain_and_gzipped(tmp_path: Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "plain-idx3-ubyte").write_bytes(_idx_bytes(arr))
    with gzip.open(tmp_path / "zipped-idx3-ubyte.gz", "wb") as handle:
        handle.write(_idx_bytes(arr))
    assert np.array_equal(read_idx(tmp_path / "plain-idx3-ubyte"), arr)
    assert np.array_equal(read_idx(tmp_path / "zipped-idx3-ubyte.gz"), arr)


def test_read_idx_rejects_bad_magic_and_truncated_data(tmp_path: Path) -> None:
    good = _idx_bytes(np.zeros((2, 28, 28), np.uint8))
    (tmp_path / "bad-magic").write_bytes(b"\x00\x00\x0d\x03" + good[4:])  # float IDX
    (tmp_path / "short").write_bytes(good[:-5])
    with pytest.raises(ValueError, match="IDX"):
        read_idx(tmp_path / "bad-magic")
    with pytest.raises(ValueError, match="header"):
        read_idx(tmp_path / "short")


def test_load_fashion_mnist_from_idx_files(tmp_path: Path) -> None:
    arrays = write_fake_idx(tmp_path)
    data = load_dataset("fashion-mnist", tmp_path)
    assert data.x_train.shape == (300, 28, 28, 1) and data.x_train.dtype == np.uint8
    assert data.x_test.shape == (40, 28, 28, 1)
    assert data.y_train.dtype == np.int64 and data.y_test.dtype == np.int64
    assert np.array_equal(data.x_train[..., 0], arrays["train-images-idx3-ubyte"])
    assert np.array_equal(data.y_train, arrays["train-labels-idx1-ubyte"])
    assert np.array_equal(data.y_test, arrays["t10k-labels-idx1-ubyte"])
    assert data.info.num_classes == 10


def test_missing_idx_dataset_names_dir_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the Debian package's files (if installed on this machine) out of the lookup.
    monkeypatch.setattr(torchvision_files, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")
    empty = tmp_path / "empty-data-dir"
    empty.mkdir()
    for name, folder in (("fashion-mnist", "FashionMNIST"), ("mnist", "MNIST")):
        with pytest.raises(DatasetMissingError) as info:
            load_dataset(name, empty)
        message = str(info.value)
        assert str(empty / folder / "raw") in message
        assert "data-dir" in message
        for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
            assert stem in message
        assert "download=True" in message  # says how to obtain it
    assert issubclass(DatasetMissingError, FileNotFoundError)


def test_missing_one_idx_file_names_only_that_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchvision_files, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")
    write_fake_idx(tmp_path, folder="MNIST")
    os.remove(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DatasetMissingError) as info:
        load_dataset("mnist", tmp_path)
    assert "t10k-labels-idx1-ubyte" in str(info.value)
    assert "train-images-idx3-ubyte" not in str(info.value)


def _write_cifar10(root: Path, per_batch: int = 6, protocol: int = pickle.DEFAULT_PROTOCOL) -> tuple[np.ndarray, list[int]]:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(5)
    all_data, all_labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        batch = {b"batch_label": name.encode(), b"data": data, b"labels": labels,
                 b"filenames": [f"{name}-{i}.png".encode() for i in range(per_batch)]}
        (base / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        all_data.append(data)
        all_labels += labels
    return np.concatenate(all_data), all_labels


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
def test_load_cifar10_from_torchvision_folder(tmp_path: Path, protocol: int) -> None:
    raw, labels = _write_cifar10(tmp_path, protocol=protocol)
    data = load_dataset("cifar10", tmp_path)
    assert data.x_train.shape == (30, 32, 32, 3) and data.x_train.dtype == np.uint8
    assert data.x_test.shape == (6, 32, 32, 3)
    assert data.y_train.dtype == np.int64 and data.y_train.tolist() == labels[:30]
    assert data.y_test.tolist() == labels[30:]
    # Row layout is channel-major (1024 R, 1024 G, 1024 B), read as HWC.
    first = raw[0].reshape(3, 32, 32)
    assert np.array_equal(data.x_train[0, :, :, 0], first[0])
    assert np.array_equal(data.x_train[0, :, :, 2], first[2])
    assert data.x_train[0, 0, 1, 0] == raw[0][1] and data.x_train[0, 1, 0, 1] == raw[0][1024 + 32]


def test_missing_cifar10_names_dir_and_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissingError) as info:
        load_dataset("cifar10", tmp_path)
    message = str(info.value)
    assert str(tmp_path / "cifar-10-batches-py") in message
    for name in ["data_batch_1", "data_batch_5", "test_batch"]:
        assert name in message


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_cifar_pickle_with_forbidden_object_is_refused(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    evil = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": _Evil()}
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps(evil))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_dataset("cifar10", tmp_path)


def test_unknown_dataset_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="known"):
        load_dataset("imagenet", tmp_path)


# ----- load_client_data (cache) ------------------------------------------------------


def test_load_client_data_builds_cache_then_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchvision_files, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")
    arrays = write_fake_idx(tmp_path)
    s = PartitionSpec("fashion-mnist", "dirichlet", 3, seed=0, alpha=1.0, local_test_fraction=0.2)
    cache = tmp_path / "cache"
    first = load_client_data(s, 1, data_dir=str(tmp_path), cache_dir=str(cache))

    folder = partition_cache_folder(s, str(tmp_path), str(cache))
    for pid in range(3):
        assert (folder / f"client-{pid}.npz").is_file()
    assert (folder / "spec.json").is_file()
    assert not list(folder.glob("*.tmp"))

    # The client's data is exactly its partition, cut by split_local.
    y_all = arrays["train-labels-idx1-ubyte"].astype(np.int64)
    part = partition_indices(y_all, s)[1]
    train_idx, test_idx = split_local(part, 0.2, 0, 1)
    assert np.array_equal(first.y_train, y_all[train_idx])
    assert np.array_equal(first.y_test, y_all[test_idx])
    assert np.array_equal(first.x_train[..., 0], arrays["train-images-idx3-ubyte"][train_idx])
    assert first.x_train.shape[1:] == (28, 28, 1) and first.x_train.dtype == np.uint8
    assert np.array_equal(first.label_counts(10), np.bincount(y_all[train_idx], minlength=10))

    # Delete the raw data: later calls must come from the cache alone.
    for path in (tmp_path / "FashionMNIST" / "raw").iterdir():
        path.unlink()
    with pytest.raises(DatasetMissingError):
        load_dataset("fashion-mnist", tmp_path)
    again = load_client_data(s, 1, data_dir=str(tmp_path), cache_dir=str(cache))
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(again, key), getattr(first, key))
    other = load_client_data(s, 2, data_dir=str(tmp_path), cache_dir=str(cache))
    assert len(other.y_train) > 0
    assert not set(map(int, other.y_train)) - set(range(10))


@pytest.mark.parametrize("pid", [-1, 3, 7])
def test_load_client_data_rejects_partition_id_out_of_range(tmp_path: Path, pid: int) -> None:
    s = PartitionSpec("fashion-mnist", "iid", 3, seed=0)
    with pytest.raises(ValueError, match="partition-id"):
        load_client_data(s, pid, data_dir=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("dataset, channels", [("fashion-mnist", 1), ("cifar10", 3)])
def test_model_input_is_normalised_per_channel_in_nchw(dataset: str, channels: int) -> None:
    """SPEC 3.1: grey images Normalize(0.5, 0.5), CIFAR mean/std; computed on the tensors' device, exactly."""
    import torch

    from common.data.datasets import NORMALIZATION
    from common.metrics.evaluation import as_tensors

    images = np.zeros((2, 4, 5, channels), dtype=np.uint8)
    images[0, 1, 2, :] = 255
    images[1, 3, 4, -1] = 51
    x, y = as_tensors(images, np.array([3, 7]), dataset, torch.device("cpu"))
    mean, std = NORMALIZATION[dataset]
    assert x.shape == (2, channels, 4, 5) and x.dtype == torch.float32 and y.dtype == torch.int64
    expected = np.empty((2, channels, 4, 5), dtype=np.float32)
    for c in range(channels):
        expected[:, c] = (images[..., c].astype(np.float32) / np.float32(255.0) - np.float32(mean[c])) / np.float32(std[c])
    np.testing.assert_array_equal(x.numpy(), expected)
    if dataset == "fashion-mnist":  # by hand: 255 -> (1 - 0.5) / 0.5 = 1, 0 -> -1, 51 -> (0.2 - 0.5) / 0.5 = -0.6
        assert x[0, 0, 1, 2] == 1.0 and x[0, 0, 0, 0] == -1.0 and abs(float(x[1, 0, 3, 4]) + 0.6) < 1e-6


@pytest.mark.parametrize("dataset", ["fashion-mnist", "cifar10"])
def test_cpu_table_lookup_is_bitwise_the_arithmetic(dataset: str) -> None:
    """The CPU path looks values up in a 256-entry table per channel: every level, every channel, same bits."""
    import torch

    from common.data.datasets import NORMALIZATION
    from common.metrics.evaluation import as_tensors, to_model_input

    channels = len(NORMALIZATION[dataset][0])
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 16, 16, channels), dtype=np.uint8)
    images[0].reshape(-1, channels)[:256] = np.arange(256, dtype=np.uint8)[:, None]  # every level in every channel
    x, _ = as_tensors(images, np.zeros(7), dataset, torch.device("cpu"))
    expected = to_model_input(torch.tensor(images), dataset)
    assert x.shape == expected.shape and x.is_contiguous()
    assert torch.equal(x, expected)
