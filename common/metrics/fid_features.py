"""Feature extractors for FID (SPEC 3.6): `classifier` (works offline), `random` (needs no data) and `inception`.

FID compares Gaussian fits of feature embeddings (common/metrics/fid.py); the numbers
depend entirely on the embedding, so every FID this project reports names its
extractor.

- `classifier`: the penultimate (128-d) features of a small CNN trained on the
  dataset's training split at the diffusion task's image size, to convergence:
  Adam until the accuracy on a held-out 5,000 images of the training split
  has not improved for `CLASSIFIER_PATIENCE` epochs (the best epoch is kept);
  its test accuracy is recorded with it and goes next to every FID. It also
  labels generated images for the class histogram (mode coverage). It is trained
  once with a fixed seed (independent of the run's seed, so runs stay
  comparable) and cached on disk as safetensors under `<cache-dir>/fid/`
  (default `~/.cache/fedsynth/fid/`). Training it needs the dataset where it
  runs — in simulation, the server.
- `random`: the same CNN's feature network (`FeatureCNN.body`, 128-d), untrained:
  its weights are PyTorch's default initialisation drawn from the fixed seed
  `RANDOM_FEATURES_SEED`. It needs no data anywhere, so it is the extractor of a
  server that holds no images (`partition = "node"`): the server builds it and
  sends its weights with the `fid_stats` query, so every node computes the
  same features whatever its torch version. Random convolutional embeddings
  separate real from generated image distributions (Naeem et al., 2020, used a
  randomly initialised VGG-16 for the same reason), but their FIDs have their
  own scale: they compare only with FIDs of the same extractor, never with
  published Inception FIDs.
- `inception`: torchvision's Inception-v3 pool features (2048-d), images
  resized to 299x299 and grey images repeated to 3 channels. Nothing is
  downloaded: the weights file must already be on disk, otherwise the error
  says where to put it. These are torchvision's ImageNet weights, not the
  TensorFlow graph of the original FID code, so values are close to but not
  identical with pytorch-fid's.

Both take images as the diffusion task holds them: float32 (N, C, H, W) in [-1, 1].
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.models.diffusion_names import FID_EXTRACTORS
from common.metrics.fid import GaussianStats, frechet_distance, gaussian_stats

CLASSIFIER_VERSION = 2
CLASSIFIER_MAX_EPOCHS = 30
CLASSIFIER_PATIENCE = 3
CLASSIFIER_HOLDOUT = 5000  # training images held out to decide convergence (at most a sixth of the split)
CLASSIFIER_SEED = 0
RANDOM_FEATURES_SEED = 0  # the `random` extractor's initialisation: fixed, so its FIDs compare across runs
REFERENCE_FEATURES = 10_000  # real training images whose features KID compares against
INCEPTION_FILE = "inception_v3_google-0cc3c7bd.pth"
INCEPTION_URL = f"https://download.pytorch.org/models/{INCEPTION_FILE}"


def fid_cache_dir(cache_dir: str = "") -> Path:
    """`<cache-dir>/fid`, or `~/.cache/fedsynth/fid` (honours XDG_CACHE_HOME)."""
    if cache_dir:
        return Path(cache_dir).expanduser() / "fid"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedsynth" / "fid"


@dataclass
class FeatureExtractor:
    """A frozen network and the input transform it needs; `name` goes next to every FID it produces."""

    name: str
    net: nn.Module
    prepare: Callable[[torch.Tensor], torch.Tensor]
    device: torch.device
    info: dict[str, str] = field(default_factory=dict)  # what it was trained on / loaded from
    head: nn.Module | None = None  # features -> class logits (the classifier only)

    @torch.no_grad()
    def features(self, images: np.ndarray, batch_size: int = 500) -> np.ndarray:
        """(N, d) float64 features of float32 images (N, C, H, W) in [-1, 1]."""
        self.net.eval()
        out = []
        for start in range(0, len(images), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size])).to(self.device)
            out.append(self.net(self.prepare(x)).double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0))

    @torch.no_grad()
    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted classes of images from their `features` (the classifier's head)."""
        if self.head is None:
            raise ValueError(f"the {self.name} extractor has no class head")
        self.head.eval()
        logits = self.head(torch.from_numpy(np.asarray(features, dtype=np.float32)).to(self.device))
        return logits.argmax(1).cpu().numpy()

    def stats(self, images: np.ndarray) -> GaussianStats:
        """Gaussian fit of the images' features."""
        return gaussian_stats(self.features(images))

    def fid(self, images: np.ndarray, reference: GaussianStats) -> float:
        """FID of the images against reference statistics."""
        return frechet_distance(self.stats(images), reference)


