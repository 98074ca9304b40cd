"""The diffusion task: DDPM noise predictors, the linear-beta schedule, the epsilon loss and samplers.

SPEC 3.3 (`unet`) and 4.4. A diffusion run trains `diffusers.UNet2DModel` noise
predictors on images scaled to [-1, 1] with the DDPM objective
`||eps - eps_w(x_t, t)||^2`, `x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`, on a
linear beta schedule from 1e-4 to 0.02 (diffusers' `DDPMScheduler` defaults).
The schedule, the loss and the two samplers are written out here as small
functions on tensors, rather than driven through diffusers' stateful scheduler
objects, so that each can be seeded with its own `torch.Generator` (runs are
reproducible on every device) and checked against diffusers' `DDPMScheduler` /
`DDIMScheduler` in the tests.

Samplers: `ancestral` is DDPM's sampler (T steps, "fixed_small" variance, x_0
clipped to [-1, 1]) and is what results use by default; `ddim` is DDIM with
eta = 0 on `ddim-steps` "trailing" timesteps, for quick checks — every number a
DDIM sample produced is labelled with the sampler (`SamplerSpec.label`).

diffusers is imported inside the functions that need it: importing it takes
seconds. The preset, sampler and extractor names are common/models/diffusion_names.py's, which the
run config's parts read without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.data.datasets import run_dataset_info
from common.algorithms.optimizers import make_optimizer
from common.models.diffusion_names import (  # noqa: F401 - the names, re-exported beside the task that uses them
    FID_EXTRACTORS, SAMPLERS, UNET_MODELS, UNET_PRESETS, UNetPreset, is_diffusion,
)

BETA_START = 1e-4
BETA_END = 0.02


class DiffusionTask(Protocol):
    """The run-config keys of several parts the diffusion task reads (common/run/config.py's `RunConfig` has them all).

    Every function below that takes a config takes this protocol, duck-typed: each reads keys of two or
    more parts (`model` of common/models/settings.py's ModelSettings, `seed` of RunSettings,
    `image-size` of DataSettings, the local optimizer of LocalTrainingSettings, and the diffusion keys of
    common/models/diffusion_settings.py's DiffusionSettings). A protocol, not the run config itself: the
    run config validates its keys against the presets (common/models/diffusion_names.py) from the floor above
    (common/run), so this module cannot import it.
    `image_side`/`image_shape` also pass the config to common/data/datasets.py's `run_dataset_info`,
    which reads the dataset keys.
    """

    model: str
    seed: int
    image_size: int
    diffusion_timesteps: int
    local_optimizer: str
    sampler: str
    aux_sampler: str
    ddim_steps: int


def image_side(cfg: DiffusionTask) -> int:
    """Side of the images the diffusion task trains on: `image-size`, or the dataset's own."""
    return cfg.image_size or run_dataset_info(cfg).height


def image_shape(cfg: DiffusionTask) -> tuple[int, int, int]:
    """(C, H, W) of the diffusion task's images."""
    side = image_side(cfg)
    return (run_dataset_info(cfg).channels, side, side)


def num_timesteps(cfg: DiffusionTask) -> int:
    """T: `diffusion-timesteps`, or the U-Net preset's."""
    return cfg.diffusion_timesteps or UNET_PRESETS[cfg.model].timesteps


def optimizer_kind(cfg: DiffusionTask, kind: str | None = None) -> str:
    """The local optimizer (`kind`, else the run config's), with `auto` meaning Adam for the diffusion task
    (FedDDPM) and SGD otherwise."""
    kind = cfg.local_optimizer if kind is None else kind
    if kind == "auto":
        return "adam" if is_diffusion(cfg) else "sgd"
    return kind


# ----- models -----------------------------------------------------------------------
def build_unet(preset_name: str, channels: int, side: int, timesteps: int, seed: int | None = None) -> nn.Module:
    """A fresh `UNet2DModel` of a preset; with `seed`, initialised from it (torch's global RNG untouched)."""
    from diffusers import UNet2DModel

    preset = UNET_PRESETS[preset_name]
    if side % preset.downsampling:
        raise ValueError(f"{preset_name!r} halves the image {len(preset.channels) - 1} times: the image side "
                         f"must be divisible by {preset.downsampling}, got {side}")
    down = tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in preset.attention)
    up = tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(preset.attention))

    def build() -> nn.Module:
        return UNet2DModel(
            sample_size=side, in_channels=channels, out_channels=channels,
            block_out_channels=preset.channels, layers_per_block=preset.layers_per_block,
            down_block_types=down, up_block_types=up, add_attention=preset.mid_attention,
            attention_head_dim=None,  # one attention head over all channels, as in DDPM
            norm_num_groups=preset.norm_groups, dropout=preset.dropout, num_train_timesteps=timesteps,
        )

    if seed is None:
        return build()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def build_diffusion_model(cfg: DiffusionTask, seeded: bool = False) -> nn.Module:
    """The run's noise predictor (SPEC 3.3 `unet`)."""
    channels, side, _ = image_shape(cfg)
    return build_unet(cfg.model, channels, side, num_timesteps(cfg), seed=cfg.seed if seeded else None)


