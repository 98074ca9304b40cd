"""Evaluation of a federated diffusion model on the server: FID and sample grids (SPEC 3.6).

Every `fid-every` rounds and after the last one, the server draws `fid-samples`
images from the global model with the run's sampler, writes a PNG grid of the
first 64 (`samples-round-NNNN.png`, `samples-final.png`; the paper's Figures
4-6) and, with `central-eval = true`, scores them with FID (`fid`) and KID
(`kid`, unbiased at small sample counts) against the real training split (the
paper's reference), which the server holds in simulation. With `partition =
"node"` the server holds no images: FID's reference is then the nodes' pooled
feature sums (server_app/fid_reference.py, asked for once), and there is no
KID (the sums do not give it; fid_reference.py says what would) and no class
histogram (the classifier that labels samples is trained on the server's images). The same number of
samples every round, so the curve compares with itself and the study runner's
mean of the last evaluations is fair.

The final model is scored once more on `final-fid-samples` (5,000) samples, at most 500 per round of the run
(`final_fid_count`: a 2-round run draws 1,000; the count is in summary.json's `final-fid-samples`):
`final-fid`, `final-kid` (with the std over KID's subsets) and the histogram
of the classes the feature classifier predicts for them (mode coverage:
`final-class-histogram`, `final-classes-covered`, `final-class-entropy`).
A 500-sample FID of one round's model moved 2-4x between evaluations in the
cpu preset; 5,000 samples bound the metric's share of that.

Each score is written with the extractor (and its test accuracy) and the
sampler that produced it.

This is the diffusion task's counterpart of `CentralEvaluator`; the run recorder
uses it for every algorithm that trains a DDPM.
"""

from __future__ import annotations

import time
from logging import INFO
from typing import TYPE_CHECKING, Any

import numpy as np

from common.data.settings import NODE_PARTITION
from common.run.config import RunConfig
from common.models.diffusion import image_shape, sample, sampler_spec, save_image_grid, seeded_generator
from common.metrics.evaluation import resolve_device
from common.metrics.fid import (
    GaussianStats, class_histogram, classes_covered, frechet_distance, gaussian_stats, kernel_inception_distance,
    normalized_entropy,
)
from common.metrics.fid_features import (
    FeatureExtractor, classifier_extractor, describe, make_extractor, train_reference_features,
    train_reference_stats,
)
from common.records import Weights, load_weights
from common.models.diffusion_settings import final_fid_count
from common.run.progress import Progress
from common.run.task import make_model

if TYPE_CHECKING:
    from collections.abc import Callable

    from common.run.results import RunResults

    # (extractor, image shape) -> (the nodes' pooled statistics, the metrics of asking for them, if this call did)
    ClientReference = Callable[[FeatureExtractor, tuple[int, int, int]], tuple[GaussianStats, dict[str, Any]]]

GRID_IMAGES = 64
_FID_STREAM = 11  # seed component of the evaluation samples


