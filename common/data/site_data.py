"""A site's own data (`partition = "node"`): the folder a SuperNode holds, loaded as it is, never partitioned.

In a real deployment every SuperNode trains on what it holds. Its node config
names the data (`dataset-path`, Flower's convention); in simulation a run-config
template (`/data/sites/{partition-id}`) gives each virtual node its folder, so
a user can try the sites' layout on one machine first. The formats:

- an imagefolder tree: `train/<class>/<image>` and optionally `test/<class>/...`
  (read as torchvision's ImageFolder reads it, but following a symlink only
  inside the site folder and its class folder: a link out of the site, a loop,
  or a link into another class's folder is refused naming the path);
- a `datasets` `save_to_disk` folder: a Dataset (what `flwr-datasets create`
  writes for each partition, `partition_<i>/`) or a DatasetDict with `train` and
  optionally `test`/`validation`;
- parquet or csv files with an image and a label column: files named `test*`
  or `validation*` are the test split, the others the training split (a csv's
  image column holds paths relative to the csv file);
- the papers' on-disk layouts: a torchvision root holding the run's named
  dataset (`FashionMNIST/raw/`, `cifar-10-batches-py/`), its two splits.

This module turns the run config into a site's settings (`site_spec`) and
loads it with a cache; `common.data.site_reader` reads the folder itself.

The sites agree on one label space from the run config (`class-names`, or a
class count); a site may hold a subset of the classes. Class folder names and
string labels map to ids through `class-names`, so two sites agree on ids.
Every image is converted to the run's channels and resized to its square
`image-size` on load. A site without a test split gets a seeded
`local-test-fraction` cut of its training data.

Images are read on their real range: 16-bit greys (divided by 257, rounded),
32-bit and float values, and palette images are converted without clipping
(`to_eight_bit_image`). An image above Pillow's decompression-bomb limit
(`Image.MAX_IMAGE_PIXELS`) is refused before it is decoded.

A node whose folder is missing, unreadable or empty, whose images cannot be
decoded, or whose labels are missing (NaN), not whole numbers or outside the
label space raises `SiteDataError` with a message naming the node, the file
and, in a table, the row and its value; the node fails the handshake with it.

Every ClientApp message of a deployment runs in a new process, so the decoded
arrays are cached under the node's `cache-dir`, keyed by the loading settings
and a fingerprint of the folder (every file's path, size and modification
time): a changed folder is read again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from common.data.client_data import ClientData, default_cache_dir, split_local, write_atomic_npz
from common.data.site_reader import LabelSpace, SiteDataError, SiteSpec, folder_fingerprint, read_site, site_arrays
from common.data.types import DATASETS, DatasetInfo, builtin_info

CACHE_VERSION = 2  # 2: 16-bit and palette images on their real range, links checked (issue 47)
PATH_TEMPLATE_FIELD = "{partition-id}"


def parse_class_names(text: str) -> tuple[str, ...]:
    """`class-names` ("cat, dog") as a tuple of names, without empty entries."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def node_shape_info(cfg: Any) -> DatasetInfo:
    """Shape facts of a `partition = node` run, from its run config alone (no data is opened).

    `image-channels`, `image-size` and the class count (`class-names`, `num-classes`) default to the
    named dataset's; with `dataset = "own"` they must be given. ValueError names the missing key.
    """
    named = builtin_info(cfg.dataset) if cfg.dataset in DATASETS else None
    names = parse_class_names(cfg.class_names)
    if names and len(set(names)) != len(names):
        raise ValueError(f"run config key 'class-names' names a class twice: {cfg.class_names!r}")
    if names and cfg.num_classes and cfg.num_classes != len(names):
        raise ValueError(f"run config key 'num-classes' = {cfg.num_classes} but 'class-names' names {len(names)} "
                         "classes; give one of them")
    num_classes = len(names) or cfg.num_classes or (named.num_classes if named else 0)
    channels = cfg.image_channels or (named.channels if named else 0)
    side = cfg.image_size or (named.height if named else 0)
    missing = [key for key, value in (("class-names' or 'num-classes", num_classes), ("image-channels", channels),
                                      ("image-size", side)) if not value]
    if missing:
        raise ValueError(f"partition = node with dataset = {cfg.dataset!r} needs run config key(s) "
                         + ", ".join(f"'{key}'" for key in missing)
                         + " (the shape every site's images are brought to; a named dataset gives them)")
    if channels not in (1, 3):
        raise ValueError(f"run config key 'image-channels' = {channels} is invalid; accepted: 1 (grey) or 3 (colour)")
    if num_classes < 2:
        raise ValueError(f"partition = node needs at least 2 classes; got {num_classes}")
    return DatasetInfo(cfg.dataset, channels, side, side, num_classes)


