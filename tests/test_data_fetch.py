"""`fedsynth data fetch` against a local HTTP server serving small files in the official formats (issue 21)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import pickle
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from common.data.datasets import load_dataset
from fedsynth.cli import main
from fedsynth.data import FetchError, fetch_dataset
from fedsynth.loopback import free_ports
from tests.conftest import synthetic_images, write_idx_images, write_idx_labels


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/www; yields (folder, base URL)."""
    folder = tmp_path / "www"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _serve_mnist(folder: Path, seed: int = 0) -> tuple[list[tuple[str, str]], np.ndarray]:
    rng = np.random.default_rng(seed)
    y_train, y_test = rng.integers(0, 10, 50), rng.integers(0, 10, 20)
    files = {
        "train-images-idx3-ubyte.gz": lambda p: write_idx_images(p, synthetic_images(y_train, 1)),
        "train-labels-idx1-ubyte.gz": lambda p: write_idx_labels(p, y_train),
        "t10k-images-idx3-ubyte.gz": lambda p: write_idx_images(p, synthetic_images(y_test, 2)),
        "t10k-labels-idx1-ubyte.gz": lambda p: write_idx_labels(p, y_test),
    }
    resources = []
    for name, write in files.items():
        write(folder / name)
        resources.append((name, md5(folder / name)))
    return resources, y_train


@pytest.mark.parametrize("dataset,cls", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_fetch_writes_the_idx_layout_that_load_dataset_reads(tmp_path, server, monkeypatch, dataset, cls):
    import torchvision.datasets

    folder, url = server
    resources, y_train = _serve_mnist(folder)
    monkeypatch.setattr(getattr(torchvision.datasets, cls), "mirrors", [url])
    monkeypatch.setattr(getattr(torchvision.datasets, cls), "resources", resources)
    root = tmp_path / "data"
    assert main(["data", "fetch", dataset, str(root)]) == 0
    assert (root / cls / "raw" / "train-images-idx3-ubyte").is_file()
    data = load_dataset(dataset, root)
    assert data.x_train.shape == (50, 28, 28, 1) and data.x_test.shape == (20, 28, 28, 1)
    np.testing.assert_array_equal(data.y_train, y_train)


def _serve_cifar10(folder: Path) -> dict:
    rng = np.random.default_rng(0)
    batches = {f"data_batch_{i}": 6 for i in range(1, 6)} | {"test_batch": 4}
    buffer = io.BytesIO()
    md5s = {}
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, count in batches.items():
            blob = pickle.dumps({b"data": rng.integers(0, 256, (count, 3072)).astype(np.uint8),
                                 b"labels": rng.integers(0, 10, count).tolist()})
            md5s[name] = hashlib.md5(blob).hexdigest()
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    (folder / "cifar-10-python.tar.gz").write_bytes(buffer.getvalue())
    return {"md5s": md5s, "tgz_md5": md5(folder / "cifar-10-python.tar.gz")}


def test_fetch_cifar10_checks_the_archive_and_batches_and_loads(tmp_path, server, monkeypatch):
    import torchvision.datasets

    folder, url = server
    served = _serve_cifar10(folder)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", url + "cifar-10-python.tar.gz")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", served["tgz_md5"])
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "train_list",
                        [[f"data_batch_{i}", served["md5s"][f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "test_list", [["test_batch", served["md5s"]["test_batch"]]])
    data = fetch_dataset("cifar10", tmp_path / "data")
    assert data.x_train.shape == (30, 32, 32, 3) and data.x_test.shape == (4, 32, 32, 3)
    assert load_dataset("cifar10", tmp_path / "data").y_test.shape == (4,)


def test_a_wrong_checksum_is_refused(tmp_path, server, monkeypatch):
    import torchvision.datasets

    folder, url = server
    resources, _ = _serve_mnist(folder)
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", [url])
    monkeypatch.setattr(torchvision.datasets.MNIST, "resources", [(resources[0][0], "0" * 32), *resources[1:]])
    with pytest.raises(FetchError, match="could not download 'mnist'"):
        fetch_dataset("mnist", tmp_path / "data")


def test_offline_fetch_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    import torchvision.datasets

    (port,) = free_ports(1)  # nothing listens there: a refused connection, as without network
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", [f"http://127.0.0.1:{port}/"])
    assert main(["data", "fetch", "mnist", str(tmp_path / "data")]) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "Without network access" in err