# ----- classifier -----------------------------------------------------------------------
class FeatureCNN(nn.Module):
    """conv3-32, pool, conv3-64, pool, 4x4 average, fc-128 (the features), ReLU, fc-classes.

    The features are taken before the last ReLU: units that a ReLU would hold
    at exactly zero make the covariance singular.
    """

    feature_dim = 128

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(),
            nn.Linear(64 * 16, self.feature_dim),
        )
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(self.feature_dim, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def classifier_path(dataset: str, side: int, data_dir: str = "", cache_dir: str = "") -> Path:
    """Cache file of the classifier for (dataset, image side, data directory, version)."""
    source = str(Path(data_dir).expanduser().resolve()) if data_dir else ""
    source_key = hashlib.sha256(source.encode()).hexdigest()[:8]
    return fid_cache_dir(cache_dir) / f"classifier-{dataset}-{side}px-{source_key}-v{CLASSIFIER_VERSION}.safetensors"


@dataclass(frozen=True)
class TrainingReport:
    """How the classifier's training ended: epochs run, best epoch and its held-out accuracy."""

    epochs: int
    best_epoch: int
    holdout_accuracy: float


def train_feature_classifier(x: np.ndarray, y: np.ndarray, num_classes: int,
                             max_epochs: int = CLASSIFIER_MAX_EPOCHS, patience: int = CLASSIFIER_PATIENCE,
                             batch_size: int = 128,
                             device: torch.device = torch.device("cpu")) -> tuple[FeatureCNN, TrainingReport]:
    """The classifier trained with Adam (1e-3) from a fixed seed on images in [-1, 1], to convergence.

    A seeded `min(CLASSIFIER_HOLDOUT, n // 6)` of the images is held out; training
    stops once its accuracy has not improved for `patience` epochs (or after
    `max_epochs`) and the weights of the best epoch are returned.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(CLASSIFIER_SEED)
        net = FeatureCNN(x.shape[1], num_classes).to(device)
    generator = torch.Generator().manual_seed(CLASSIFIER_SEED)
    split = torch.randperm(len(y), generator=generator).numpy()
    holdout = min(CLASSIFIER_HOLDOUT, len(y) // 6)
    held, kept = split[:holdout], split[holdout:]
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    xt, yt = torch.from_numpy(x[kept]), torch.from_numpy(y[kept].astype(np.int64))
    best, best_epoch, best_state, epoch = -1.0, 0, None, 0
    for epoch in range(1, max_epochs + 1):
        net.train()
        order = torch.randperm(len(yt), generator=generator)
        for start in range(0, len(yt), batch_size):
            idx = order[start:start + batch_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(xt[idx].to(device)), yt[idx].to(device)).backward()
            opt.step()
        accuracy = classifier_accuracy(net, x[held], y[held], device) if holdout else 0.0
        if accuracy > best:
            best, best_epoch = accuracy, epoch
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        elif epoch - best_epoch >= patience:
            break
    if best_state is not None:
        net.load_state_dict(best_state)
    return net.eval(), TrainingReport(epochs=epoch, best_epoch=best_epoch, holdout_accuracy=best)


@torch.no_grad()
def classifier_accuracy(net: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device) -> float:
    """Accuracy on a labelled set (reported so a reader can judge the embedding)."""
    net.eval()
    correct = 0
    for start in range(0, len(y), 1000):
        logits = net(torch.from_numpy(x[start:start + 1000]).to(device))
        correct += int((logits.argmax(1).cpu().numpy() == y[start:start + 1000]).sum())
    return correct / max(len(y), 1)


def _save_atomic(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    # Several processes may train it at once: each writes a temp file and renames it.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, tmp, metadata=metadata)
    os.replace(tmp, path)


def classifier_extractor(dataset: str, side: int, data_dir: str = "", cache_dir: str = "",
                         device: torch.device = torch.device("cpu")) -> FeatureExtractor:
    """The `classifier` extractor, trained on the dataset's training split on first use and cached."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from common.data.datasets import dataset_info, load_dataset
    from common.models.diffusion import to_diffusion_input

    info = dataset_info(dataset)
    path = classifier_path(dataset, side, data_dir, cache_dir)
    net = FeatureCNN(info.channels, info.num_classes)
    if path.is_file():
        net.load_state_dict(load_file(str(path)))
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
    else:
        data = load_dataset(dataset, data_dir)
        trained, report = train_feature_classifier(
            to_diffusion_input(data.x_train, side), data.y_train, info.num_classes, device=device
        )
        accuracy = classifier_accuracy(trained, to_diffusion_input(data.x_test, side), data.y_test, device)
        meta = {"dataset": dataset, "side": str(side), "test-accuracy": f"{accuracy:.4f}",
                "holdout-accuracy": f"{report.holdout_accuracy:.4f}", "epochs": str(report.epochs),
                "best-epoch": str(report.best_epoch), "train-size": str(len(data.y_train))}
        _save_atomic(trained.state_dict(), path, meta)
        net.load_state_dict(trained.state_dict())
    net = net.to(device).eval()
    net.requires_grad_(False)
    return FeatureExtractor("classifier", net.body, lambda x: x, device, dict(meta), head=net.head)


def random_extractor(channels: int, device: torch.device = torch.device("cpu")) -> FeatureExtractor:
    """The `random` extractor: `FeatureCNN`'s feature network, initialised from `RANDOM_FEATURES_SEED`, untrained."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_FEATURES_SEED)
        net = FeatureCNN(channels, 1).body  # the head is not part of the features; its size does not matter
        for layer in net:
            # He et al. (2015)'s variance-preserving initialisation, not PyTorch's default (which shrinks the
            # variance about 3x per layer): features of unit-order scale, so FIDs are not vanishingly small
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu" if isinstance(layer, nn.Conv2d) else "linear")
                nn.init.zeros_(layer.bias)
    net = net.to(device).eval()
    net.requires_grad_(False)
    return FeatureExtractor("random", net, lambda x: x, device,
                            {"seed": str(RANDOM_FEATURES_SEED), "trained": "no"})


TRAVELLING_EXTRACTORS = ("classifier", "random")  # the server sends their weights; nodes load Inception themselves


def extractor_weights(extractor: FeatureExtractor) -> dict[str, np.ndarray]:
    """The classifier's or the random extractor's feature network as named arrays (sent to nodes for their sums)."""
    if extractor.name not in TRAVELLING_EXTRACTORS:
        raise ValueError("only the classifier and random extractors travel; nodes load Inception from their own disk")
    return {name: t.detach().cpu().numpy().copy() for name, t in extractor.net.state_dict().items()}


def extractor_from_weights(name: str, weights: dict[str, np.ndarray], channels: int,
                           device: torch.device = torch.device("cpu")) -> FeatureExtractor:
    """A travelling extractor rebuilt from `extractor_weights` (strict: names and shapes must match)."""
    if name not in TRAVELLING_EXTRACTORS:
        raise ValueError(f"the {name!r} extractor does not travel; known: {', '.join(TRAVELLING_EXTRACTORS)}")
    net = FeatureCNN(channels, 1).body  # the feature network does not depend on the class count
    net.load_state_dict({key: torch.from_numpy(np.asarray(a)) for key, a in weights.items()}, strict=True)
    net = net.to(device).eval()
    net.requires_grad_(False)
    return FeatureExtractor(name, net, lambda x: x, device, {"source": "sent by the server"})


# ----- inception --------------------------------------------------------------------------
def inception_weight_candidates(cache_dir: str = "") -> list[Path]:
    """Where the Inception-v3 weights are looked for, in order."""
    return [fid_cache_dir(cache_dir) / INCEPTION_FILE, Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE]


class InceptionWeightsMissing(FileNotFoundError):
    """The Inception-v3 weights are not on this machine."""


def inception_extractor(cache_dir: str = "", device: torch.device = torch.device("cpu")) -> FeatureExtractor:
    """The `inception` extractor from local weights; a clear error when they are missing."""
    from torchvision.models import inception_v3

    candidates = inception_weight_candidates(cache_dir)
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise InceptionWeightsMissing(
            "fid-features = 'inception' needs torchvision's Inception-v3 weights, which are not downloaded at run "
            f"time. Put {INCEPTION_FILE} (from {INCEPTION_URL}) at {candidates[0]} or {candidates[1]}, or use "
            "fid-features = 'classifier' (works offline)."
        )
    net = inception_v3(weights=None, aux_logits=True, init_weights=False, transform_input=False)
    # weights_only: the file is loaded as tensors, never as arbitrary pickled objects
    net.load_state_dict(torch.load(found, map_location="cpu", weights_only=True))
    net.fc = nn.Identity()
    net = net.to(device).eval()
    net.requires_grad_(False)

    def prepare(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        # Images in [-1, 1] are what the Google weights expect (what `transform_input` would produce).
        return F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)

    return FeatureExtractor("inception", net, prepare, device, {"weights": str(found)})


def make_extractor(name: str, dataset: str, side: int, data_dir: str = "", cache_dir: str = "",
                   device: torch.device = torch.device("cpu"), channels: int = 1) -> FeatureExtractor:
    """The extractor named by `fid-features` (`channels`: of the images, for the random extractor)."""
    if name == "random":
        return random_extractor(channels, device)
    if name == "inception":
        return inception_extractor(cache_dir, device)
    if name == "classifier":
        return classifier_extractor(dataset, side, data_dir, cache_dir, device)
    raise ValueError(f"unknown FID feature extractor {name!r}; known: {', '.join(FID_EXTRACTORS)}")


def describe(extractor: FeatureExtractor) -> str:
    """One line naming the extractor and what it was trained on, for tables and summaries."""
    info = extractor.info
    return extractor.name + (f" ({json.dumps(info, sort_keys=True)})" if info else "")


def train_reference_stats(extractor: FeatureExtractor, dataset: str, side: int, data_dir: str = "",
                          cache_dir: str = "") -> GaussianStats:
    """Statistics of the real training split's features (FID's reference in simulation), cached on disk."""
    from common.data.datasets import load_dataset
    from common.models.diffusion import to_diffusion_input

    identity = json.dumps({"extractor": extractor.name, "info": extractor.info, "dataset": dataset, "side": side,
                           "data": str(Path(data_dir).expanduser().resolve()) if data_dir else ""}, sort_keys=True)
    path = fid_cache_dir(cache_dir) / f"train-stats-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as stored:
            return GaussianStats(mean=stored["mean"], cov=stored["cov"], count=int(stored["count"]))
    data = load_dataset(dataset, data_dir)
    stats = extractor.stats(to_diffusion_input(data.x_train, side))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        np.savez(handle, mean=stats.mean, cov=stats.cov, count=np.int64(stats.count))
    os.replace(tmp, path)
    return stats


def train_reference_features(extractor: FeatureExtractor, dataset: str, side: int, data_dir: str = "",
                             cache_dir: str = "", count: int = REFERENCE_FEATURES) -> np.ndarray:
    """Features of a fixed (seeded) `count` of the real training images, KID's reference; cached on disk."""
    from common.data.datasets import load_dataset
    from common.models.diffusion import to_diffusion_input

    identity = json.dumps({"extractor": extractor.name, "info": extractor.info, "dataset": dataset, "side": side,
                           "data": str(Path(data_dir).expanduser().resolve()) if data_dir else "", "count": count},
                          sort_keys=True)
    path = fid_cache_dir(cache_dir) / f"train-features-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    data = load_dataset(dataset, data_dir)
    chosen = np.random.default_rng(CLASSIFIER_SEED).permutation(len(data.y_train))[:count]
    features = extractor.features(to_diffusion_input(data.x_train[np.sort(chosen)], side)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        np.save(handle, features, allow_pickle=False)
    os.replace(tmp, path)
    return features
