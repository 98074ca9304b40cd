"""The diffusion task's names: the U-Net presets, the samplers, the FID extractors and the algorithms it runs.

The run config checks its keys against these (common/models/settings.py, common/models/diffusion_settings.py,
common/run/config.py), so they live apart from the task's torch code (common/models/diffusion.py): the
run config, and `import fedsynth.strategies`, do not load torch (tests/test_light_import.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SAMPLERS = ("ddpm", "ddim")
FID_EXTRACTORS = ("classifier", "random", "inception")  # common/metrics/fid_features.py


@dataclass(frozen=True)
class UNetPreset:
    """A `UNet2DModel` configuration and the number of diffusion steps T it is trained with."""

    channels: tuple[int, ...]       # block_out_channels, from the input resolution down
    layers_per_block: int           # residual blocks per level
    attention: tuple[bool, ...]     # self-attention per level
    mid_attention: bool             # self-attention in the bottleneck
    timesteps: int                  # T
    norm_groups: int = 32
    dropout: float = 0.0

    @property
    def downsampling(self) -> int:
        """The image side must be divisible by this (one halving between levels)."""
        return 2 ** (len(self.channels) - 1)


UNET_PRESETS: dict[str, UNetPreset] = {
    # For tests and CPU runs: two levels (16x16 -> 8x8 at image-size 16), no attention.
    "unet-small": UNetPreset((32, 64), 1, (False, False), False, 500, norm_groups=8),
    # FedDDPM's MNIST model: 128/128/256 channels at 28/14/7, one residual block per level, T = 500;
    # the paper mentions no attention for it.
    "unet-paper-mnist": UNetPreset((128, 128, 256), 1, (False, False, False), False, 500),
    # FedDDPM's CIFAR model (DDPM's CIFAR-10 U-Net): 128/256/256/256 at 32/16/8/4, two residual
    # blocks per level, self-attention at 16x16 and in the bottleneck, dropout 0.1, T = 1000.
    "unet-paper-cifar": UNetPreset(
        (128, 256, 256, 256), 2, (False, True, False, False), True, 1000, dropout=0.1
    ),
}
UNET_MODELS = tuple(UNET_PRESETS)


class NamesAModel(Protocol):
    """Anything with the run config's `model` key: a `RunConfig`, a `ServerTask`, the diffusion task's keys."""

    model: str


def is_diffusion(cfg: NamesAModel) -> bool:
    """True when the run trains a DDPM (its model is a U-Net preset)."""
    return cfg.model in UNET_PRESETS
