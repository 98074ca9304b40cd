"""Image datasets read from their torchvision on-disk formats, without downloading.

The machines this runs on often have no internet, so datasets are read from a
data directory laid out as torchvision lays it out (`<root>/FashionMNIST/raw/…`,
`<root>/cifar-10-batches-py/…`). Fashion-MNIST is also found in the Debian
package `dataset-fashion-mnist`. The readers are our own, small and strict:
torchvision's classes verify MD5 sums of the full files (so they refuse the small
test files written in the same format) and unpickle CIFAR batches with plain
`pickle`; ours accept only arrays, lists and dicts.

Images come back as uint8 arrays of shape (N, H, W, C) and labels as int64.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
from pathlib import Path

import numpy as np

from common.data.types import DatasetArrays, DatasetInfo, DatasetMissingError, builtin_info, default_data_dir

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

_IDX_FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_CIFAR = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) as used by MNIST and Fashion-MNIST."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        kind = "a gzipped IDX file" if path.suffix == ".gz" else "an IDX file"
        raise ValueError(f"{path} is not {kind} as expected ({type(err).__name__}: {err})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(data) - offset != expected:
        raise ValueError(f"{path} holds {len(data) - offset} bytes, header says {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def _find_idx(directories: list[Path], stem: str) -> Path | None:
    for directory in directories:
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _check_counts(images: np.ndarray, labels: np.ndarray, images_path: Path, labels_path: Path) -> None:
    if len(images) != len(labels):
        raise ValueError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels; "
                         "expected one label per image (the files are from different datasets or truncated)")


def check_images_and_labels(info: DatasetInfo, images: np.ndarray, labels: np.ndarray, images_path: Path,
                            labels_path: Path) -> None:
    """Images of the size the model is built for and labels in 0..num_classes-1, naming the file at fault.

    Otherwise the run fails deep in torch ("mat1 and mat2 shapes cannot be multiplied", "Target 255 is out of
    bounds") without saying which file is wrong.
    """
    if tuple(images.shape[1:3]) != (info.height, info.width):
        raise ValueError(f"{images_path} holds {images.shape[1]}x{images.shape[2]} images; dataset {info.name!r} "
                         f"and its models expect {info.height}x{info.width}")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= info.num_classes):
        raise ValueError(f"{labels_path} holds labels from {int(labels.min())} to {int(labels.max())}; dataset "
                         f"{info.name!r} has {info.num_classes} classes, so labels must be in 0..{info.num_classes - 1}")


def _load_idx_dataset(info: DatasetInfo, root: Path, explicit: bool = False) -> DatasetArrays:
    folder = _IDX_FOLDERS[info.name]
    directories = [root / folder / "raw", root / folder, root]
    if info.name == "fashion-mnist" and not explicit:  # an explicit data-dir is used as given
        directories.append(DEBIAN_FASHION_MNIST)
    found = {key: _find_idx(directories, stem) for key, stem in _IDX_FILES.items()}
    missing = [_IDX_FILES[key] for key, path in found.items() if path is None]
    if missing:
        hint = (
            "install the Debian package 'dataset-fashion-mnist' (apt-get install -y "
            "dataset-fashion-mnist) or "
            if info.name == "fashion-mnist"
            else ""
        )
        raise DatasetMissingError(
            f"dataset {info.name!r} not found: expected {', '.join(missing)} (optionally "
            f".gz) in {root / folder / 'raw'} (set by run config key 'data-dir'); {hint}"
            f"download it with torchvision.datasets.{folder}(root={str(root)!r}, download=True) "
            "on a machine with internet"
        )
    arrays = {key: read_idx(path) for key, path in found.items()}
    for split in ("train", "test"):
        _check_counts(arrays[f"x_{split}"], arrays[f"y_{split}"], found[f"x_{split}"], found[f"y_{split}"])
        if arrays[f"x_{split}"].ndim != 3:
            raise ValueError(f"{found[f'x_{split}']} holds arrays of shape {arrays[f'x_{split}'].shape}; "
                             "expected (N, 28, 28) images")
        check_images_and_labels(info, arrays[f"x_{split}"], arrays[f"y_{split}"], found[f"x_{split}"],
                                found[f"y_{split}"])
    return DatasetArrays(
        info,
        arrays["x_train"][..., None],
        arrays["y_train"].astype(np.int64),
        arrays["x_test"][..., None],
        arrays["y_test"].astype(np.int64),
    )


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickles CIFAR batches: dicts, lists, bytes and numpy arrays, nothing else."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle protocol
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset file")


def _read_cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        batch = _ArrayOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except pickle.UnpicklingError as err:
        raise pickle.UnpicklingError(f"{path}: {err}") from None
    except Exception as err:  # noqa: BLE001 - any parse failure: not a CIFAR batch
        raise ValueError(f"{path} is not a CIFAR python batch as expected ({type(err).__name__}: {err})") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = sorted(batch)[:5] if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"{path} is not a CIFAR python batch: expected a dict with keys b'data' and "
                         f"{label_key!r}, found {keys}")
    try:
        images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        labels = np.asarray(batch[label_key], dtype=np.int64).reshape(-1)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: b'data' is not N rows of 3x32x32 bytes or the labels are not integers ({err})") from None
    _check_counts(images, labels, path, path)
    return images, labels


def _load_cifar_dataset(info: DatasetInfo, root: Path) -> DatasetArrays:
    folder, train_files, test_files, label_key = _CIFAR[info.name]
    base = root / folder
    missing = [name for name in train_files + test_files if not (base / name).is_file()]
    if missing:
        cls = "CIFAR10" if info.name == "cifar10" else "CIFAR100"
        raise DatasetMissingError(
            f"dataset {info.name!r} not found: expected {', '.join(missing)} in {base} "
            f"(set by run config key 'data-dir'); download it with "
            f"torchvision.datasets.{cls}(root={str(root)!r}, download=True) on a machine "
            "with internet and copy the folder"
        )

    def read_all(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [_read_cifar_batch(base / name, label_key) for name in names]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    x_train, y_train = read_all(train_files)
    x_test, y_test = read_all(test_files)
    return DatasetArrays(info, x_train, y_train, x_test, y_test)


def load_torchvision_dataset(name: str, data_dir: str | os.PathLike = "") -> DatasetArrays:
    """Load a named torchvision dataset's official splits from `data_dir` (empty: the default places)."""
    info = builtin_info(name)
    explicit = bool(str(data_dir))
    root = Path(data_dir).expanduser() if explicit else default_data_dir()
    if explicit and not root.is_dir():
        raise DatasetMissingError(
            f"run config key 'data-dir' = {str(data_dir)!r}: {root} is not a directory; expected the torchvision "
            f"root holding dataset {name!r} (leave data-dir empty to use the default places)"
        )
    if info.name in _IDX_FOLDERS:
        return _load_idx_dataset(info, root, explicit)
    return _load_cifar_dataset(info, root)


def check_torchvision_present(name: str, data_dir: str = "") -> None:
    """Raise DatasetMissingError naming what is missing, without reading the files (a quick check at start)."""
    info = builtin_info(name)
    explicit = bool(str(data_dir))
    root = Path(data_dir).expanduser() if explicit else default_data_dir()
    if explicit and not root.is_dir():
        load_torchvision_dataset(name, data_dir)  # raises the error naming data-dir
    if info.name in _IDX_FOLDERS:
        folder = _IDX_FOLDERS[info.name]
        directories = [root / folder / "raw", root / folder, root]
        if info.name == "fashion-mnist" and not explicit:
            directories.append(DEBIAN_FASHION_MNIST)
        if any(_find_idx(directories, stem) is None for stem in _IDX_FILES.values()):
            _load_idx_dataset(info, root, explicit)  # raises the error naming the missing files
        return
    folder, train_files, test_files, _ = _CIFAR[info.name]
    if any(not (root / folder / f).is_file() for f in train_files + test_files):
        _load_cifar_dataset(info, root)
