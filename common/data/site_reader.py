"""Reading a site's folder in whichever format it holds (`partition = "node"`), or refusing it naming the path.

`detect_format` tells the formats apart (an imagefolder tree, a `datasets`
`save_to_disk` folder, parquet or csv files, a torchvision root), `read_site`
reads the train and test splits, bringing every image to the site's channels
and side (`to_eight_bit_image` keeps 16-bit, float and palette images on their
real range) and every label into the federation's `LabelSpace`. What a folder
loads as is fixed by its `SiteSpec`; `common.data.site_data` builds it from the
run config and caches what is read. Any fault raises `SiteDataError` naming
the node and the file.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.data.types import DATASETS
from common.data.torchvision_files import check_torchvision_present, load_torchvision_dataset

TEST_SPLITS = ("test", "validation", "valid")
FORMATS = ("imagefolder", "save_to_disk", "parquet", "csv", "torchvision")


class SiteDataError(ValueError):
    """A node's own data cannot be used; the message names the node and the problem."""


@dataclass(frozen=True)
class LabelSpace:
    """The federation's classes: ids 0..num_classes-1, named by `class_names` when given."""

    num_classes: int
    class_names: tuple[str, ...] = ()

    def label_of(self, value: Any) -> int | None:
        """The id of a label (an id, a class name, or an id written as text); None when outside the space."""
        if isinstance(value, (bool, np.bool_)):
            return None
        if isinstance(value, (int, np.integer)):
            return int(value) if 0 <= int(value) < self.num_classes else None
        if isinstance(value, (float, np.floating)):  # a float column (pandas makes one of ints with a gap): whole ids
            return self.label_of(int(value)) if math.isfinite(value) and float(value).is_integer() else None
        if isinstance(value, str):
            if self.class_names:
                return self.class_names.index(value) if value in self.class_names else None
            text = value.strip()
            return self.label_of(int(text)) if text.isdigit() else None
        return None

    def describe(self) -> str:
        """The space in words, for error messages."""
        if self.class_names:
            return f"class-names {', '.join(self.class_names)}"
        return f"ids 0..{self.num_classes - 1}"


@dataclass(frozen=True)
class SiteSpec:
    """Everything that determines what a site's folder loads as; with the folder's fingerprint, the cache key."""

    path: str
    dataset: str  # the run's dataset: a named one enables the torchvision layout
    channels: int
    side: int
    num_classes: int
    class_names: tuple[str, ...]
    local_test_fraction: float
    seed: int
    image_column: str = ""
    label_column: str = ""

    @property
    def labels(self) -> LabelSpace:
        return LabelSpace(self.num_classes, self.class_names)


@dataclass
class _Split:
    x: np.ndarray
    y: np.ndarray


def eight_bit(array: np.ndarray) -> np.ndarray:
    """Pixel values as uint8 on their real range: 16-bit values / 257 (rounded), floats in [0, 1] * 255.

    uint8 stays as it is; other integers and floats must already be in 0..255 (ValueError otherwise), so no
    value is clipped or wrapped silently. A trailing channel axis of 1 is dropped (Pillow's grey images).
    """
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.dtype == np.uint8:
        return array
    if array.dtype == np.uint16:
        return np.rint(array.astype(np.float64) / 257.0).astype(np.uint8)
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise ValueError(f"pixels of type {array.dtype} are not numbers")
    if array.size and not np.isfinite(array).all():
        raise ValueError("pixel values are not all finite")
    if np.issubdtype(array.dtype, np.floating) and array.size and array.min() >= 0 and array.max() <= 1:
        return np.rint(array.astype(np.float64) * 255.0).astype(np.uint8)
    if array.size and (array.min() < 0 or array.max() > 255):
        raise ValueError(f"pixel values {array.min()}..{array.max()} are outside 0..255 (and not 16-bit)")
    return np.rint(array).astype(np.uint8)


def to_eight_bit_image(image: Any) -> Any:
    """A PIL image with 8 bits per channel, its values kept on their real range.

    Pillow's `convert("L")` clips 16-bit greys ("I;16") and 32-bit ("I") or float ("F") values at 255, so
    a 16-bit PNG came out all white. Those modes go through `eight_bit`: 16-bit values (and "I" values
    within 0..65535, how Pillow reads some 16-bit files) divided by 257; a palette image through RGBA
    (its palette's colours, transparency expressed in bytes included). Other modes are left to `convert`.
    """
    from PIL import Image

    if image.mode.startswith("I;16"):
        return Image.fromarray(eight_bit(np.asarray(image).astype(np.uint16)))
    if image.mode == "I":
        values = np.asarray(image)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ValueError(f"32-bit pixel values {values.min()}..{values.max()} are outside 0..65535")
        return Image.fromarray(eight_bit(values.astype(np.uint16)))
    if image.mode == "F":
        return Image.fromarray(eight_bit(np.asarray(image)))
    if image.mode in ("P", "PA"):
        return image.convert("RGBA")
    return image


