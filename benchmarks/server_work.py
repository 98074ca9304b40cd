"""Server-side work of the algorithms that compute on the server: distillation, FedDDPM's sampling and correction, FID.

    .venv/bin/python benchmarks/server_work.py [--devices cpu,cuda] [--threads N] [--out FILE]

Each row times one piece of server work with the project's own functions, at
the cpu preset's size and at the paper's size, and projects it to what one
run or one round pays:

- **trajectory distillation** (FedSynSAM, DynaFed; once per run, after round
  R): `server_app.distillation.distill` on a trajectory of R + 1 = 31 models,
  s inner steps, 20 images per class; a few iterations are timed and the time
  per iteration is multiplied by M = 200;
- **auxiliary sampling** (FedDDPM(+); once per run): denoising steps of the
  preset's U-Net over a batch, projected to the auxiliary set's size x the sampler's steps;
- **correction epoch** (FedDDPM: every round; FedDDPM+: `oneshot-epochs` once):
  `train_on_images` steps, projected to one epoch over the auxiliary set;
- **FID** (every `fid-every` rounds): features of the samples with the
  classifier extractor's network and the Frechet distance (the samples
  themselves cost what the sampling row says per image).

Projections multiply a measured unit time by a count; the unit and the count
are both in the table. Random weights and inputs stand in for trained ones:
the cost of these steps does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from timing import add_device_options, available_devices, timed

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from common.data.datasets import dataset_info  # noqa: E402
from common.models.diffusion import (  # noqa: E402
    UNET_PRESETS, SamplerSpec, build_unet, linear_schedule, sample, seeded_generator, train_on_images,
)
from common.metrics.fid import frechet_distance, gaussian_stats  # noqa: E402
from common.metrics.fid_features import FeatureCNN  # noqa: E402
from common.models.classifiers import build_model  # noqa: E402
from common.records import model_weights  # noqa: E402
from common.algorithms.synsam_settings import SynSAMSettings  # noqa: E402
from server_app.distillation import distill  # noqa: E402


@dataclass
class Row:
    """One timed piece of server work."""

    work: str
    setting: str
    device: str
    unit: str
    unit_s: float
    count: float
    projected_s: float
    when: str


def distillation_row(setting: str, dataset: str, model_name: str, inner_steps: int, iterations: int,
                     device: torch.device) -> Row:
    info = dataset_info(dataset)
    torch.manual_seed(0)
    model = build_model(model_name, info)
    start = model_weights(model)
    rng = np.random.default_rng(0)
    trajectory = [start]
    for _ in range(30):  # w^0 .. w^R, R = 30, each a small step from the last
        trajectory.append({k: (v + 0.01 * rng.standard_normal(v.shape)).astype(np.float32) if v.dtype == np.float32
                           else v for k, v in trajectory[-1].items()})

    def run(m: int) -> float:
        settings = SynSAMSettings(synthetic_ipc=20, distill_iterations=m, distill_inner_steps=inner_steps,
                                  distill_optimizer="adam", distill_lr=0.05)
        return min(timed(lambda: distill(model, trajectory, info.num_classes, info.shape, settings, device), device)
                   for _ in range(2))

    # a run also evaluates the loss over all segments before and after: the fixed part of t(1)
    one = run(1)
    per_iteration = (run(1 + iterations) - one) / iterations
    fixed = max(one - per_iteration, 0.0)
    return Row("trajectory distillation", f"{setting}; + {fixed:.3g} s of start/end loss", str(device),
               "s / iteration", per_iteration, 200, fixed + per_iteration * 200, "once per run, after round R")


def diffusion_rows(setting: str, preset: str, channels: int, side: int, aux_images: int, sampler: SamplerSpec,
                   train_batch: int, fid_samples: int, device: torch.device) -> list[Row]:
    timesteps = UNET_PRESETS[preset].timesteps
    model = build_unet(preset, channels, side, timesteps, seed=0).to(device)
    batch = 64 if device.type == "cpu" else 256
    probe = SamplerSpec("ddim", timesteps, 5)  # 5 denoising steps of a full batch: the unit of sampling cost
    sample(model, probe, batch, (channels, side, side), torch.Generator().manual_seed(0), device, batch_size=batch)
    seconds = timed(lambda: sample(model, probe, batch, (channels, side, side), torch.Generator().manual_seed(0),
                                   device, batch_size=batch), device)
    per_image_step = seconds / (batch * probe.ddim_steps)
    steps = sampler.ddim_steps if sampler.kind == "ddim" else timesteps
    images = torch.rand(train_batch * 3, channels, side, side, device=device) * 2 - 1
    schedule = linear_schedule(timesteps)
    train_on_images(model, images[:train_batch], schedule, epochs=1, batch_size=train_batch, lr=5e-5,
                    optimizer="adam", generator=seeded_generator(0))
    epoch_s = timed(lambda: train_on_images(model, images, schedule, epochs=1, batch_size=train_batch, lr=5e-5,
                                            optimizer="adam", generator=seeded_generator(1)), device)
    per_step = epoch_s / 3
    correction_steps = -(-aux_images // train_batch)
    extractor = FeatureCNN(channels, 10).to(device).eval()
    fake = np.random.default_rng(0).uniform(-1, 1, size=(fid_samples, channels, side, side)).astype(np.float32)
    reference = gaussian_stats(np.random.default_rng(1).standard_normal((fid_samples, FeatureCNN.feature_dim)))

    def fid() -> None:
        with torch.no_grad():
            features = torch.cat([extractor.body(torch.from_numpy(fake[i:i + 500]).to(device))
                                  for i in range(0, fid_samples, 500)]).double().cpu().numpy()
        frechet_distance(gaussian_stats(features), reference)

    fid()
    fid_s = timed(fid, device)
    label = f"{preset} {side}x{side}"
    return [
        Row("auxiliary sampling", f"{setting}: {label}, {aux_images} auxiliary images, {sampler.label}", str(device),
            "s / (image x denoising step)", per_image_step, aux_images * steps, per_image_step * aux_images * steps,
            "once per run, after the warmup"),
        Row("correction epoch", f"{setting}: {label}, {aux_images} auxiliary images, batch {train_batch}", str(device),
            "s / step", per_step, correction_steps, per_step * correction_steps,
            "every round (FedDDPM); x oneshot-epochs once (FedDDPM+)"),
        Row("FID (features + Frechet)", f"{setting}: {fid_samples} samples; sampling them: the sampling row's unit "
            f"x {fid_samples} x steps", str(device), "s per FID", fid_s, 1, fid_s, "every fid-every rounds"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_options(parser, REPO_ROOT / "benchmarks/results/server_work.md")
    parser.add_argument("--paper", action="store_true", help="also the paper sizes on the CPU (slow)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    for device in available_devices(args.devices):
        paper = device.type == "cuda" or args.paper
        rows.append(distillation_row("cpu preset: F-MNIST mlp, s = 3", "fashion-mnist", "mlp", 3, 40, device))
        if paper:
            rows.append(distillation_row("paper: CIFAR-10 convnet, s = 5", "cifar10", "convnet", 5,
                                         10 if device.type == "cuda" else 2, device))
        rows += diffusion_rows("cpu preset", "unet-small", 1, 8, 960, SamplerSpec("ddim", 500, 50), 64, 500, device)
        if paper:
            rows += diffusion_rows("paper MNIST", "unet-paper-mnist", 1, 28, 6000, SamplerSpec("ddpm", 500, 0),
                                   128, 1000, device)
        for row in rows:
            if row.device == str(device):
                print(json.dumps(asdict(row)), flush=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    lines = [
        f"Server-side work on {platform.node()}: {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} "
        f"torch thread(s) for the CPU rows, GPU: {gpu}; load average {os.getloadavg()[0]:.1f} at the end. Command: "
        f"`python benchmarks/server_work.py --devices {args.devices} --threads {args.threads}"
        + (" --paper" if args.paper else "") + "`.",
        "",
        "| work | setting | device | unit | unit time (s) | count | projected (s) | paid |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r.work} | {r.setting} | {r.device} | {r.unit} | {r.unit_s:.3g} | {r.count:g} | "
              f"{r.projected_s:.3g} | {r.when} |" for r in rows]
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
