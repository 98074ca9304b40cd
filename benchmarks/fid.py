"""Time of the final model's score on the 8x8 cpu task: 5,000 samples, FID, KID and the class histogram.

Usage: ``python benchmarks/fid.py [--out FILE] [--threads 2] [--samples 5000] [--data-dir DIR]``

A diffusion run scores its final model on `final-fid-samples` (5,000) images
(server_app/diffusion_eval.py). This script times the parts of that on the
cpu study's task (Fashion-MNIST at 8x8, `unet-small`, T = 500) with the
run's own functions:

- **scoring**: the classifier's features of the 5,000 images, FID against the
  training split's statistics, KID (torchmetrics' estimator, 100 subsets of
  1,000) against 10,000 real images' features, and the histogram of predicted
  classes. The feature classifier, the reference statistics and the reference
  features are built (and cached) before the timing starts; building them once
  is timed separately (it happens once per machine).
- **sampling**: drawing the 5,000 images with DDIM-50 (the cpu study's
  evaluation sampler), and the ancestral sampler's time derived from one
  batch (500 network evaluations per image).

The model's weights do not change the time, so an untrained U-Net samples.
The markdown table goes to ``--out``; the header records the CPU count,
torch threads and load average, because the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from common.models.diffusion import SamplerSpec, build_unet, sample, seeded_generator  # noqa: E402
from common.metrics.fid import (  # noqa: E402
    class_histogram, frechet_distance, gaussian_stats, kernel_inception_distance,
)
from common.metrics.fid_features import classifier_extractor, train_reference_features, train_reference_stats  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "fid.md")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--side", type=int, default=8)
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--cache-dir", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")

    def measure(fn):
        """(result, wall seconds, CPU seconds of this process: all its threads)."""
        wall, cpu = time.monotonic(), time.process_time()
        result = fn()
        return result, time.monotonic() - wall, time.process_time() - cpu

    def setup_all():
        extractor = classifier_extractor("fashion-mnist", args.side, args.data_dir, args.cache_dir, device)
        reference = train_reference_stats(extractor, "fashion-mnist", args.side, args.data_dir, args.cache_dir)
        features = train_reference_features(extractor, "fashion-mnist", args.side, args.data_dir, args.cache_dir)
        return extractor, reference, features

    (extractor, reference, reference_features), setup, setup_cpu = measure(setup_all)
    model = build_unet("unet-small", 1, args.side, 500, seed=0).eval()
    shape = (1, args.side, args.side)
    images, sampling, sampling_cpu = measure(lambda: sample(model, SamplerSpec("ddim", 500, 50), args.samples, shape,
                                                            seeded_generator(0, 1, 0, 11), device))
    _, ancestral, ancestral_cpu = measure(lambda: sample(model, SamplerSpec("ddpm", 500), 256, shape,
                                                         seeded_generator(0, 2, 0, 11), device))
    ancestral, ancestral_cpu = ancestral * args.samples / 256, ancestral_cpu * args.samples / 256

    timings: dict[str, tuple[float, float]] = {}
    features, *timings["features"] = measure(lambda: extractor.features(images))
    fid, *timings["FID"] = measure(lambda: frechet_distance(gaussian_stats(features), reference))
    (kid, kid_std), *timings["KID"] = measure(lambda: kernel_inception_distance(features, reference_features, seed=0))
    histogram, *timings["class histogram"] = measure(lambda: class_histogram(extractor.predict(features), 10))
    scoring = sum(wall for wall, _ in timings.values())
    scoring_cpu = sum(cpu for _, cpu in timings.values())

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    info = extractor.info
    lines = [
        f"# Final-model score on the 8x8 task: {args.samples} samples",
        "",
        f"Command: `python benchmarks/fid.py --threads {args.threads}` on {platform.node()}: {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {args.threads} torch threads, load average {load:.1f} at the end "
        "(the machine is shared: timings are upper bounds).",
        "",
        f"Feature classifier: test accuracy {info.get('test-accuracy')}, held-out accuracy "
        f"{info.get('holdout-accuracy')}, {info.get('epochs')} epochs (best {info.get('best-epoch')}), "
        f"training split {info.get('train-size')} images at {args.side}x{args.side}. Building it, the reference "
        f"statistics and the 10,000 reference features (once per machine, cached): {setup:.1f} s wall, "
        f"{setup_cpu:.1f} s CPU in this run (~0 when cached).",
        "",
        "Wall seconds depend on the machine's load; CPU seconds (all threads of this process) do not: on an idle",
        f"machine the wall time is about CPU seconds / {args.threads}.",
        "",
        "| part | wall s | CPU s |",
        "| --- | --- | --- |",
        *[f"| {name} of {args.samples} images | {wall:.2f} | {cpu:.2f} |" for name, (wall, cpu) in timings.items()],
        f"| **scoring total (features + FID + KID + histogram)** | **{scoring:.1f}** | **{scoring_cpu:.1f}** |",
        f"| sampling {args.samples} images, DDIM-50 (the cpu study's evaluation sampler) | {sampling:.1f} | "
        f"{sampling_cpu:.1f} |",
        f"| **sampling + scoring, DDIM-50** | **{sampling + scoring:.1f}** | **{sampling_cpu + scoring_cpu:.1f}** |",
        f"| sampling {args.samples} images, ancestral T = 500 (derived from 256) | {ancestral:.0f} | "
        f"{ancestral_cpu:.0f} |",
        "",
        f"Values on an untrained U-Net (noise): FID {fid:.1f}, KID {kid:.4f} +- {kid_std:.4f}, predicted-class "
        f"histogram {np.round(histogram, 3).tolist()}.",
        "",
    ]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
