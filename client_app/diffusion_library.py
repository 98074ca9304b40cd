"""FedDDPM and FedDDPM+ for a Flower developer's own ClientApp: the U-Net, the DDPM step and the phases' replies.

fedsynth's own ClientApp trains DDPMs through client_app/diffusion.py, from a
run config. A developer's ClientApp has none: it builds the same U-Net
(`build_unet`), trains it with the same epsilon-prediction loss
(`train_ddpm`), and answers the two messages FedDDPM sends outside the
rounds with `warmup_reply` (the warm-up: a train message whose config has
`phase = "warmup"`, `is_warmup`) and `feature_sums_reply` (FedDDPM+'s
`query.fid_stats`). docs/library.md, "FedDDPM's phases outside the rounds",
says what each message carries.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict
from torch import nn

from client_app.training import Batches, LocalOptimizer, TrainResult, train_steps
from common.metrics.fid import feature_sums
from common.metrics.fid_features import TRAVELLING_EXTRACTORS, extractor_from_weights
from common.models.diffusion import UNET_PRESETS, DDPMLoss, linear_schedule, seeded_generator
from common.models.diffusion import build_unet as build_preset_unet
from common.models.diffusion_settings import WarmupSettings
from common.protocol import DIFFUSION_PHASE, FID_EXTRACTOR, FID_SUMS, MODEL, WARMUP_PHASE
from common.records import from_record, to_record
from common.run.client_settings import rule_settings

# Adam at 2e-4, DDPM's own optimizer (fedsynth's local optimizer `auto` picks Adam for the diffusion task)
DDPM_OPTIMIZER = LocalOptimizer(lr=2e-4, kind="adam")


def build_unet(preset: str = "unet-small", *, channels: int = 1, image_size: int = 28, timesteps: int | None = None,
               seed: int | None = None) -> nn.Module:
    """The noise predictor FedDDPM's server builds: diffusers' `UNet2DModel` of one of fedsynth's presets
    (`unet-small`, `unet-paper-mnist`, `unet-paper-cifar`), for `channels` x `image_size` x `image_size` images;
    `timesteps` T (None: the preset's); with `seed`, seeded initial weights (torch's global RNG untouched).

    Build the strategy with the same `model=preset`, `image_channels`, `image_size` and `diffusion_timesteps`,
    and the server's and the nodes' models have the same arrays.
    """
    if preset not in UNET_PRESETS:
        raise ValueError(f"unknown U-Net preset {preset!r}; known: {', '.join(UNET_PRESETS)}")
    return build_preset_unet(preset, channels, image_size, timesteps or UNET_PRESETS[preset].timesteps, seed=seed)


def train_ddpm(model: nn.Module, batches: Batches, *, timesteps: int, optimizer: LocalOptimizer = DDPM_OPTIMIZER,
               seed: int | tuple[int, ...] = 0) -> TrainResult:
    """DDPM's local training: one optimizer step per batch on the epsilon-prediction loss
    mean ||eps - eps_w(x_t, t)||^2, with eps and t drawn from a generator seeded by `seed` (e.g. `(round,
    partition)`), over the linear beta schedule of `timesteps` steps (the U-Net's T).

    `batches` yields `(images, labels)` (labels are ignored), `(images,)` (a `TensorDataset` of images) or images, the images in [-1, 1] of the
    model's shape. The rule fedsynth's own nodes run for FedDDPM's rounds and its warm-up.
    """
    parts = seed if isinstance(seed, tuple) else (seed,)
    loss_fn = DDPMLoss(linear_schedule(timesteps), seeded_generator(*parts))

    def rule(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model, xb, yb)
        loss.backward()
        return loss.detach()

    # images alone get placeholder labels: the loop moves (inputs, labels) pairs to the model's device
    def images_and_labels(batch):
        images = batch[0] if isinstance(batch, (tuple, list)) else batch  # (images, labels), (images,) or images
        return images, torch.zeros(len(images), dtype=torch.long)

    pairs = (images_and_labels(batch) for batch in batches)
    return train_steps(model, pairs, rule, optimizer)


def is_warmup(msg: Message) -> bool:
    """Whether a train message is FedDDPM's warm-up (config `phase = "warmup"`), not a round."""
    config = msg.content.config_records.get("config")
    return config is not None and str(config.get(DIFFUSION_PHASE, "")) == WARMUP_PHASE


def warmup_length(msg: Message) -> tuple[int, int]:
    """(epochs, steps) of the warm-up the server asks for: train `steps` steps, or `epochs` epochs when 0.

    Read as fedsynth's node reads them (`WarmupSettings` by `rule_settings`): a missing key is a ValueError, a
    mistyped or out-of-range value a ConfigError, each naming the key."""
    warmup = rule_settings(msg.content["config"], WarmupSettings)
    return warmup.warmup_epochs, warmup.warmup_steps


def warmup_reply(msg: Message, model: nn.Module, *, num_examples: int, train_loss: float) -> Message:
    """The warm-up's reply: the node's warm DDPM as `arrays` (uncompressed, whatever the codec) and its
    `num-examples` m_i (the server samples `aux_fraction * m_i` images from the warm model)."""
    if not isinstance(num_examples, int) or isinstance(num_examples, bool) or num_examples <= 0:
        raise ValueError(f"num_examples must be an int > 0, got {num_examples!r}")
    return Message(RecordDict({MODEL: to_record({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}),
                               "metrics": MetricRecord({"num-examples": num_examples, "train-loss": float(train_loss)})}),
                   reply_to=msg)


def feature_sums_reply(msg: Message, images: torch.Tensor | np.ndarray) -> Message:
    """FedDDPM+'s `query.fid_stats` reply: (sum f, sum f f^T) of the features of the node's training `images`
    ((N, C, H, W) in [-1, 1]) under the extractor the server sent, as `fid-sums`, and N as `num-examples`.

    The server sends the `classifier` and `random` extractors' weights in `fid-extractor`; the `inception`
    extractor needs Inception-v3 weights on the node and is answered by fedsynth's own ClientApp only.
    """
    name = str(msg.content["config"]["fid-features"])
    if name not in TRAVELLING_EXTRACTORS or FID_EXTRACTOR not in msg.content.array_records:
        raise ValueError(f"feature_sums_reply answers the extractors the server sends ({', '.join(TRAVELLING_EXTRACTORS)}), "
                         f"not {name!r}: build the strategy with fid_features='random' or 'classifier'")
    x = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    extractor = extractor_from_weights(name, from_record(msg.content[FID_EXTRACTOR]), int(x.shape[1]))
    sum_f, sum_ff, count = feature_sums(extractor.features(x.astype(np.float32)))
    return Message(RecordDict({FID_SUMS: to_record({"sum-f": sum_f, "sum-ff": sum_ff}),
                               "metrics": MetricRecord({"num-examples": int(count)})}), reply_to=msg)
