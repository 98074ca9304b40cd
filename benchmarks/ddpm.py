"""Speed of the diffusion task: DDPM training steps and sampling throughput of each U-Net preset.

Usage: ``python benchmarks/ddpm.py [--out FILE] [--devices cpu,cuda] [--threads N] [--repeats R]``

For each U-Net preset of common/models/diffusion.py at its image size (`unet-small` at
8x8 as the cpu preset runs it, at 16x16 and at 28x28, `unet-paper-mnist` at 28x28,
`unet-paper-cifar` at 32x32) and each available device, it measures

- the wall time of one DDPM training step (epsilon loss, backward, Adam) at a
  batch size, best of ``--repeats`` after one warm-up step, also per image;
- the wall time of one batched network evaluation in sampling (no grad), from
  which it derives samples per second of the ancestral sampler (T evaluations
  per sample) and of DDIM-50, and it checks the derivation with one direct
  DDIM-10 sampling call.

The paper U-Nets use a small batch on the CPU (a step takes seconds there). The
markdown table is printed and written to ``--out``; the numbers also go to a
JSON file beside it. Timings are of this machine at the time of the run: the
table header records the CPU count, torch threads and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from timing import add_device_options, available_devices, best_time, timed

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from common.models.diffusion import (  # noqa: E402
    UNET_PRESETS, DDPMLoss, SamplerSpec, build_unet, linear_schedule, predict_noise, sample,
)

# (preset, image side, channels, train batch on CPU, train batch on GPU, sampling batch)
CASES = [
    ("unet-small", 8, 1, 64, 128, 256),
    ("unet-small", 16, 1, 64, 128, 256),
    ("unet-small", 28, 1, 64, 128, 256),
    ("unet-paper-mnist", 28, 1, 8, 128, 64),
    ("unet-paper-cifar", 32, 3, 4, 64, 32),
]


@dataclass
class Measurement:
    """One (preset, side, device) row."""

    preset: str
    side: int
    device: str
    params_millions: float
    timesteps: int
    train_batch: int
    train_step_s: float
    train_ms_per_image: float
    sample_batch: int
    eval_s: float
    ancestral_samples_per_s: float
    ddim50_samples_per_s: float
    ddim10_direct_samples_per_s: float


def measure(preset: str, side: int, channels: int, train_batch: int, sample_batch: int,
            device: torch.device, repeats: int) -> Measurement:
    timesteps = UNET_PRESETS[preset].timesteps
    model = build_unet(preset, channels, side, timesteps, seed=0).to(device)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
    loss_fn = DDPMLoss(linear_schedule(timesteps), torch.Generator().manual_seed(0))
    x0 = (torch.rand(train_batch, channels, side, side, generator=torch.Generator().manual_seed(1)) * 2 - 1).to(device)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, x0.clone()).backward()
        optimizer.step()

    step = best_time(train_step, repeats, device)
    model.eval()
    xs = torch.randn(sample_batch, channels, side, side).to(device)
    ts = torch.full((sample_batch,), timesteps // 2, device=device, dtype=torch.long)

    def evaluate() -> None:
        with torch.no_grad():
            predict_noise(model, xs, ts)

    evaluation = best_time(evaluate, repeats, device)
    direct_count = min(sample_batch, 32)
    direct = direct_count / timed(lambda: sample(model, SamplerSpec("ddim", timesteps, 10), direct_count,
                                                 (channels, side, side), torch.Generator().manual_seed(0), device,
                                                 batch_size=direct_count), device)
    return Measurement(
        preset=preset, side=side, device=str(device), params_millions=round(params, 3), timesteps=timesteps,
        train_batch=train_batch, train_step_s=step, train_ms_per_image=1000 * step / train_batch,
        sample_batch=sample_batch, eval_s=evaluation,
        ancestral_samples_per_s=sample_batch / (timesteps * evaluation),
        ddim50_samples_per_s=sample_batch / (50 * evaluation), ddim10_direct_samples_per_s=direct,
    )


def markdown(rows: list[Measurement], header: str) -> str:
    lines = [header, "",
             "| U-Net | side | device | params (M) | T | train batch | s / train step | ms / image | "
             "sampling batch | s / evaluation | samples/s ancestral (T steps) | samples/s DDIM-50 | "
             "samples/s DDIM-10 (measured directly) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r.preset} | {r.side} | {r.device} | {r.params_millions:.2f} | {r.timesteps} | {r.train_batch} | "
            f"{r.train_step_s:.3f} | {r.train_ms_per_image:.1f} | {r.sample_batch} | {r.eval_s:.3f} | "
            f"{r.ancestral_samples_per_s:.3g} | {r.ddim50_samples_per_s:.3g} | {r.ddim10_direct_samples_per_s:.3g} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_options(parser, REPO_ROOT / "benchmarks/results/ddpm.md")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--presets", default="", help="comma-separated subset of the U-Net presets")
    parser.add_argument("--sides", default="", help="comma-separated subset of the image sides (8, 16, 28, 32)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = set(args.presets.split(",")) if args.presets else None
    rows = []
    for device in available_devices(args.devices):
        for preset, side, channels, cpu_batch, gpu_batch, sample_batch in CASES:
            if (wanted is not None and preset not in wanted) or (args.sides and str(side) not in args.sides.split(",")):
                continue
            batch = gpu_batch if device.type == "cuda" else cpu_batch
            row = measure(preset, side, channels, batch, sample_batch, device, args.repeats)
            print(json.dumps(asdict(row)), flush=True)
            rows.append(row)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    header = (f"DDPM speed on {platform.node()}: {os.cpu_count()} CPUs, torch {torch.__version__}, "
              f"{args.threads} torch thread(s), load average {os.getloadavg()[0]:.1f} at the end, GPU: {gpu}; "
              f"best of {args.repeats} after a warm-up.")
    table = markdown(rows, header)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": [asdict(r) for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
