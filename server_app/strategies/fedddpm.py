"""FedDDPM (Peng et al., "Federated Learning for Diffusion Models"): server-side correction, and the warm-up and
auxiliary set FedDDPM+ shares (FedDDPM+'s QuickTest and one-shot correction: server_app/strategies/fedddpm_plus.py).

Both start with a **warmup**: every node trains its own DDPM on its local data
for the warm-up's epochs (from the run's initial model) and uploads it once. The
server draws `|A_i| = aux-fraction * m_i` images from node i's warm model
(m_i: the sample count the node reports, none above `max-weight-share` of
their total, so a false claim cannot make the server sample without end) and keeps their union, the
**auxiliary set** A, which approximates the global data distribution. A lives
in this strategy object only: it is never put in a message (tests check every
message sent), and it is checkpointed with the server state
(`state_arrays` / `state_meta`), so a resumed run neither repeats the warmup
nor loses A. Rounds then start from the initial model w_0, as in Algorithm 1.

- **FedDDPM** (Algorithm 1): FedAvg rounds (the paper averages uniformly:
  `aggregation = "uniform"`), and after every aggregation `correction-epochs`
  epochs of the DDPM loss on A with learning rate `correction-lr`.
- **FedDDPM+** (Algorithms 2, 3): the same warm-up, plain FedAvg rounds, QuickTest and one correction
  (server_app/strategies/fedddpm_plus.py).

**The phases outside the rounds.** Each exchange that is not a round is a
pair of methods in the shape of Flower's `configure_train` / `aggregate_train`,
driven by one call of the grid's own `grid.send_and_receive(messages,
timeout=...)`, the call Flower's `start()` makes for a round (fedsynth's
ServerApp hands `start()` a `PollingGrid`, server_app/messaging.py):

- the warm-up (server_app/strategies/fedddpm_warmup.py, `warmup_phase`):
  `configure(arrays, grid)` -> one TRAIN message per node,
  `RecordDict({"arrays": the initial model, "config": ConfigRecord(
  {"server-round": 0, "phase": "warmup"})})`; `aggregate(replies)`
  checks the warm models (a train reply: "arrays" with the initial model's
  names, shapes and dtypes; "metrics" with "num-examples" and "train-loss",
  or Flower's "train_loss"), drops bad and missing replies into the record's
  failures and samples A.
  `warmup` drives the pair, with `warmup-timeout`, from the first active
  `configure_train`: the one hook that Flower's `start()`, a wrapper strategy
  (Flower's DP wrappers are refused: flower_wrappers.py) and a hand-written
  round loop all call, so it runs once per run, after `start()`'s round-0 `evaluate_fn` and
  before round 1 samples its nodes. A resumed run (`completed_rounds > 0`)
  skips it and has A from the checkpoint.
- FedDDPM+'s `quicktest-reference = "clients"`: the `fid_stats` query,
  `ClientFeatureReference.configure_fid_stats` / `aggregate_fid_stats`
  (server_app/fid_reference.py), driven with `round-timeout` by its `get` at
  the first QuickTest (inside round 1's `aggregate_train`, with the grid of
  that round's `configure_train`) unless the run's FID evaluation asked first;
  the statistics are kept and checkpointed, so it runs once per run.

A Flower developer's ClientApp answers the warm-up like any train message: a
node that ignores "phase" trains as in a round, and its reply is its warm model.

The auxiliary set is drawn with the ancestral sampler, as in the paper
(`aux-sampler`; DDIM for quick checks), whatever sampler the evaluation uses.

The server's epochs use the optimizer of the clients' local training
(the local training recipe's optimizer; Adam for the diffusion task by default): the paper's server
and client rates (5e-5, 2e-4) are Adam-scale rates for DDPMs, where plain SGD
at 5e-5 would leave the model unchanged.

torch and the diffusion task (common/models/diffusion.py) are imported by the methods that use them,
the constructor first: importing this module (and `fedsynth.strategies`) does not load torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.keys import parameter
from common.models.diffusion_names import UNET_PRESETS
from common.run.interrupt import raise_if_stopped
from common.records import Weights, load_weights, model_weights
from common.run.task import make_model
from common.run.config import paper_mean
from server_app.strategies.flower_wrappers import refuse_unsupported_wrapper
from server_app.strategies.fedavg import FedAvg
# re-exported: the warm-up's exception and |A_i| are FedDDPM's
from server_app.strategies.fedddpm_warmup import WarmupFailed, WarmupPhase, auxiliary_count  # noqa: F401
from server_app.strategies.parameters import documented
from server_app.strategies.server_training import CorrectionSettings, DiffusionTraining, field_list, grouped


_CORRECTION_STREAM = 22  # fourth seed component of the correction's batches (the auxiliary set's: 21)


@dataclass(frozen=True)
class FedDDPMSettings:
    """FedDDPM's class settings (not a part of the run config): the diffusion task the server runs (the U-Net it
    builds, the nodes' warm-up, the auxiliary set) and the server's correction on it, one grouped value each
    (their keys are declared by their run-config parts, common/models/diffusion_settings.py, ...; the server sends
    the warm-up's itself, `configure_warmup`)."""

    diffusion: DiffusionTraining = parameter(
        DiffusionTraining(), "The diffusion task on the server: a "
        f"`DiffusionTraining({field_list(DiffusionTraining)})`, each field the run-config key of the same name; "
        "`task` the U-Net the server builds "
        "(common.run.task.ServerTask), `device` where it samples and trains.")
    correction: CorrectionSettings = parameter(
        CorrectionSettings(), f"The correction after every aggregation: a `CorrectionSettings("
        f"{field_list(CorrectionSettings)})`, each field the run-config key of the same name.")

    def check(self) -> None:
        """Refuse grouped values of another type (each checked its keys when built)."""
        grouped(DiffusionTraining, "diffusion", self.diffusion)
        grouped(CorrectionSettings, "correction", self.correction)


@documented
class FedDDPM(FedAvg):
    """FedDDPM (Peng et al.): each node first trains its own DDPM and uploads it once (the warm-up); the server
    samples an auxiliary set from those models, then runs FedAvg rounds and, after each aggregation,
    `correction.correction_epochs` epochs on the auxiliary set. The server builds `diffusion.task`'s model (a U-Net)
    for both.
    """

    settings = FedDDPMSettings
    parameter_defaults = {"aggregation": paper_mean("fedddpm")}  # its paper's mean (paper_rules.py)

    def __post_init__(self) -> None:
        self.task = self.diffusion.task  # the U-Net the server builds (read by the warm-up and QuickTest)
        if self.task.model not in UNET_PRESETS:
            raise ValueError(f"{type(self).__name__}'s model must be one of the U-Net presets {', '.join(UNET_PRESETS)} "
                             f"(its server samples and corrects through diffusers' UNet2DModel), not {self.task.model!r}: "
                             "a 'package.module:factory' model is not supported for the diffusion strategies")
        from common.metrics.evaluation import resolve_device
        from common.models.diffusion import SamplerSpec, linear_schedule, num_timesteps

        diffusion = self.diffusion
        self.device = resolve_device(diffusion.device)
        self.aux_sampler = SamplerSpec(diffusion.aux_sampler, num_timesteps(self.task), diffusion.ddim_steps)
        # `auto`: Adam for a DDPM
        self.optimizer = diffusion.local_optimizer if diffusion.local_optimizer != "auto" else "adam"
        self.auxiliary: np.ndarray | None = None       # A, float32 (n, C, H, W) in [-1, 1]; server only
        self.aux_counts: dict[int, int] = {}           # partition id -> |A_i|
        self.schedule = linear_schedule(num_timesteps(self.task))
        self._round = 0
        self._round_metrics: dict[str, float] = {}
        self.warmed_up = False  # the warm-up ran (a resumed run skips it: completed_rounds > 0)
        self.warmup_phase = WarmupPhase(self)  # the warm-up exchange (server_app/strategies/fedddpm_warmup.py)

    # ----- server state that a checkpoint must keep ---------------------------------
    def state_arrays(self) -> dict[str, Weights]:
        return {"auxiliary": {"images": self.auxiliary}} if self.auxiliary is not None else {}

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        group = groups.get("auxiliary")
        if group is not None:
            self.auxiliary = np.asarray(group["images"], dtype=np.float32)

    def state_meta(self) -> dict[str, Any]:
        return {"aux-counts": {str(pid): n for pid, n in self.aux_counts.items()}}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        self.aux_counts = {int(pid): int(n) for pid, n in meta.get("aux-counts", {}).items()}

    def _dp_obstacle(self, side: str) -> str | None:
        """The warm models reach the server in the warm-up, outside the rounds a DP wrapper sees."""
        return ("its nodes upload their warm models in the warm-up, outside the rounds the wrapper clips and noises, "
                "and the server samples its auxiliary set from them")

    # ----- the run ---------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Before the first round of a run (not of a resumed one): the warm-up phase (`warmup`), then round 1."""
        refuse_unsupported_wrapper(self)  # before the warm-up sends anything
        if self.round_book.is_active(server_round) and not self.warmed_up and self.completed_rounds == 0:
            self.warmup(grid, arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def run_summary(self, rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What this algorithm adds to summary.json."""
        return {"aux-size": 0 if self.auxiliary is None else int(len(self.auxiliary)),
                "aux-sampler": self.aux_sampler.label}

    # ----- the warm-up phase: warmup_phase.configure, one grid.send_and_receive, warmup_phase.aggregate -----
    def warmup(self, grid: Grid, arrays: ArrayRecord) -> dict[str, Any]:
        """The whole warm-up phase: `warmup_phase.configure`, one `grid.send_and_receive`, `warmup_phase.aggregate`
        (server_app/strategies/fedddpm_warmup.py).

        The first active `configure_train` calls it (the one hook that Flower's `start()`, a wrapper strategy
        (Flower's DP wrappers are refused: flower_wrappers.py) and a hand-written round loop all call), so the warm-up
        comes after `start()`'s round-0 `evaluate_fn` and before round 1's node sampling, once per run. The
        exchange goes through the grid's own `send_and_receive`, as a round's does, with `warmup-timeout`.
        Returns the warm-up's record (see `WarmupPhase.aggregate`).
        """
        raise_if_stopped()
        messages = self.warmup_phase.configure(arrays, grid)
        replies = grid.send_and_receive(messages, timeout=self.diffusion.warmup_timeout)
        return self.warmup_phase.aggregate(replies)

    # ----- the server's correction -------------------------------------------------------------
    def _correct(self, weights: Weights, epochs: int, lr: float) -> Weights:
        """`epochs` epochs of the DDPM loss on A from `weights` at the learning rate lr."""
        if self.auxiliary is None or epochs <= 0:
            return weights
        import torch

        from common.models.diffusion import seeded_generator, train_on_images

        start = time.monotonic()
        model = make_model(self.task)
        load_weights(model, weights)
        model.to(self.device)
        loss = train_on_images(
            model, torch.from_numpy(self.auxiliary).to(self.device), self.schedule, epochs=epochs,
            batch_size=self.diffusion.batch_size, lr=lr, optimizer=self.optimizer,
            generator=seeded_generator(self.seed, self._round, 0, _CORRECTION_STREAM),
        )
        self._round_metrics.update({"correction-loss": loss, "correction-epochs": epochs, "correction-lr": lr,
                                    "correction-time": time.monotonic() - start})
        return model_weights(model)

    def after_aggregation(self, weights: Weights) -> Weights:
        """The public hook after each server step: `weights` is the aggregated U-Net ({name: array}, its names,
        shapes and dtypes); returns the model the round ends with, the same names, shapes and dtypes. FedDDPM:
        `correction-epochs` epochs on the auxiliary set at `correction-lr` (eta)."""
        return self._correct(weights, self.correction.correction_epochs, self.correction.correction_lr)

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        return self.after_aggregation(super().server_step(mean_delta, replies))

    def _aggregate_good(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self._round, self._round_metrics = server_round, {}
        arrays, metrics = super()._aggregate_good(server_round, replies)
        if metrics is not None:
            for key, value in self._round_metrics.items():
                metrics[key] = value
        return arrays, metrics

    def summary(self) -> None:
        super().summary()
        log(INFO, "%s: warmup %s, aux-fraction %g (%s), correction-epochs %d at %g", type(self).__name__,
            self.warmup_phase.length(), self.diffusion.aux_fraction, self.aux_sampler.label,
            self.correction.correction_epochs, self.correction.correction_lr)
