"""`fedsynth data fetch`: download the papers' datasets with torchvision, into the layout the apps read.

torchvision's dataset classes know the official download addresses and the MD5
sums of every archive; their `download()` fetches, checks and unpacks into
`<root>/MNIST/raw`, `<root>/FashionMNIST/raw`, `<root>/cifar-10-batches-py` and
`<root>/cifar-100-python` — exactly where common/data/datasets.py looks. Only the
download step of each class runs (the object is not constructed, so no file is
unpickled by torchvision); the result is then read back with our own strict
readers, so a fetch that succeeds is a dataset the apps can load.
"""

from __future__ import annotations

from pathlib import Path
from urllib.error import URLError

from common.data.datasets import DATASETS, DatasetArrays, default_data_dir, load_dataset

TORCHVISION_CLASSES = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}


class FetchError(RuntimeError):
    """A dataset could not be downloaded or did not pass its checksums."""


def _downloader(name: str, root: Path):
    import torchvision.datasets

    cls = getattr(torchvision.datasets, TORCHVISION_CLASSES[name])
    downloader = cls.__new__(cls)  # only `download()` is wanted: no loading, no unpickling
    downloader.root = str(root)
    return downloader


def _sources(downloader) -> str:
    if hasattr(downloader, "mirrors"):
        return ", ".join(downloader.mirrors)
    return downloader.url


def fetch_dataset(name: str, root: str | Path = "") -> DatasetArrays:
    """Download `name` into `root` (empty: the default data directory), verify it, and load it back."""
    if name not in TORCHVISION_CLASSES:
        raise ValueError(f"unknown dataset {name!r}; fetchable: {', '.join(DATASETS)} "
                         "(hf:<repo> datasets are fetched by the datasets library itself, see docs/data.md)")
    folder = Path(root).expanduser() if str(root) else default_data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    downloader = _downloader(name, folder)
    try:
        downloader.download()
    except (URLError, OSError, RuntimeError) as err:
        raise FetchError(
            f"could not download {name!r} from {_sources(downloader)} into {folder}: {err}. "
            "Without network access, fetch it on a machine that has one (fedsynth data fetch "
            f"{name} DIR) and copy DIR here, then set run config key data-dir = \"DIR\""
        ) from None
    if hasattr(downloader, "_check_integrity") and not downloader._check_integrity():
        raise FetchError(f"{name!r} in {folder} does not match torchvision's MD5 sums; delete it and fetch again")
    return load_dataset(name, folder)