class DiffusionEvaluator:
    """Samples, grids and FID of the global model; the extractor and reference are built on first use.

    `client_reference` gives the nodes' pooled feature statistics: FID's
    reference when the server holds no images (`reference_from_clients`).
    """

    def __init__(self, cfg: RunConfig, results: "RunResults",
                 client_reference: "ClientReference | None" = None) -> None:
        self.cfg = cfg
        self.results = results
        self.client_reference = client_reference
        self.from_clients = reference_from_clients(cfg)
        self.gathering: dict[str, Any] = {}  # metrics of asking the nodes for their sums, until a record takes them
        self.device = resolve_device(cfg.device)
        self.sampler = sampler_spec(cfg)
        self.shape = image_shape(cfg)
        self.model = make_model(cfg).to(self.device)
        self._extractor: FeatureExtractor | None = None
        self._labeller: FeatureExtractor | None = None
        self._reference: GaussianStats | None = None
        self._reference_features: np.ndarray | None = None

    def extractor(self) -> FeatureExtractor:
        """The `fid-features` extractor."""
        if self._extractor is None:
            self._extractor = run_extractor(self.cfg)
        return self._extractor

    def reference(self) -> GaussianStats:
        """Statistics of the real training split: the server's copy, or the nodes' pooled feature sums."""
        if self._reference is None and self.from_clients:
            if self.client_reference is None:
                raise RuntimeError("FID's reference is the nodes' feature sums, and this evaluator cannot ask for them")
            self._reference, self.gathering = self.client_reference(self.extractor(), self.shape)
        if self._reference is None:
            self._reference = train_reference_stats(
                self.extractor(), self.cfg.dataset, self.shape[1], self.cfg.data_dir, self.cfg.cache_dir
            )
        return self._reference

    def reference_features(self) -> np.ndarray:
        """Features of 10,000 real training images (KID's reference)."""
        if self._reference_features is None:
            self._reference_features = train_reference_features(
                self.extractor(), self.cfg.dataset, self.shape[1], self.cfg.data_dir, self.cfg.cache_dir
            )
        return self._reference_features

    def labeller(self) -> FeatureExtractor:
        """The classifier that labels generated images: the FID extractor when it is the classifier."""
        if self._labeller is None:
            self._labeller = self.extractor() if self.extractor().head is not None else classifier_extractor(
                self.cfg.dataset, self.shape[1], self.cfg.data_dir, self.cfg.cache_dir, self.device)
        return self._labeller

    def scores(self, images: np.ndarray, seed: int) -> dict[str, float]:
        """FID and KID (mean, std over subsets) of images against the real training split (FID only when the
        reference is the nodes' feature sums)."""
        features = self.extractor().features(images)
        scores = {"fid": frechet_distance(gaussian_stats(features), self.reference())}
        if not self.from_clients:
            scores["kid"], scores["kid-std"] = kernel_inception_distance(features, self.reference_features(), seed=seed)
        return scores

    def mode_coverage(self, images: np.ndarray) -> dict[str, Any]:
        """Histogram of the classifier's predicted classes of the images, classes covered, normalised entropy."""
        labeller = self.labeller()
        histogram = class_histogram(labeller.predict(labeller.features(images)), self.num_classes())
        return {"class-histogram": [round(float(h), 4) for h in histogram],
                "classes-covered": classes_covered(histogram), "class-entropy": normalized_entropy(histogram)}

    def num_classes(self) -> int:
        from common.data.datasets import dataset_info

        return dataset_info(self.cfg.dataset).num_classes

    def due(self, server_round: int, final: bool) -> bool:
        """Evaluate after the last round and every `fid-every` rounds."""
        return final or bool(self.cfg.fid_every and server_round % self.cfg.fid_every == 0)

    def after_warmup(self, auxiliary: np.ndarray | None, record: dict[str, Any]) -> None:
        """FedDDPM's auxiliary set in the warm-up's record: a grid of its images, and its FID (and KID where the
        server has data).

        Table IV's "FID of the synthetic auxiliary dataset": against the server's real images, or against the
        nodes' feature sums with partition = node (then FID only).
        """
        if auxiliary is None:
            return
        save_image_grid(auxiliary[spread_indices(len(auxiliary), GRID_IMAGES)], self.results.path / "auxiliary.png")
        if self.cfg.central_eval:
            scores = self.scores(auxiliary, seed=0)
            record.update({f"aux-{key}": value for key, value in scores.items() if key in ("fid", "kid")})
            record.update(self.gathering)
            self.gathering = {}

    def after_round(self, server_round: int, weights: Weights, final: bool) -> dict[str, Any]:
        """Metrics of the round's global model (empty when no evaluation is due)."""
        if not self.due(server_round, final):
            return {}
        from flwr.common.logger import log

        start = time.monotonic()
        load_weights(self.model, weights)
        self.model.to(self.device)
        count = max(self.cfg.fid_samples, GRID_IMAGES) if self.cfg.central_eval else GRID_IMAGES
        final_count = final_fid_count(self.cfg.final_fid_samples, self.cfg.fid_samples, self.cfg.num_server_rounds)
        if final and self.cfg.central_eval:
            count = max(count, final_count)
        # the first fid-samples images are the round's sample; the final score takes all final_count
        progress = Progress(f"[round {server_round}] {'final ' if final else ''}FID sampling", count, "images")
        progress.start(f" from the global model ({self.sampler.label})")
        images = sample(self.model, self.sampler, count, self.shape,
                        seeded_generator(self.cfg.seed, server_round, 0, _FID_STREAM), self.device,
                        on_batch=progress.advance)
        record: dict[str, Any] = {"sample-time": time.monotonic() - start}
        grid = save_image_grid(images[:GRID_IMAGES], self.results.path / f"samples-round-{server_round:04d}.png")
        self.results.log_image("samples", grid, server_round)
        if final:
            save_image_grid(images[:GRID_IMAGES], self.results.path / "samples-final.png")
        if self.cfg.central_eval:
            scores = self.scores(images[:self.cfg.fid_samples], seed=server_round)
            record.update({key: scores[key] for key in ("fid", "kid") if key in scores})
            record.update(self.gathering)
            self.gathering = {}
            log(INFO, "[round %d] FID %.3f%s (%s features, %d samples, %s; reference: %s)", server_round, record["fid"],
                f", KID {record['kid']:.4f}" if "kid" in record else "", self.extractor().name, self.cfg.fid_samples,
                self.sampler.label, self.reference_label())
            if final and final_count:
                final_images = images[:final_count]
                final_scores = self.scores(final_images, seed=server_round)
                record.update({f"final-{key}": value for key, value in final_scores.items()})
                record["final-fid-samples"] = len(final_images)
                if not self.from_clients:  # labelling needs the classifier, trained on the server's images
                    record.update({f"final-{k}": v for k, v in self.mode_coverage(final_images).items()})
                log(INFO, "[round %d] final model, %d samples: FID %.3f%s%s", server_round, len(final_images),
                    record["final-fid"], f", KID {record['final-kid']:.4f}" if "final-kid" in record else "",
                    f", classes covered {record['final-classes-covered']}, histogram {record['final-class-histogram']}"
                    if "final-classes-covered" in record else "")
        record["eval-time"] = time.monotonic() - start
        return record

    def summary(self) -> dict[str, Any]:
        """Final and best FID with their extractor and sampler; writes fid.png."""
        out: dict[str, Any] = {"sampler": self.sampler.label, "fid-samples": self.cfg.fid_samples}
        scored = [r for r in self.results.rounds if isinstance(r.get("fid"), (int, float))]
        if scored:
            out.update({
                "fid-features": describe(self.extractor()),
                "fid-reference": self.reference_label(),
                "fid-classifier-test-accuracy": _float_or_none(self.extractor().info.get("test-accuracy")),
                "final-fid": scored[-1]["fid"],
                "final-fid-samples": self.cfg.fid_samples,
                "final-fid-round": scored[-1]["round"],
                "best-fid": min(r["fid"] for r in scored),
            })
            if "kid" in scored[-1]:  # none with the nodes' sums as reference (fid_reference.py)
                out["final-kid"] = scored[-1]["kid"]
            # the final model's large-sample scores replace the round-sized ones where they exist
            for key in ("final-fid", "final-kid", "final-kid-std", "final-fid-samples", "final-class-histogram",
                        "final-classes-covered", "final-class-entropy"):
                if key in scored[-1]:
                    out[key] = scored[-1][key]
            plot_fid({"global model": [(r["round"], r["fid"]) for r in scored]}, self.results.path / "fid.png",
                     f"FID ({self.extractor().name} features, {self.sampler.label})")
        return out

    def reference_label(self) -> str:
        """What FID was measured against, for logs and summary.json."""
        return "nodes' feature sums" if self.from_clients else "training split (server)"


def reference_from_clients(cfg: RunConfig) -> bool:
    """Whether FID's reference is the nodes' pooled feature sums: the server holds no images (partition = node)."""
    return cfg.partition == NODE_PARTITION


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def run_extractor(cfg: RunConfig) -> FeatureExtractor:
    """The run's FID feature extractor."""
    channels, side, _ = image_shape(cfg)
    return make_extractor(cfg.fid_features, cfg.dataset, side, cfg.data_dir, cfg.cache_dir,
                          resolve_device(cfg.device), channels=channels)


def plot_fid(curves: dict[str, list[tuple[int, float]]], path, title: str) -> None:
    """FID against rounds, one line per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=label)
    ax.set(xlabel="round", ylabel="FID (lower is better)", title=title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def spread_indices(total: int, count: int) -> np.ndarray:
    """`count` indices spread evenly over `total` items (a grid that shows every client's part)."""
    return np.unique(np.linspace(0, max(total - 1, 0), num=min(count, total)).round().astype(np.int64))
