"""The settings of a training the server runs itself, each one grouped value of the strategy that runs it.

FedSynSAM and DynaFed distil a synthetic set on the server, DynaFed trains the global model on it, FedDDPM samples
an auxiliary set from the nodes' warm models and corrects on it, FedDDPM+ scores QuickTest and corrects once. Each
of these trainings takes many run-config keys; a class takes each training's keys as ONE keyword parameter, a
frozen dataclass of this module (`FedSynSAM(distillation=DistillationSettings(trajectory_rounds=30))`), as it
takes its codec, so that its constructor stays near FedAvg's size (issue 63, tests/test_strategy_size.py).

A field means what the run-config key of the same name means (its declaration, default and text are the key's
part's: common/algorithms/synsam_settings.py, common/models/diffusion_settings.py, ...; `same_key`), and is checked
when the value is built, by the part's checks with the run config's message (`check_parameters`), as `QSGD(bits=1)`
fails as `bits = 1` does. The `task` field is the model the training builds and the data's shape
(`common.run.task.ServerTask`), `device` where it runs. fedsynth's app builds each value from the run config
(`of`, server_app/registry.py). Importing this module does not load torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from common.algorithms.local_training_settings import LocalTrainingSettings
from common.algorithms.synsam_settings import DynaFedSettings, SynSAMSettings
from common.data.settings import DataSettings
from common.errors import ConfigError
from common.keys import SERVER, same_key
from common.models.diffusion_settings import DiffusionSettings
from common.run.config import RunConfig, check_parameters
from common.run.settings import RunSettings
from common.run.task import ServerTask, task_of, task_values

def _check(value: Any) -> None:
    """Check a grouped value's fields as the run config checks the keys of the same names; its `task` (if it has
    one) as the run config checks the model and data-shape keys. ConfigError names the class and the key."""
    owner = type(value).__name__
    keys = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name != "task"}
    check_parameters(owner, keys)
    if "task" in value.__dataclass_fields__:
        if not isinstance(value.task, ServerTask):
            raise ConfigError(f"{owner}: task = {value.task!r} is invalid; accepted: a fedsynth.strategies.ServerTask")
        check_parameters(owner, task_values(value.task))


def _of(cls: type, cfg: RunConfig) -> Any:
    """The value of the grouped settings `cls` that the run `cfg` gives: each field from the run-config key of the
    same name, `task` from the run's model and data-shape keys (`task_of`)."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls) if f.name != "task"}
    if "task" in cls.__dataclass_fields__:
        values["task"] = task_of(cfg)
    return cls(**values)


def field_list(cls: type) -> str:
    """The fields of the grouped settings `cls`, for a parameter's text in help()."""
    return ", ".join(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class DistillationSettings:
    """FedSynSAM's and DynaFed's distillation: the server keeps the global models w^0..w^R of its first
    `trajectory_rounds` aggregations and distils a synthetic set of `synthetic_ipc` images per class from them
    (server_app/distillation.py), training `task`'s model on `device`. The keys' part: `SynSAMSettings`."""

    task: ServerTask = ServerTask()
    device: str = same_key(RunSettings, "device")
    trajectory_rounds: int = same_key(SynSAMSettings, "trajectory_rounds")
    synthetic_ipc: int = same_key(SynSAMSettings, "synthetic_ipc")
    distill_iterations: int = same_key(SynSAMSettings, "distill_iterations")
    distill_optimizer: str = same_key(SynSAMSettings, "distill_optimizer")
    distill_inner_steps: int = same_key(SynSAMSettings, "distill_inner_steps")
    distill_lr: float = same_key(SynSAMSettings, "distill_lr")
    distill_alpha_init: float = same_key(SynSAMSettings, "distill_alpha_init")
    distill_alpha_lr: float = same_key(SynSAMSettings, "distill_alpha_lr")
    matching_loss: str = same_key(SynSAMSettings, "matching_loss")
    synthetic_source: str = same_key(SynSAMSettings, "synthetic_source")

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def of(cls, cfg: RunConfig) -> "DistillationSettings":
        """The run's distillation settings."""
        return _of(cls, cfg)

    def synsam(self) -> SynSAMSettings:
        """These keys as the run config's FedSynSAM part, the object the distillation takes (`distill`)."""
        return SynSAMSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                 if f.name in SynSAMSettings.__dataclass_fields__})


