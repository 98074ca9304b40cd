"""A process keeps the partition files it read (common/data/read_cache.py): read once, read again when the file
changed, read-only, bounded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from common.data import read_cache
from common.data.client_data import ClientData, write_atomic_npz
from common.data.partition import PartitionSpec, load_client_data, partition_cache_folder


@pytest.fixture(autouse=True)
def empty_cache():
    read_cache.clear()
    yield
    read_cache.clear()


def _write(path: Path, value: int) -> None:
    write_atomic_npz(path, x_train=np.full((3, 2, 2, 1), value, np.uint8), y_train=np.zeros(3, np.int64),
                     x_test=np.full((1, 2, 2, 1), value, np.uint8), y_test=np.zeros(1, np.int64))


def _counting_reader(calls: list[Path]):
    def read(path: Path) -> dict[str, np.ndarray]:
        calls.append(path)
        with np.load(path) as stored:
            return {key: stored[key] for key in stored.files}
    return read


def test_a_file_is_read_once_and_again_once_replaced(tmp_path: Path) -> None:
    path, calls = tmp_path / "client-0.npz", []
    _write(path, 1)
    first = read_cache.read_arrays(path, _counting_reader(calls))
    second = read_cache.read_arrays(path, _counting_reader(calls))
    assert len(calls) == 1 and second["x_train"] is first["x_train"]
    _write(path, 2)  # rebuilt: a new file under the same name
    third = read_cache.read_arrays(path, _counting_reader(calls))
    assert len(calls) == 2 and int(third["x_train"][0, 0, 0, 0]) == 2


def test_arrays_are_read_only(tmp_path: Path) -> None:
    path = tmp_path / "client-0.npz"
    _write(path, 1)
    arrays = read_cache.read_arrays(path, _counting_reader([]))
    with pytest.raises(ValueError, match="read-only"):
        arrays["x_train"][0] = 9
    assert int(read_cache.read_arrays(path, _counting_reader([]))["x_train"].max()) == 1


def test_copies_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [tmp_path / f"client-{i}.npz" for i in range(3)]
    for i, path in enumerate(paths):
        _write(path, i)
    one_file = sum(a.nbytes for a in read_cache.read_arrays(paths[0], _counting_reader([])).values())
    read_cache.clear()
    monkeypatch.setattr(read_cache, "MAX_BYTES", 2 * one_file)
    calls: list[Path] = []
    for path in paths:
        read_cache.read_arrays(path, _counting_reader(calls))
    assert read_cache.held_bytes() <= 2 * one_file
    read_cache.read_arrays(paths[0], _counting_reader(calls))  # the least recently used was dropped
    assert calls == [*paths, paths[0]]


def test_load_client_data_reads_the_cache_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = PartitionSpec("fashion-mnist", "iid", 2, 0)
    folder = partition_cache_folder(spec, "", str(tmp_path))
    folder.mkdir(parents=True)
    for pid in range(2):
        _write(folder / f"client-{pid}.npz", pid + 5)
    loads: list[object] = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    first = load_client_data(spec, 1, "", str(tmp_path))
    again = load_client_data(spec, 1, "", str(tmp_path))
    assert isinstance(again, ClientData) and len(loads) == 1
    assert np.array_equal(first.x_train, again.x_train) and int(again.x_test.max()) == 6
    os.remove(folder / "client-1.npz")
    _write(folder / "client-1.npz", 7)
    assert int(load_client_data(spec, 1, "", str(tmp_path)).x_train.max()) == 7 and len(loads) == 2
