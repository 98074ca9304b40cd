"""The learning task: which model a run trains, built identically on server and clients.

Server and clients must build the same architecture from the same run config
(MOON adds a projection head), and the server's initial weights come from the
run's seed so that runs are reproducible.
"""

from __future__ import annotations

import torch
from torch import nn

from common.run.config import ConfigError, RunConfig
from common.data.datasets import run_dataset_info
from common.models.diffusion import build_diffusion_model, is_diffusion
from common.models.classifiers import build_model, is_user_model


def base_algorithm(algorithm: str) -> str:
    """The base of a composite algorithm name (`moon+cog` -> `moon`)."""
    return algorithm.split("+", 1)[0]


def make_model(cfg: RunConfig, *, seeded: bool = False) -> nn.Module:
    """The run's model; with `seeded`, initialised from the run's seed (the global model at round 0)."""
    if is_diffusion(cfg):  # the diffusion task's noise predictor (common/models/diffusion.py)
        return build_diffusion_model(cfg, seeded=seeded)
    projection = cfg.moon_projection_dim if base_algorithm(cfg.algorithm) == "moon" else 0
    if seeded:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            return build_model(cfg.model, run_dataset_info(cfg), moon_projection_dim=projection,
                               gn_groups=cfg.gn_groups)
    return build_model(cfg.model, run_dataset_info(cfg), moon_projection_dim=projection, gn_groups=cfg.gn_groups)


def check_task_model(cfg: RunConfig) -> None:
    """ConfigError naming the model when the run's model does not fit its task (a user's model: its output width).

    Called on the server and on every node at the handshake, before round 1: a user's factory
    (`package.module:factory`) may be another version on another host. Built-in models take the
    class count by construction and are checked by the config (`check_model_fits`).
    """
    if is_diffusion(cfg) or not is_user_model(cfg.model):
        return
    try:
        make_model(cfg)
    except ValueError as err:
        raise ConfigError(f"run config key 'model': {err}") from None