@dataclass(frozen=True)
class DynaFedTraining:
    """DynaFed's server training: after every aggregation once the synthetic set exists, `dynafed_epochs` epochs
    of Adam at `dynafed_lr` on it in batches of `batch_size` (the local training recipe's key, read here by the
    server). The keys' parts: `DynaFedSettings`, `LocalTrainingSettings`."""

    dynafed_lr: float = same_key(DynaFedSettings, "dynafed_lr")
    dynafed_epochs: int = same_key(DynaFedSettings, "dynafed_epochs")
    batch_size: int = same_key(LocalTrainingSettings, "batch_size", side=SERVER)

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def of(cls, cfg: RunConfig) -> "DynaFedTraining":
        """The run's DynaFed server training."""
        return _of(cls, cfg)


@dataclass(frozen=True)
class DiffusionTraining:
    """FedDDPM's and FedDDPM+'s diffusion task on the server: the U-Net `task` it builds (on `device`), the nodes'
    warm-up (sent by the server itself), the auxiliary set it samples from the warm models (`aux_fraction`,
    `aux_sampler`, `ddim_steps`) and the batches and optimizer of its epochs on that set. The keys' parts:
    `DiffusionSettings`, `LocalTrainingSettings`, `RunSettings`."""

    task: ServerTask = ServerTask(model="unet-paper-mnist")
    device: str = same_key(RunSettings, "device")
    aux_sampler: str = same_key(DiffusionSettings, "aux_sampler", side=SERVER)
    ddim_steps: int = same_key(DiffusionSettings, "ddim_steps", side=SERVER)
    batch_size: int = same_key(LocalTrainingSettings, "batch_size", side=SERVER)
    local_optimizer: str = same_key(LocalTrainingSettings, "local_optimizer", side=SERVER)
    warmup_epochs: int = same_key(DiffusionSettings, "warmup_epochs", side=SERVER)
    warmup_steps: int = same_key(DiffusionSettings, "warmup_steps", side=SERVER)
    warmup_timeout: float = same_key(DiffusionSettings, "warmup_timeout", side=SERVER)
    aux_fraction: float = same_key(DiffusionSettings, "aux_fraction", side=SERVER)

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def of(cls, cfg: RunConfig) -> "DiffusionTraining":
        """The run's diffusion task on the server."""
        return _of(cls, cfg)


@dataclass(frozen=True)
class CorrectionSettings:
    """FedDDPM's correction: after every aggregation, `correction_epochs` epochs of the DDPM loss on the auxiliary
    set at `correction_lr` (eta). The keys' part: `DiffusionSettings`."""

    correction_epochs: int = same_key(DiffusionSettings, "correction_epochs", side=SERVER)
    correction_lr: float = same_key(DiffusionSettings, "correction_lr", side=SERVER)

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def of(cls, cfg: RunConfig) -> "CorrectionSettings":
        """The run's FedDDPM correction."""
        return _of(cls, cfg)


@dataclass(frozen=True)
class QuickTestSettings:
    """FedDDPM+'s QuickTest and one-shot correction: every `quicktest_every` rounds an FID of `quicktest_size`
    samples (`sampler`, features `fid_features`, cached in `cache_dir`) against `quicktest_reference`'s statistics,
    its EMA (`quicktest_gamma`) and stop (`quicktest_threshold`), then `oneshot_epochs` on the auxiliary set at
    `oneshot_lr` (0: the clients' lr). The keys' parts: `DiffusionSettings`, `DataSettings`."""

    quicktest_every: int = same_key(DiffusionSettings, "quicktest_every", side=SERVER)
    quicktest_size: int = same_key(DiffusionSettings, "quicktest_size", side=SERVER)
    quicktest_gamma: float = same_key(DiffusionSettings, "quicktest_gamma", side=SERVER)
    quicktest_threshold: float = same_key(DiffusionSettings, "quicktest_threshold", side=SERVER)
    quicktest_reference: str = same_key(DiffusionSettings, "quicktest_reference", side=SERVER)
    sampler: str = same_key(DiffusionSettings, "sampler", side=SERVER)
    fid_features: str = same_key(DiffusionSettings, "fid_features", side=SERVER, default="classifier")
    cache_dir: str = same_key(DataSettings, "cache_dir", side=SERVER)
    oneshot_epochs: int = same_key(DiffusionSettings, "oneshot_epochs", side=SERVER)
    oneshot_lr: float = same_key(DiffusionSettings, "oneshot_lr", side=SERVER)

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def of(cls, cfg: RunConfig) -> "QuickTestSettings":
        """The run's QuickTest and one-shot correction."""
        return _of(cls, cfg)


def grouped(cls: type, name: str, value: Any) -> None:
    """Refuse a class's grouped parameter `name` that is not a `cls` (a class settings group's `check`)."""
    if not isinstance(value, cls):
        raise ConfigError(f"parameter {name} = {value!r} is invalid; accepted: a fedsynth.strategies.{cls.__name__}")
