"""How the `random` FID extractor separates image sets: the scale of its FIDs (issue 33).

Usage: ``python benchmarks/fid_random.py [--out FILE] [--sides 8 28]``

With `partition = "node"` the server holds no images, and FID is measured with
the untrained, seeded `random` extractor (common/metrics/fid_features.py). Its FIDs have
their own scale. This script measures it on Fashion-MNIST's test split (the
Debian package's copy): the reference is the Gaussian fit of the first 5,000
images, and each row scores 5,000 other images against it:

- the other 5,000 real images (what a perfect generator scores at this count);
- the same images with Gaussian noise (sd 0.2 in [-1, 1]) added;
- the same images blurred (down to half the side and back up, bilinear);
- only the images of classes 0 and 1 among them (a generator that drops 8 modes);
- uniform noise in [-1, 1].

The markdown table goes to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from common.data.torchvision_files import DEBIAN_FASHION_MNIST, read_idx  # noqa: E402
from common.models.diffusion import to_diffusion_input  # noqa: E402
from common.metrics.fid_features import random_extractor  # noqa: E402

HALF = 5000


def image_sets(side: int) -> dict[str, np.ndarray]:
    """The real reference half and the five scored sets at `side` px, float32 in [-1, 1]."""
    x = read_idx(DEBIAN_FASHION_MNIST / "t10k-images-idx3-ubyte.gz")[..., None]
    y = read_idx(DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz")
    images = to_diffusion_input(x, side)
    other = images[HALF:]
    rng = np.random.default_rng(0)
    small = to_diffusion_input(x[HALF:], max(side // 2, 4))
    blurred = torch.nn.functional.interpolate(torch.from_numpy(small), size=(side, side), mode="bilinear").numpy()
    return {
        "reference": images[:HALF],
        "real (other half)": other,
        "real + noise sd 0.2": np.clip(other + rng.normal(0, 0.2, size=other.shape).astype(np.float32), -1, 1),
        "blurred (half side)": blurred,
        "classes 0 and 1 only": other[np.isin(y[HALF:], [0, 1])],
        "uniform noise": rng.uniform(-1, 1, size=other.shape).astype(np.float32),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "fid-random.md")
    parser.add_argument("--sides", type=int, nargs="+", default=[8, 28])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    extractor = random_extractor(1)
    rows: dict[str, list[str]] = {}
    for side in args.sides:
        sets = image_sets(side)
        reference = extractor.stats(sets.pop("reference"))
        for name, images in sets.items():
            rows.setdefault(name, []).append(f"{extractor.fid(images, reference):.4f}")
    lines = [f"# FID of the `random` extractor (Fashion-MNIST test split, reference: first {HALF:,} images)", "",
             f"`python benchmarks/fid_random.py --sides {' '.join(map(str, args.sides))}`", "",
             "| scored set | " + " | ".join(f"{side} px" for side in args.sides) + " |",
             "| --- | " + " | ".join("---" for _ in args.sides) + " |"]
    lines += [f"| {name} | " + " | ".join(values) + " |" for name, values in rows.items()]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