class _Loader:
    """Reads one folder for one node: images converted and resized, labels mapped, errors naming the node."""

    def __init__(self, spec: SiteSpec, node: str) -> None:
        self.spec = spec
        self.node = node

    def fail(self, problem: str) -> SiteDataError:
        return SiteDataError(f"node {self.node!r}: {problem}")

    # --- one image, one label ---------------------------------------------------------
    def pixels(self, image: Any, where: str) -> np.ndarray:
        """A PIL image, an encoded image or an array as uint8 (side, side, channels)."""
        import io

        from PIL import Image, UnidentifiedImageError
        from torchvision.transforms.functional import resize

        try:
            with warnings.catch_warnings():  # an image above Pillow's pixel limit is refused, not decoded
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                if isinstance(image, Mapping):  # the datasets Image feature, undecoded: {"bytes": ..., "path": ...}
                    image = image.get("bytes") or image.get("path")
                if isinstance(image, (bytes, bytearray)):
                    image = Image.open(io.BytesIO(image))
                elif isinstance(image, (str, os.PathLike)):
                    image = Image.open(image)
                elif not isinstance(image, Image.Image):
                    image = Image.fromarray(eight_bit(np.asarray(image)))
                image = to_eight_bit_image(image).convert("L" if self.spec.channels == 1 else "RGB")
            if image.size != (self.spec.side, self.spec.side):
                image = resize(image, [self.spec.side, self.spec.side], antialias=True)
            array = np.asarray(image, dtype=np.uint8)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise self.fail(f"{where} is refused as a decompression bomb ({err}); images above Pillow's "
                            f"Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS} pixels are not decoded") from None
        except (OSError, UnidentifiedImageError, ValueError, TypeError, SyntaxError, EOFError, MemoryError) as err:
            raise self.fail(f"{where} cannot be decoded as an image ({type(err).__name__}: {err})") from None
        return array[..., None] if array.ndim == 2 else array

    def label(self, value: Any, where: str) -> int:
        label = self.spec.labels.label_of(value)
        if label is not None:
            return label
        if value is None or (isinstance(value, (float, np.floating)) and math.isnan(value)):
            raise self.fail(f"{where} has no label (value {value!r}): fill it in or remove the row")
        if isinstance(value, (float, np.floating)) and not float(value).is_integer():
            raise self.fail(f"label {value!r} of {where} is not a whole class id "
                            f"({self.spec.labels.describe()})")
        raise self.fail(f"label {value!r} of {where} is outside the federation's label space "
                        f"({self.spec.labels.describe()}; run config keys 'class-names' / 'num-classes')")

    def stack(self, images: list[np.ndarray], labels: list[int]) -> _Split:
        side, channels = self.spec.side, self.spec.channels
        x = np.stack(images) if images else np.zeros((0, side, side, channels), np.uint8)
        return _Split(x, np.asarray(labels, dtype=np.int64))

    # --- formats --------------------------------------------------------------------------
    def imagefolder(self, root: Path) -> _Split:
        """One split of an imagefolder tree: `root/<class>/**/<image>`, read as torchvision's ImageFolder would.

        Unlike torchvision's `make_dataset` (which follows every symlink), links are followed only where they
        stay inside the site folder, and a folder is never read twice (`class_images`).
        """
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        images, labels = [], []
        for name in classes:
            label = self.label(name, f"class folder {root / name}")
            for path in self.class_images(root / name):
                images.append(self.pixels(path, path))
                labels.append(label)
        return self.stack(images, labels)

    def class_images(self, folder: Path) -> list[Path]:
        """The image files under one class folder, sorted; SiteDataError naming the path for a link that lies.

        A symlink is followed only when its target is inside the site folder and, for a folder, inside this
        class folder: a link out of the site, a loop (a link to a folder that holds it), a second way into a
        folder already read, or a link into another class's folder (its images under this label) is refused,
        as is a link whose target does not exist. A loop once made a site train on 984 images instead of 24.
        """
        from torchvision.datasets.folder import IMG_EXTENSIONS

        site = Path(os.path.realpath(Path(self.spec.path).expanduser()))
        own = Path(os.path.realpath(folder))
        if not own.is_relative_to(site):
            raise self.fail(f"class folder {folder} links to {own}, outside the site folder {site}; copy the "
                            "images into the site folder (links that leave it are not followed)")
        seen = {own}
        found: list[Path] = []
        pending = [folder]
        while pending:
            directory = pending.pop()
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                path = Path(entry.path)
                if entry.is_symlink():
                    target = Path(os.path.realpath(path))
                    if not target.exists():
                        raise self.fail(f"{path} is a symlink to {target}, which does not exist (or is a loop)")
                    if not target.is_relative_to(site):
                        raise self.fail(f"{path} is a symlink to {target}, outside the site folder {site}; "
                                        "copy the file into the site folder (links that leave it are not followed)")
                    if target.is_dir():
                        if path.is_relative_to(target) or Path(os.path.realpath(directory)).is_relative_to(target):
                            raise self.fail(f"{path} is a symlink loop: it points to {target}, which holds it")
                        if not target.is_relative_to(own):
                            raise self.fail(f"{path} is a symlink to {target}, outside its class folder {folder}: "
                                            "its images would be read under this class's label")
                if entry.is_dir():
                    real = Path(os.path.realpath(path))
                    if real in seen:
                        raise self.fail(f"{path} leads to {real}, a folder already read (a symlink loop or a "
                                        "second link to it): each image would be read twice")
                    seen.add(real)
                    pending.append(path)
                elif entry.is_file() and entry.name.lower().endswith(IMG_EXTENSIONS):
                    found.append(path)
        return sorted(found)

    def table(self, table: Any, where: str) -> _Split:
        """A `datasets.Dataset`: its image and label columns."""
        import datasets

        from common.data.hf_datasets import find_columns

        try:
            image, label = find_columns(table.features, self.spec.image_column, self.spec.label_column)
        except ValueError as err:
            raise self.fail(f"{where}: {err}") from None
        feature = table.features[label]
        names = feature.names if isinstance(feature, datasets.ClassLabel) and self.spec.class_names else None
        undecoded = table.cast_column(image, datasets.Image(decode=False)) if isinstance(
            table.features[image], datasets.Image) else table
        images, labels = [], []
        for index, row in enumerate(undecoded):
            at = f"row {index} of {where}"
            value = row[label]
            labels.append(self.label(names[value] if names is not None and isinstance(value, int) else value, at))
            cell = row[image]
            if isinstance(cell, str) and not os.path.isabs(cell):  # a csv's relative path
                cell = str(Path(where).parent / cell)
            images.append(self.pixels(cell, at))
        return self.stack(images, labels)

    def saved(self, folder: Path) -> tuple[_Split | None, _Split | None]:
        import datasets

        try:
            loaded = datasets.load_from_disk(str(folder))
        except Exception as err:  # noqa: BLE001 - any failure to open means an unreadable folder
            raise self.fail(f"{folder} cannot be read as a save_to_disk folder ({type(err).__name__}: {err})") from None
        if isinstance(loaded, datasets.Dataset):
            return self.table(loaded, str(folder)), None
        test = next((name for name in TEST_SPLITS if name in loaded), None)
        unknown = [name for name in loaded if name not in ("train", test)]
        if unknown:
            raise self.fail(f"{folder} holds splits {', '.join(loaded)}; expected 'train' and optionally 'test' "
                            "(or 'validation')")
        return (self.table(loaded["train"], f"{folder} split 'train'") if "train" in loaded else None,
                self.table(loaded[test], f"{folder} split {test!r}") if test else None)

    def files(self, paths: list[Path], kind: str) -> tuple[_Split | None, _Split | None]:
        test = [p for p in paths if p.name.lower().startswith(TEST_SPLITS)]
        train = [p for p in paths if p not in test]
        return (self._read_files(train, kind) if train else None), (self._read_files(test, kind) if test else None)

    def _read_files(self, paths: list[Path], kind: str) -> _Split:
        import datasets

        parts = []
        for path in paths:
            try:
                if kind == "parquet":
                    import pyarrow.parquet as pq

                    table = datasets.Dataset(pq.read_table(path))
                else:
                    import pandas as pd

                    table = datasets.Dataset.from_pandas(pd.read_csv(path), preserve_index=False)
            except Exception as err:  # noqa: BLE001 - any parse failure: an unreadable file
                raise self.fail(f"{path} cannot be read as {kind} ({type(err).__name__}: {err})") from None
            parts.append(self.table(table, str(path)))
        return _Split(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]))

    def torchvision(self, root: Path) -> tuple[_Split, _Split]:
        data = load_torchvision_dataset(self.spec.dataset, root)
        for value in np.unique(np.concatenate([data.y_train, data.y_test])):
            self.label(int(value), f"{root} ({self.spec.dataset})")

        def fitted(x: np.ndarray) -> np.ndarray:
            if x.shape[1:] == (self.spec.side, self.spec.side, self.spec.channels):
                return x
            return np.stack([self.pixels(image, str(root)) for image in x])

        return _Split(fitted(data.x_train), data.y_train), _Split(fitted(data.x_test), data.y_test)


