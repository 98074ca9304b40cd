"""The data keys: which dataset, where it is, how it is split over the sites, and its shape facts.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by this
floor's loaders and partitioners (common/data/). With `partition = node` no split is made: every
node trains on its own data, and the shape keys (class-names, num-classes, image-channels,
image-size) stand in for a named dataset's facts (common/data/site_data.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.data.datasets import DATASETS, dataset_info
from common.data.hf_datasets import is_hf
from common.data.site_data import node_shape_info
from common.errors import ConfigError
from common.keys import check_choice, check_text, key, require

PARTITIONS = ("iid", "dirichlet", "shard", "pathological", "pairs", "node")
NODE_PARTITION = "node"  # every node trains on its own data (common/data/site_data.py)
OWN_DATASET = "own"  # partition = node with no named dataset: the shape keys give the shape facts
# Bounds far above any image task's (ImageNet-21k: 21,841 classes; a radiograph at 2048 px): the model is sized from
# these numbers, and 10^12 of either was accepted and built (benchmarks/results/hostile-probe.md).
MAX_NUM_CLASSES = 100_000
MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class DataSettings:
    """The data: dataset and where it is, the split over the clients, and the images' shape facts."""

    dataset: str = key(
        "fashion-mnist", "Dataset: mnist, fashion-mnist, cifar10, cifar100, or `hf:<repo>` (a Hugging Face "
        "dataset through flwr-datasets, see docs/data.md); with partition = node also own (the sites' own images: "
        "image-channels, image-size and class-names or num-classes give their shape, docs/own-data.md).", "SPEC 3.1"
    )
    data_dir: str = key(
        "",
        "Directory used as torchvision root (and where `hf:<repo>` is looked for, as `<data-dir>/<repo>`); empty: "
        "~/.cache/fedsynth/data, and for Fashion-MNIST the Debian package files are found automatically.",
        "SPEC 3.1",
    )
    cache_dir: str = key(
        "", "Where client partitions are cached; empty: ~/.cache/fedsynth/partitions."
    )
    hf_image_column: str = key("", "`hf:<repo>` datasets: the image column; empty: found from the features.")
    hf_label_column: str = key("", "`hf:<repo>` datasets: the label column; empty: found from the features.")
    partition: str = key(
        "dirichlet", "Split over clients: iid, dirichlet, shard, pathological, pairs (disjoint groups of "
        "classes-per-client classes, each group's samples split evenly over N / groups clients), or node (no "
        "split: every node trains on its own data, named by its node config `dataset-path`, docs/own-data.md).",
        "SPEC 3.2; pairs: FedCOG NIID-2; node: SPEC 3.1",
    )
    dataset_path: str = key(
        "", "partition = node: a node's data when its node config has no `dataset-path`; `{partition-id}` is "
        "replaced by the node's partition id (simulation: one folder per node, e.g. /data/sites/{partition-id}).",
        "SPEC 3.1",
    )
    class_names: str = key(
        "", "partition = node: the federation's classes, comma-separated, in label-id order; imagefolder class "
        "folders and string labels map to ids through them. Empty: labels are ids 0..C-1.", "SPEC 3.1",
    )
    num_classes: int = key(
        0, "partition = node: the number of classes C; 0: from class-names, else the named dataset's. hf:<repo> "
        "datasets: with image-channels and image-size, the shape facts without opening the dataset.", "SPEC 3.1"
    )
    image_channels: int = key(
        0, "partition = node: channels of the images the model sees (1 grey, 3 colour; images are converted); 0: "
        "the named dataset's. hf:<repo> datasets: see num-classes.", "SPEC 3.1",
    )
    image_size: int = key(
        0, "Diffusion task, and partition = node: side of the square images, resized with antialiasing on load; "
        "0: the dataset's own.", "SPEC 3.1"
    )
    central_test_path: str = key(
        "", "A test set by path for central evaluation (any format of docs/own-data.md; a test split alone is "
        "enough); empty: the named dataset's official test split, or with partition = node none (the clients' "
        "local-test accuracy is then the run's accuracy).", "SPEC 3.1",
    )
    alpha: float = key(0.3, "Dirichlet concentration (smaller is more skewed).", "SPEC 3.2")
    classes_per_client: int = key(
        2, "Classes per client for the pathological and pairs splits.", "FedCOG NIID-2, OledFL"
    )
    local_test_fraction: float = key(
        0.2, "Fraction of each client's partition held out as its local test split."
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, DataSettings)
        hf = is_hf(self.dataset)
        node = self.partition == NODE_PARTITION
        require(self.dataset in DATASETS or (hf and len(self.dataset) > 3) or (node and self.dataset == OWN_DATASET),
                "dataset", self.dataset, "one of " + ", ".join(DATASETS) + " or hf:<repo>"
                + (f" ({OWN_DATASET} only with partition = node)" if self.dataset == OWN_DATASET else ""))
        check_choice("partition", self.partition, PARTITIONS)
        require(self.alpha > 0, "alpha", self.alpha, "a number > 0")
        if not node:
            require(self.image_channels == 0 or hf, "image-channels", self.image_channels,
                    "0 unless partition = node or the dataset is hf:<repo>")
            require(self.num_classes == 0 or hf, "num-classes", self.num_classes,
                    "0 unless partition = node or the dataset is hf:<repo>")
        if node:
            self._check_node_values()
        elif hf:  # an hf: dataset's classes are known once it is opened: the partitioner checks then
            require(self.classes_per_client >= 1, "classes-per-client", self.classes_per_client, "an integer >= 1")
        else:
            num_classes = dataset_info(self.dataset).num_classes
            require(
                1 <= self.classes_per_client <= num_classes,
                "classes-per-client",
                self.classes_per_client,
                f"an integer in 1..{num_classes} (dataset '{self.dataset}' has {num_classes} classes)",
            )
            require(self.partition != "pairs" or num_classes % self.classes_per_client == 0, "classes-per-client",
                    self.classes_per_client, f"with partition 'pairs' a divisor of the {num_classes} classes of "
                    f"'{self.dataset}'")
        require(0 <= self.local_test_fraction < 1, "local-test-fraction", self.local_test_fraction,
                "a number in [0, 1)")
        require(0 <= self.image_size <= MAX_IMAGE_SIZE, "image-size", self.image_size,
                f"an integer in 0..{MAX_IMAGE_SIZE} (0: the dataset's own)")
        require(self.num_classes <= MAX_NUM_CLASSES, "num-classes", self.num_classes,
                f"at most {MAX_NUM_CLASSES} classes")
        names = [name.strip() for name in self.class_names.split(",") if name.strip()]
        repeated = sorted({name for name in names if names.count(name) > 1})
        require(not repeated, "class-names", self.class_names,
                "distinct names, one per class id (repeated: " + ", ".join(repeated) + ")")

    def _check_node_values(self) -> None:
        """partition = node: the shape keys that replace a dataset (what needs data on the server: RunConfig)."""
        require(not is_hf(self.dataset), "dataset", self.dataset,
                f"{OWN_DATASET} or a named dataset with partition = node (a node's hf data is its dataset-path: a "
                "save_to_disk or parquet folder)")
        require(self.num_classes >= 0, "num-classes", self.num_classes, "an integer >= 0 (0: from class-names)")
        require(self.image_channels in (0, 1, 3), "image-channels", self.image_channels, "0, 1 (grey) or 3 (colour)")
        try:
            node_shape_info(self)
        except ValueError as err:
            raise ConfigError(str(err)) from None