def run_label_space(cfg: Any) -> LabelSpace:
    """The federation's label space of a `partition = node` run."""
    return LabelSpace(node_shape_info(cfg).num_classes, parse_class_names(cfg.class_names))


def fill_path_template(template: str, node_config: Mapping[str, Any]) -> str:
    """`dataset-path` with `{partition-id}` replaced by the node's partition id (simulation's per-node folders)."""
    if PATH_TEMPLATE_FIELD not in template:
        return template
    if "partition-id" not in node_config:
        raise ValueError(f"dataset-path {template!r} holds {PATH_TEMPLATE_FIELD}, but this node's config has no "
                         "'partition-id' (give the node its own --node-config \"dataset-path=...\")")
    return template.replace(PATH_TEMPLATE_FIELD, str(node_config["partition-id"]))


def site_key(name: str) -> int:
    """A stable non-negative 31-bit id for a node known only by its name (it stands in for a partition id)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF



def site_spec(cfg: Any, path: str, info: DatasetInfo | None = None) -> SiteSpec:
    """The loading settings of a folder under a run config (shape facts: `info`, else the run config's)."""
    info = info or node_shape_info(cfg)
    return SiteSpec(
        path=str(path), dataset=cfg.dataset, channels=info.channels, side=info.height, num_classes=info.num_classes,
        class_names=parse_class_names(cfg.class_names), local_test_fraction=cfg.local_test_fraction, seed=cfg.seed,
        image_column=cfg.hf_image_column, label_column=cfg.hf_label_column,
    )


def load_site_data(spec: SiteSpec, node: str, cache_dir: str = "") -> ClientData:
    """A node's train and test split from its own folder (cached; a seeded cut when it has no test split)."""
    path = Path(spec.path).expanduser()
    key = None
    if str(spec.path) and path.exists() and os.access(path, os.R_OK):
        text = json.dumps({**spec.__dict__, "fingerprint": folder_fingerprint(path), "version": CACHE_VERSION},
                          sort_keys=True)
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        cached = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / "sites" / f"{key}.npz"
        if cached.is_file():
            try:
                with np.load(cached, allow_pickle=False) as stored:
                    return ClientData(**{k: stored[k] for k in ("x_train", "y_train", "x_test", "y_test")})
            except Exception:  # noqa: BLE001 - a damaged cache file is read again from the folder
                pass
    x_train, y_train, x_test, y_test = site_arrays(spec, node)
    if x_test is None:
        train_idx, test_idx = split_local(np.arange(len(y_train)), spec.local_test_fraction, spec.seed, 0)
        data = ClientData(x_train[train_idx], y_train[train_idx], x_train[test_idx], y_train[test_idx])
    else:
        data = ClientData(x_train, y_train, x_test, y_test)
    if key is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic_npz(cached, **data.__dict__)
    return data


def load_test_set(spec: SiteSpec, node: str = "server") -> tuple[np.ndarray, np.ndarray]:
    """A test set by path (central evaluation): the folder's test split, else its only split."""
    train, test = read_site(spec, node)
    chosen = test if test is not None and len(test.y) else train
    if chosen is None or len(chosen.y) == 0:
        raise SiteDataError(f"{node}: central-test-path {Path(spec.path).expanduser()} holds no images")
    return chosen.x, chosen.y
