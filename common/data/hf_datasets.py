"""Hugging Face datasets (`dataset = "hf:<repo>"`), loaded the way Flower users load them.

Flower users bring data through `flwr-datasets`' `FederatedDataset`, which opens
a dataset with `datasets.load_dataset` and splits its train split with a
partitioner. This module does the same with the project's partitioners
(common/data/partition.py) and turns the result into the uint8 (N, H, W, C) images
and int64 labels the apps train on, so that every other part of the project
(the per-node partition cache, central evaluation, FID) works unchanged.

Where the data comes from, first match wins:

1. `<data-dir>/<repo>` (or `<repo>` itself when it is an absolute path) holding
   a `DatasetDict.save_to_disk` folder (read through `datasets`' "arrow" builder),
   or files `datasets.load_dataset` can read from a folder (parquet, csv, an
   imagefolder tree with train/ and test/);
2. the Hugging Face Hub (or its local cache when `HF_HUB_OFFLINE=1`).

The image and label columns are found from the features (an `Image` feature, a
`ClassLabel` feature, or the usual names) unless the run config names them
(`hf-image-column`, `hf-label-column`). The test split is "test", else
"validation".
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.data.types import DatasetArrays, DatasetInfo, DatasetMissingError, default_data_dir

HF_PREFIX = "hf:"
IMAGE_NAMES = ("image", "img", "pixel_values", "images")
LABEL_NAMES = ("label", "labels", "fine_label", "class", "target", "y")
TEST_SPLITS = ("test", "validation", "valid")


def is_hf(name: str) -> bool:
    """Whether a dataset name refers to a Hugging Face dataset."""
    return name.startswith(HF_PREFIX)


@dataclass(frozen=True)
class HfSource:
    """A Hugging Face dataset and where to look for a local copy of it."""

    repo: str
    data_dir: str = ""
    image_column: str = ""
    label_column: str = ""

    @classmethod
    def from_name(cls, name: str, data_dir: str = "", image_column: str = "", label_column: str = "") -> "HfSource":
        """`hf:<repo>` and the run config's data-dir and column keys."""
        repo = name[len(HF_PREFIX):] if is_hf(name) else name
        if not repo:
            raise ValueError(f"dataset {name!r} names no repository; write hf:<owner>/<name> or hf:<folder>")
        return cls(repo, str(data_dir), image_column, label_column)

    def local_folder(self) -> Path | None:
        """The local copy, if there is one."""
        root = Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()
        folder = root / self.repo
        return folder if folder.is_dir() else None

    def load_kwargs(self) -> dict[str, Any]:
        """Arguments of `datasets.load_dataset` (and of `FederatedDataset`) for this source."""
        folder = self.local_folder()
        if folder is None:
            return {"path": self.repo}
        manifest = folder / "dataset_dict.json"
        if manifest.is_file():
            splits = json.loads(manifest.read_text())["splits"]
            return {"path": "arrow", "data_files": {
                split: sorted(str(p) for p in (folder / split).glob("*.arrow")) for split in splits
            }}
        if (folder / "state.json").is_file():
            raise DatasetMissingError(
                f"{folder} holds a single saved Dataset; save a DatasetDict with a train and a test split "
                "(DatasetDict(train=..., test=...).save_to_disk(folder))"
            )
        return {"path": str(folder)}

    def describe(self) -> str:
        """Where the data was looked for, for error messages."""
        root = Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()
        return f"{root / self.repo} (run config key 'data-dir') or the Hugging Face Hub repository {self.repo!r}"


def open_dataset(source: HfSource):
    """The dataset as a `datasets.DatasetDict`; DatasetMissingError when it cannot be found."""
    import datasets

    kwargs = source.load_kwargs()
    try:
        loaded = datasets.load_dataset(**kwargs)
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, bad files: all mean "not found here"
        raise DatasetMissingError(
            f"dataset 'hf:{source.repo}' could not be loaded from {source.describe()}: "
            f"{type(err).__name__}: {err}. Offline, save it on a machine with internet with "
            f"datasets.load_dataset({source.repo!r}).save_to_disk('<data-dir>/{source.repo}') and copy the folder"
        ) from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise DatasetMissingError(f"dataset 'hf:{source.repo}' did not load as a DatasetDict of splits")
    return loaded