def detect_format(path: Path, dataset: str = "") -> str:
    """Which of FORMATS a node's `dataset-path` holds; ValueError saying what was found otherwise."""
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".parquet", ".csv"):
            return suffix[1:]
        raise ValueError(f"{path} is a file but not .parquet or .csv")
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return "save_to_disk"
    if (path / "train").is_dir() or (path / "test").is_dir():
        return "imagefolder"
    names = sorted(entry.name for entry in os.scandir(path))
    if any(name.lower().endswith(".parquet") for name in names):
        return "parquet"
    if any(name.lower().endswith(".csv") for name in names):
        return "csv"
    if dataset in DATASETS:
        try:
            check_torchvision_present(dataset, str(path))
            return "torchvision"
        except (OSError, ValueError):
            pass
    if any(name.startswith("partition_") for name in names):
        raise ValueError(f"{path} holds {', '.join(n for n in names if n.startswith('partition_'))[:200]}: "
                         "`flwr-datasets create` output; point each node at one partition_<i> folder (in "
                         "simulation: dataset-path = \".../partition_{partition-id}\")")
    if not names:
        raise ValueError(f"{path} is empty")
    raise ValueError(f"{path} holds none of the formats a node reads (an imagefolder tree train/<class>/..., a "
                     f"save_to_disk folder, parquet or csv files, or {dataset!r} in torchvision's layout); found: "
                     + ", ".join(names[:8]))


