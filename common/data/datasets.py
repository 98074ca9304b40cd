"""Which source a dataset's name means, and its shape facts and arrays from that source.

A name from DATASETS is read from torchvision's on-disk formats (common/data/torchvision_files.py), an
`hf:<repo>` name through flwr-datasets (common/data/hf_datasets.py), and a run with `partition = "node"`
takes its shape facts from the run config, since each site reads its own folder (common/data/site_data.py).
`run_dataset_info` and `load_run_dataset` take a run config and pass its data-dir and column keys along.

Images come back as uint8 arrays of shape (N, H, W, C) and labels as int64.
"""

from __future__ import annotations

import os

from common.data.types import (
    DATASETS, NORMALIZATION, DatasetArrays, DatasetInfo, DatasetMissingError, builtin_info, default_data_dir,
    normalization,
)
from common.data.hf_datasets import HfSource, hf_dataset_info, load_hf_arrays
from common.data.site_data import node_shape_info, parse_class_names
from common.data.torchvision_files import check_torchvision_present, load_torchvision_dataset

__all__ = [  # the data layer's types too: the apps import everything about datasets from here
    "DATASETS", "NORMALIZATION", "DatasetArrays", "DatasetInfo", "DatasetMissingError", "check_dataset_present",
    "dataset_info", "default_data_dir", "load_dataset", "load_run_dataset", "normalization", "run_dataset_info",
]


def dataset_info(name: str, data_dir: str | os.PathLike = "", image_column: str = "", label_column: str = "") -> DatasetInfo:
    """Shape facts of a dataset by name (an `hf:` dataset is opened to find them)."""
    if name.startswith("hf:"):
        return hf_dataset_info(HfSource.from_name(name, str(data_dir), image_column, label_column))
    return builtin_info(name)


def run_dataset_info(cfg, data_dir: str | None = None) -> DatasetInfo:
    """Shape facts of a run's dataset (its data-dir, or `data_dir`, and its hf column keys).

    With `partition = "node"` they come from the run config alone (common/data/site_data.py): the sites'
    folders differ and the server holds none of them. An `hf:` dataset's come from the run config
    when it gives all of them (`image-channels`, `image-size`, `num-classes` or `class-names`), else
    from the dataset.
    """
    if getattr(cfg, "partition", "") == "node":
        return node_shape_info(cfg)
    if cfg.dataset.startswith("hf:") and cfg.image_channels and cfg.image_size and (cfg.num_classes or cfg.class_names):
        # given in the run config: nobody opens the dataset to learn them (a server without data)
        num_classes = cfg.num_classes or len(parse_class_names(cfg.class_names))
        return DatasetInfo(cfg.dataset, cfg.image_channels, cfg.image_size, cfg.image_size, num_classes)
    return dataset_info(cfg.dataset, cfg.data_dir if data_dir is None else data_dir,
                        cfg.hf_image_column, cfg.hf_label_column)


def load_dataset(name: str, data_dir: str | os.PathLike = "", image_column: str = "", label_column: str = "") -> DatasetArrays:
    """Load a dataset's official splits from `data_dir` (empty: the default directory)."""
    if name.startswith("hf:"):
        return load_hf_arrays(HfSource.from_name(name, str(data_dir), image_column, label_column))
    return load_torchvision_dataset(name, data_dir)


def check_dataset_present(name: str, data_dir: str = "") -> None:
    """Raise DatasetMissingError naming what is missing, without reading the files (a quick check at start).

    Hugging Face datasets (`hf:` names) are checked when they load.
    """
    if not name.startswith("hf:"):
        check_torchvision_present(name, data_dir)


def load_run_dataset(cfg, data_dir: str | None = None) -> DatasetArrays:
    """A run's dataset (its data-dir, or `data_dir`, and its hf column keys)."""
    return load_dataset(cfg.dataset, cfg.data_dir if data_dir is None else data_dir,
                        cfg.hf_image_column, cfg.hf_label_column)