def find_columns(features: Any, image_column: str = "", label_column: str = "") -> tuple[str, str]:
    """The image and the label column of a split's features: the given names, else found."""
    import datasets

    names = list(features)

    def pick(given: str, key: str, kinds: tuple[type, ...], usual: tuple[str, ...]) -> str:
        if given:
            if given not in features:
                raise ValueError(f"run config key '{key}' = {given!r} is not a column; columns: {', '.join(names)}")
            return given
        typed = [n for n in names if isinstance(features[n], kinds)]
        if len(typed) == 1:
            return typed[0]
        for name in usual:
            if name in features:
                return name
        raise ValueError(f"cannot tell which column is meant among {', '.join(names)}; set run config key '{key}'")

    image = pick(image_column, "hf-image-column", (datasets.Image,), IMAGE_NAMES)
    label = pick(label_column, "hf-label-column", (datasets.ClassLabel,), LABEL_NAMES)
    return image, label


def test_split(splits: list[str]) -> str:
    """The split used as the official test split."""
    for name in TEST_SPLITS:
        if name in splits:
            return name
    raise ValueError(f"the dataset has splits {', '.join(splits)}; a 'test' or 'validation' split is needed")


def _pixels(image: Any) -> np.ndarray:
    """One image as an array: PIL images in modes other than grey (L) and RGB are converted to RGB."""
    mode = getattr(image, "mode", None)
    if mode is not None and mode not in ("L", "RGB"):
        image = image.convert("RGB")
    return np.asarray(image)


def to_arrays(split: Any, image_column: str, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's images as uint8 (N, H, W, C) and its labels as int64."""
    images = [_pixels(image) for image in split[image_column]]
    shapes = {image.shape for image in images}
    if len(shapes) != 1:
        raise ValueError(f"column {image_column!r} holds images of several shapes {sorted(shapes)[:4]}; "
                         "resize them to one size first")
    x = np.stack(images) if images else np.zeros((0, 1, 1, 1), np.uint8)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"column {image_column!r}: images of shape {x.shape[1:]} are neither (H, W) grey "
                         "nor (H, W, 3) colour")
    if x.dtype != np.uint8:
        if x.size and (x.min() < 0 or x.max() > 255):
            raise ValueError(f"column {image_column!r}: pixel values outside 0..255")
        x = x.astype(np.uint8)
    y = np.asarray(split[label_column], dtype=np.int64)
    return x, y


@functools.lru_cache(maxsize=8)
def load_hf_arrays(source: HfSource) -> DatasetArrays:
    """The train and test splits as arrays (central evaluation, FID statistics)."""
    loaded = open_dataset(source)
    if "train" not in loaded:
        raise ValueError(f"dataset 'hf:{source.repo}' has splits {', '.join(loaded)}; a 'train' split is needed")
    image, label = find_columns(loaded["train"].features, source.image_column, source.label_column)
    x_train, y_train = to_arrays(loaded["train"], image, label)
    x_test, y_test = to_arrays(loaded[test_split(list(loaded))], image, label)
    info = _info(source, loaded, image, label, x_train.shape[1:], np.concatenate([y_train, y_test]))
    return DatasetArrays(info, x_train, y_train, x_test, y_test)


@functools.lru_cache(maxsize=8)
def hf_dataset_info(source: HfSource) -> DatasetInfo:
    """Shape facts of the dataset, from its features and its first training image."""
    loaded = open_dataset(source)
    train = loaded["train"]
    image, label = find_columns(train.features, source.image_column, source.label_column)
    first, _ = to_arrays(train.select(range(min(1, len(train)))), image, label)
    labels = np.concatenate([np.asarray(loaded[s][label], dtype=np.int64) for s in loaded])
    return _info(source, loaded, image, label, first.shape[1:], labels)


def _info(source: HfSource, loaded: Any, image: str, label: str, shape: tuple[int, ...], labels: np.ndarray) -> DatasetInfo:
    import datasets

    feature = loaded["train"].features[label]
    if isinstance(feature, datasets.ClassLabel):
        num_classes = feature.num_classes
    else:
        if labels.size and labels.min() < 0:
            raise ValueError(f"column {label!r} holds negative labels")
        num_classes = int(labels.max()) + 1 if labels.size else 1
    height, width, channels = shape
    return DatasetInfo(HF_PREFIX + source.repo, channels, height, width, num_classes)


def federated_dataset(source: HfSource, partitioner: Any, seed: int):
    """flwr-datasets' FederatedDataset over this source, its train split cut by `partitioner`."""
    from flwr_datasets import FederatedDataset

    kwargs = source.load_kwargs()
    path = kwargs.pop("path")
    return FederatedDataset(dataset=path, partitioners={"train": partitioner}, shuffle=True, seed=seed, **kwargs)
