"""Three sites' own imagefolders cut from Fashion-MNIST's test images, written as PNG files (issue 33).

- `site-a`: classes 0-3, 24 training images and a `test/` split of 8;
- `site-b`: classes 4-7 stored at 32x32 (another size than the run's 28), 24 training images and 8 test;
- `site-c`: classes 8, 9 and 0 by name, 30 training images and no test split (a seeded cut).
Class folders are named by `CLASS_NAMES`, so the sites agree on ids only through the run's `class-names`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.data.torchvision_files import DEBIAN_FASHION_MNIST, read_idx

CLASS_NAMES = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")


@dataclass(frozen=True)
class Site:
    """What a test expects of one written site."""

    name: str
    path: Path
    classes: tuple[int, ...]
    num_train: int  # images under train/
    num_test: int  # images under test/ (0: none)
    side: int


SITES = (("site-a", (0, 1, 2, 3), 24, 8, 28), ("site-b", (4, 5, 6, 7), 24, 8, 32), ("site-c", (8, 9, 0), 30, 0, 28))


def fashion_mnist_test_images() -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's 10 000 test images and labels (Debian package dataset-fashion-mnist)."""
    x = read_idx(DEBIAN_FASHION_MNIST / "t10k-images-idx3-ubyte.gz")
    y = read_idx(DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    return x, y


def write_images(folder: Path, images: np.ndarray, labels: np.ndarray, side: int, start: int = 0) -> None:
    """PNG files under folder/<class name>/, resized to side x side."""
    from PIL import Image

    for index, (image, label) in enumerate(zip(images, labels)):
        target = folder / CLASS_NAMES[int(label)]
        target.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(image)
        if side != image.shape[0]:
            picture = picture.resize((side, side), Image.BILINEAR)
        picture.save(target / f"{start + index:05d}.png")


def write_sites(root: Path) -> list[Site]:
    """The three sites under root/<name>; different images for every site and split."""
    x, y = fashion_mnist_test_images()
    used = np.zeros(len(y), dtype=bool)
    sites = []
    for name, classes, num_train, num_test, side in SITES:
        picks = []
        for count in (num_train, num_test):
            # round-robin over the site's classes, taking images no other split took
            chosen = []
            for i in range(count):
                wanted = classes[i % len(classes)]
                index = int(np.flatnonzero((y == wanted) & ~used)[0])
                used[index] = True
                chosen.append(index)
            picks.append(np.asarray(chosen, dtype=np.int64))
        write_images(root / name / "train", x[picks[0]], y[picks[0]], side)
        if num_test:
            write_images(root / name / "test", x[picks[1]], y[picks[1]], side)
        sites.append(Site(name, root / name, classes, num_train, num_test, side))
    return sites


def site_run_config(**extra) -> dict:
    """Run-config keys shared by the sites' runs: their own data, Fashion-MNIST's shape, named classes."""
    return {"partition": "node", "dataset": "fashion-mnist", "class-names": ",".join(CLASS_NAMES),
            "local-test-fraction": 0.2, "local-steps": 3, "batch-size": 8, **extra}
