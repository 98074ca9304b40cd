"""A small learnable image dataset written with Hugging Face `datasets` (save_to_disk and parquet)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

NUM_CLASSES = 4
SIDE = 28  # grey 28x28 like MNIST, so the tiny mlp fits


def tiny_image_dataset(num_train: int = 240, num_test: int = 80, seed: int = 0):
    """A DatasetDict of grey SIDE x SIDE images (Image feature) whose class is a bright row band."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    rng = np.random.default_rng(seed)

    def split(n: int) -> Dataset:
        labels = rng.integers(0, NUM_CLASSES, size=n)
        images = rng.integers(0, 60, size=(n, SIDE, SIDE)).astype(np.uint8)
        for image, label in zip(images, labels):
            image[2 + 4 * int(label): 5 + 4 * int(label), 1:-1] = 230
        features = Features({"picture": Image(), "digit": ClassLabel(names=[f"c{i}" for i in range(NUM_CLASSES)])})
        return Dataset.from_dict({"picture": list(images), "digit": labels.tolist()}, features=features)

    return DatasetDict(train=split(num_train), test=split(num_test))


def write_saved(folder: Path, **kwargs) -> Path:
    """`save_to_disk` layout under `folder`."""
    tiny_image_dataset(**kwargs).save_to_disk(str(folder))
    return folder


def write_parquet(folder: Path, **kwargs) -> Path:
    """One parquet file per split under `folder` (train.parquet, test.parquet)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in tiny_image_dataset(**kwargs).items():
        split.to_parquet(str(folder / f"{name}.parquet"))
    return folder