def folder_fingerprint(path: Path) -> str:
    """A hash of every file's relative path, size and modification time under `path` (or of the file)."""
    digest = hashlib.sha256()
    entries: Iterable[Path] = [path] if path.is_file() else (
        Path(root) / name for root, _, names in os.walk(path) for name in names)
    for entry in sorted(entries):
        stat = entry.stat() if entry.exists() else entry.lstat()  # a broken link is refused when read, not here
        digest.update(f"{entry.relative_to(path) if entry != path else entry.name}\0{stat.st_size}\0"
                      f"{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def read_site(spec: SiteSpec, node: str) -> tuple[_Split | None, _Split | None]:
    """The (train, test) splits of a folder, decoded; None for a split the folder does not have."""
    path = Path(spec.path).expanduser()
    loader = _Loader(spec, node)
    if not str(spec.path):
        raise loader.fail("no dataset-path: start the SuperNode with --node-config \"dataset-path=<folder>\" "
                          "(or set run config key 'dataset-path')")
    if not path.exists():
        raise loader.fail(f"dataset-path {path} does not exist")
    if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
        raise loader.fail(f"dataset-path {path} is not readable by this SuperNode's user")
    try:
        kind = detect_format(path, spec.dataset)
    except (OSError, ValueError) as err:
        raise loader.fail(str(err)) from None
    if kind == "imagefolder":
        return tuple(loader.imagefolder(path / split) if (path / split).is_dir() else None  # type: ignore[return-value]
                     for split in ("train", "test"))
    if kind == "save_to_disk":
        return loader.saved(path)
    if kind in ("parquet", "csv"):
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix.lower() == f".{kind}")
        return loader.files(files, kind)
    return loader.torchvision(path)


def site_arrays(spec: SiteSpec, node: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(x_train, y_train, x_test, y_test) of a node's folder (test None: it has no test split)."""
    train, test = read_site(spec, node)
    if train is None or len(train.y) == 0:
        where = Path(spec.path).expanduser()
        raise SiteDataError(f"node {node!r}: dataset-path {where} holds no training images"
                            + (" (no train/ folder or train split)" if train is None else ""))
    return train.x, train.y, (test.x if test else None), (test.y if test else None)
