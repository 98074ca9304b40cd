"""The learning task: which model a run trains, built identically on server and clients.

Server and clients must build the same architecture from the same run config
(MOON adds a projection head), and the server's initial weights come from the
run's seed so that runs are reproducible.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.algorithms.plugins import known_algorithm
from common.run.config import ConfigError, RunConfig
from common.data.datasets import run_dataset_info
from common.models.classifier_names import is_user_model
from common.models.diffusion_names import is_diffusion

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ServerTask:
    """The model a strategy builds on the server itself, and the shape facts of the data it fits.

    FedSynSAM's and DynaFed's distillation, DynaFed's server epochs and FedDDPM's sampling and corrections
    train the run's model on the server. This is all they need to build it (`make_model`) and to know the
    data's shape (`common.data.datasets.run_dataset_info`, `common.models.diffusion.image_shape`): the
    run-config keys of the model and of the data's shape, under their run-config names, and nothing of the
    rest of a run. `task_of` takes them from a run config; the public strategy classes build one from their
    own `model`, `dataset`, ... parameters.
    """

    model: str = "cnn"
    dataset: str = "fashion-mnist"
    data_dir: str = ""
    hf_image_column: str = ""
    hf_label_column: str = ""
    partition: str = "dirichlet"  # "node": the shape comes from the keys below alone (no data on the server)
    class_names: str = ""
    num_classes: int = 0
    image_channels: int = 0
    image_size: int = 0
    gn_groups: int = 2
    diffusion_timesteps: int = 0
    seed: int = 0
    algorithm: str = ""  # only MOON changes the model (a projection head); no server-built model is MOON's


def task_of(cfg: RunConfig) -> ServerTask:
    """The run's `ServerTask`: the run config's model and data-shape keys."""
    return ServerTask(model=cfg.model, dataset=cfg.dataset, data_dir=cfg.data_dir, hf_image_column=cfg.hf_image_column,
                      hf_label_column=cfg.hf_label_column, partition=cfg.partition, class_names=cfg.class_names,
                      num_classes=cfg.num_classes, image_channels=cfg.image_channels, image_size=cfg.image_size,
                      gn_groups=cfg.gn_groups, diffusion_timesteps=cfg.diffusion_timesteps, seed=cfg.seed,
                      algorithm=cfg.algorithm)


def task_values(task: ServerTask) -> dict[str, object]:
    """The run-config keys a `ServerTask` gives (all its fields but `algorithm`), for `check_parameters`."""
    return {name: value for name, value in dataclasses.asdict(task).items() if name != "algorithm"}


def make_model(cfg: RunConfig | ServerTask, *, seeded: bool = False) -> nn.Module:
    """The run's model; with `seeded`, initialised from the run's seed (the global model at round 0).

    torch and the builders are imported here, not with the module: a strategy holds its `ServerTask`
    without loading torch, and only one that builds the model on the server loads it.
    """
    import torch

    from common.models.classifiers import build_model
    from common.models.diffusion import build_diffusion_model

    if is_diffusion(cfg):  # the diffusion task's noise predictor (common/models/diffusion.py)
        return build_diffusion_model(cfg, seeded=seeded)
    row = known_algorithm(cfg.algorithm)
    projection = cfg.moon_projection_dim if row is not None and row.projection_head else 0  # MOON's head
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
    except ConfigError:  # the resolver's refusal names the site, the key and the path already
        raise
    except ValueError as err:
        raise ConfigError(f"run config key 'model': {err}") from None