def predict_noise(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """eps_w(x_t, t) of a UNet2DModel."""
    return model(x, t, return_dict=False)[0]


# ----- schedule and loss --------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """The DDPM forward process: betas and their cumulative products abar_t (float32, like diffusers)."""

    betas: torch.Tensor
    alphas_cumprod: torch.Tensor

    @property
    def timesteps(self) -> int:
        """T."""
        return int(self.betas.shape[0])


def linear_schedule(timesteps: int, beta_start: float = BETA_START, beta_end: float = BETA_END) -> Schedule:
    """beta_t linear from beta_start to beta_end over T steps; abar_t = prod_{s<=t} (1 - beta_s)."""
    if timesteps < 2:
        raise ValueError(f"a DDPM schedule needs at least 2 timesteps, got {timesteps}")
    betas = torch.linspace(beta_start, beta_end, timesteps, dtype=torch.float32)
    return Schedule(betas=betas, alphas_cumprod=torch.cumprod(1.0 - betas, dim=0))


def _per_sample(values: torch.Tensor, ndim: int) -> torch.Tensor:
    return values.reshape(-1, *([1] * (ndim - 1)))


def add_noise(schedule: Schedule, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps (q(x_t | x_0))."""
    abar = schedule.alphas_cumprod.to(x0.device)[t.to(x0.device)]
    return _per_sample(abar.sqrt(), x0.ndim) * x0 + _per_sample((1.0 - abar).sqrt(), x0.ndim) * noise


def draw_noise(x0: torch.Tensor, timesteps: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(eps, t) for a batch: eps ~ N(0, I), then t ~ U{0..T-1} (diffusers' training-example order).

    Drawn on the CPU from `generator` and moved, so a seed gives the same noise on every device.
    """
    noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype)
    t = torch.randint(0, timesteps, (x0.shape[0],), generator=generator)
    return noise.to(x0.device), t.to(x0.device)


def ddpm_loss(model: nn.Module, schedule: Schedule, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The epsilon-prediction loss mean ||eps - eps_w(x_t, t)||^2 of a batch."""
    return F.mse_loss(predict_noise(model, add_noise(schedule, x0, noise, t), t), noise)


class DDPMLoss:
    """The diffusion task's `LocalJob.loss_fn(model, xb, yb)`: labels are ignored.

    Noise and timesteps come from a seeded generator. A rule that evaluates the
    loss twice on the same batch (SAM: at w and at w + e) sees the same (eps, t)
    both times, so the ascent and descent gradients are of the same loss.
    """

    def __init__(self, schedule: Schedule, generator: torch.Generator) -> None:
        self.schedule = schedule
        self.generator = generator
        self._batch: torch.Tensor | None = None
        self._draw: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor | None = None) -> torch.Tensor:
        if xb is not self._batch or self._draw is None:
            self._batch, self._draw = xb, draw_noise(xb, self.schedule.timesteps, self.generator)
        noise, t = self._draw
        return ddpm_loss(model, self.schedule, xb, noise, t)


def seeded_generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from integers (seed, round, partition, purpose)."""
    seed = int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


def train_on_images(
    model: nn.Module, images: torch.Tensor, schedule: Schedule, *, epochs: int, batch_size: int, lr: float,
    optimizer: str, generator: torch.Generator,
) -> float:
    """`epochs` passes of the DDPM loss over `images` (seeded order and noise); returns the mean loss.

    FedDDPM's server correction on the auxiliary set runs this.
    """
    model.train()
    opt = make_optimizer(model.parameters(), optimizer, lr)
    loss_fn = DDPMLoss(schedule, generator)
    total, steps = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(images.shape[0], generator=generator).to(images.device)
        for start in range(0, images.shape[0], batch_size):
            xb = images[order[start:start + batch_size]]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, xb)
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
    return total / max(steps, 1)


# ----- samplers ---------------------------------------------------------------------------
def ancestral_step(schedule: Schedule, x: torch.Tensor, eps: torch.Tensor, t: int, noise: torch.Tensor | None) -> torch.Tensor:
    """x_{t-1} from x_t: DDPM's posterior mean with x_0 clipped to [-1, 1], plus sigma_t z ("fixed_small").

    sigma_t^2 = (1 - abar_{t-1}) / (1 - abar_t) beta_t; no noise at t = 0.
    """
    abar_t = schedule.alphas_cumprod[t]
    abar_prev = schedule.alphas_cumprod[t - 1] if t > 0 else torch.tensor(1.0)
    beta_t = 1 - abar_t / abar_prev
    x0 = ((x - (1 - abar_t).sqrt() * eps) / abar_t.sqrt()).clamp(-1.0, 1.0)
    mean = (abar_prev.sqrt() * beta_t / (1 - abar_t)) * x0 + ((1 - beta_t).sqrt() * (1 - abar_prev) / (1 - abar_t)) * x
    if t == 0 or noise is None:
        return mean
    variance = torch.clamp((1 - abar_prev) / (1 - abar_t) * beta_t, min=1e-20)
    return mean + variance.sqrt() * noise


def ddim_timesteps(timesteps: int, steps: int) -> list[int]:
    """DDIM's "trailing" timesteps (T-1 first): with few steps the chain starts at the noisiest step."""
    if not 1 <= steps <= timesteps:
        raise ValueError(f"ddim-steps must be in 1..T={timesteps}, got {steps}")
    return [int(t) for t in np.round(np.arange(timesteps, 0, -timesteps / steps)).astype(np.int64) - 1]


def ddim_step(schedule: Schedule, x: torch.Tensor, eps: torch.Tensor, t: int, prev_t: int) -> torch.Tensor:
    """Deterministic DDIM (eta = 0) from t to prev_t, x_0 clipped to [-1, 1]; abar_{-1} = 1."""
    abar_t = schedule.alphas_cumprod[t]
    abar_prev = schedule.alphas_cumprod[prev_t] if prev_t >= 0 else torch.tensor(1.0)
    x0 = ((x - (1 - abar_t).sqrt() * eps) / abar_t.sqrt()).clamp(-1.0, 1.0)
    return abar_prev.sqrt() * x0 + (1 - abar_prev).sqrt() * eps


@dataclass(frozen=True)
class SamplerSpec:
    """Which sampler produces images, and how many network evaluations it takes."""

    kind: str          # "ddpm" (ancestral) or "ddim"
    timesteps: int     # T of the model
    ddim_steps: int = 50

    @property
    def label(self) -> str:
        """How results name the sampler: `ddpm-ancestral-T<T>` or `ddim-<steps>-of-T<T>`."""
        if self.kind == "ddim":
            return f"ddim-{self.ddim_steps}-of-T{self.timesteps}"
        return f"ddpm-ancestral-T{self.timesteps}"


def sampler_spec(cfg: DiffusionTask) -> SamplerSpec:
    """The run's sampler (`sampler`, `ddim-steps`)."""
    return SamplerSpec(cfg.sampler, num_timesteps(cfg), cfg.ddim_steps)


def aux_sampler_spec(cfg: DiffusionTask) -> SamplerSpec:
    """The sampler of FedDDPM's auxiliary set (`aux-sampler`, `ddim-steps`): ancestral by default, as the paper."""
    return SamplerSpec(cfg.aux_sampler, num_timesteps(cfg), cfg.ddim_steps)


@torch.no_grad()
def _sample_batch(model: nn.Module, schedule: Schedule, spec: SamplerSpec, shape: tuple[int, ...],
                  generator: torch.Generator, device: torch.device) -> torch.Tensor:
    x = torch.randn(shape, generator=generator).to(device)
    sched = Schedule(schedule.betas.to(device), schedule.alphas_cumprod.to(device))
    if spec.kind == "ddim":
        ts = ddim_timesteps(spec.timesteps, spec.ddim_steps)
        stride = spec.timesteps // spec.ddim_steps
        for t in ts:
            eps = predict_noise(model, x, torch.full((shape[0],), t, device=device, dtype=torch.long))
            x = ddim_step(sched, x, eps, t, t - stride)
    else:
        for t in range(spec.timesteps - 1, -1, -1):
            eps = predict_noise(model, x, torch.full((shape[0],), t, device=device, dtype=torch.long))
            noise = torch.randn(shape, generator=generator).to(device) if t > 0 else None
            x = ancestral_step(sched, x, eps, t, noise)
    return x.clamp(-1.0, 1.0)


def sample(model: nn.Module, spec: SamplerSpec, count: int, image: tuple[int, int, int], generator: torch.Generator,
           device: torch.device, batch_size: int = 256, on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """`count` images in [-1, 1] as float32 (count, C, H, W), drawn in batches from a seeded generator.

    `on_batch(n)` is called after each batch of n images (a `Progress.advance`, common/run/progress.py); the
    images are the same with it or without.
    """
    schedule = linear_schedule(spec.timesteps)
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, count, batch_size):
            n = min(batch_size, count - start)
            out.append(_sample_batch(model, schedule, spec, (n, *image), generator, device).cpu().numpy())
            if on_batch is not None:
                on_batch(n)
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros((0, *image), dtype=np.float32)


# ----- data ---------------------------------------------------------------------------------
def to_diffusion_input(images: np.ndarray, side: int, chunk: int = 10_000) -> np.ndarray:
    """uint8 (N, H, W, C) -> float32 (N, C, side, side) in [-1, 1], resized with antialiasing if needed."""
    out = np.empty((images.shape[0], images.shape[3], side, side), dtype=np.float32)
    for start in range(0, images.shape[0], chunk):
        x = torch.tensor(images[start:start + chunk]).permute(0, 3, 1, 2).float() / 255.0  # copies: IDX arrays are read-only
        if x.shape[-1] != side or x.shape[-2] != side:
            x = F.interpolate(x, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
        out[start:start + chunk] = (x.clamp(0.0, 1.0) * 2.0 - 1.0).numpy()
    return out


def to_uint8(images: np.ndarray) -> np.ndarray:
    """float (N, C, H, W) in [-1, 1] -> uint8 (N, H, W, C)."""
    scaled = np.clip((np.asarray(images) + 1.0) * 127.5 + 0.5, 0, 255).astype(np.uint8)
    return scaled.transpose(0, 2, 3, 1)


def save_image_grid(images: np.ndarray, path: Path, columns: int = 8, scale: int = 2) -> Path:
    """A PNG grid of images in [-1, 1] (N, C, H, W), one pixel of padding between them."""
    from PIL import Image

    pixels = to_uint8(images)
    count, height, width, channels = pixels.shape
    columns = max(1, min(columns, count))
    rows = max(1, math.ceil(count / columns))
    grid = np.full((rows * (height + 1) + 1, columns * (width + 1) + 1, channels), 255, dtype=np.uint8)
    for i in range(count):
        r, c = divmod(i, columns)
        grid[1 + r * (height + 1): 1 + r * (height + 1) + height, 1 + c * (width + 1): 1 + c * (width + 1) + width] = pixels[i]
    image = Image.fromarray(grid[..., 0] if channels == 1 else grid)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path



def loss_for(cfg: DiffusionTask, generator: torch.Generator) -> DDPMLoss:
    """The diffusion task's batch loss for a run."""
    return DDPMLoss(linear_schedule(num_timesteps(cfg)), generator)
