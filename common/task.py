"""The learning task: which model a run trains, built identically on server and clients.

Server and clients must build the same architecture from the same run config
(MOON adds a projection head), and the server's initial weights come from the
run's seed so that runs are reproducible.
"""

from __future__ import annotations

import torch
from torch import nn

from common.config import RunConfig
from common.datasets import run_dataset_info
from common.diffusion import build_diffusion_model, is_diffusion
from common.models import build_model


def base_algorithm(algorithm: str) -> str:
    """The base of a composite algorithm name (`moon+cog` -> `moon`)."""
    return algorithm.split("+", 1)[0]


def make_model(cfg: RunConfig, *, seeded: bool = False) -> nn.Module:
    """The run's model; with `seeded`, initialised from the run's seed (the global model at round 0)."""
    if is_diffusion(cfg):  # the diffusion task's noise predictor (common/diffusion.py)
        return build_diffusion_model(cfg, seeded=seeded)
    projection = cfg.moon_projection_dim if base_algorithm(cfg.algorithm) == "moon" else 0
    if seeded:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            return build_model(cfg.model, run_dataset_info(cfg), moon_projection_dim=projection,
                               gn_groups=cfg.gn_groups)
    return build_model(cfg.model, run_dataset_info(cfg), moon_projection_dim=projection, gn_groups=cfg.gn_groups)
