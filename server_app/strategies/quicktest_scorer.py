"""FedDDPM+'s QuickTest score and the one-shot correction's rate: `QuickTestScorer`.

QuickTest (Peng et al., Algorithm 3) scores `quicktest-size` samples of the global model by FID against
reference statistics that need no real data at the server (`quicktest-reference`): those of the auxiliary set
A's features (computed once), or the pooled Gaussian of all nodes' features, asked for once with the
`fid_stats` phase (server_app/fid_reference.py) at the first QuickTest. The EMA and the stopping rule are the
pure functions of server_app/strategies/fedddpm_plus.py (`quicktest`, `quicktest_due`).

A collaborator rather than methods of FedDDPM+, so that the strategy's class shows its algorithm; it keeps A's
reference statistics and reads the strategy's settings, task and round when it runs. torch and FID's
extractors are imported by `score` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from common.algorithms.local_training_settings import ROUND_LR_KEY
from common.metrics.fid import GaussianStats
from common.records import Weights, load_weights
from common.run.task import make_model
from server_app.fid_reference import ClientFeatureReference
from server_app.strategies.parameters import DEFAULTS

if TYPE_CHECKING:
    from common.metrics.fid_features import FeatureExtractor


class QuickTestOwner(Protocol):
    """What QuickTest reads on FedDDPM+ (its settings, the auxiliary set, the round's grid): a Protocol, so that this
    module does not import FedDDPM+'s (which imports it)."""

    _grid: Any
    _round: int
    _round_metrics: dict[str, float]
    auxiliary: Any
    device: str
    feature_reference: Any
    lr_schedule: Any  # Callable[[int], float] | None
    node_table: Any  # server_app.strategies.node_table.NodeTable
    quicktest: Any  # server_app.strategies.server_training.QuickTestSettings
    sampler: str
    seed: int
    task: Any  # common.run.task.ServerTask
    timeout: float | None
    train_config: dict[str, Any]

_QUICKTEST_STREAM = 23  # fourth seed component of QuickTest's samples (FedDDPM's streams: 21, 22)


class QuickTestScorer:
    """QuickTest's FID score for `strategy` and the one-shot correction's rate (see the module's docstring)."""

    def __init__(self, strategy: QuickTestOwner) -> None:
        self.strategy = strategy
        self.aux_stats: GaussianStats | None = None  # A's feature statistics, once computed

    def oneshot_rate(self) -> float:
        """The one-shot correction's rate: `oneshot_lr`, else the clients' rate in `start()`'s `train_config`, else
        round 1's of the schedule, else the run config's default rate (Algorithm 2 trains it at the clients' zeta)."""
        s = self.strategy
        if s.quicktest.oneshot_lr:
            return s.quicktest.oneshot_lr
        if ROUND_LR_KEY in s.train_config:
            return float(s.train_config[ROUND_LR_KEY])
        return s.lr_schedule(1) if s.lr_schedule is not None else DEFAULTS.lr  # fedsynth's app: the run's lr

    def reference_stats(self, extractor: FeatureExtractor) -> GaussianStats:
        """QuickTest's reference: A's features, or the nodes' pooled features (`quicktest-reference`), asked once."""
        s = self.strategy
        if s.quicktest.quicktest_reference == "clients":
            from common.models.diffusion import image_shape

            if s.feature_reference is None:  # built without fedsynth's app: its own, with start()'s timeout
                s.feature_reference = ClientFeatureReference(s.node_table.nodes, s.timeout or 3600.0)
            stats, gathering = s.feature_reference.get(s._grid, extractor, image_shape(s.task))
            s._round_metrics.update(gathering)
            return stats
        if self.aux_stats is None:
            self.aux_stats = extractor.stats(s.auxiliary)
        return self.aux_stats

    def score(self, weights: Weights) -> float:
        """FID (float) of `quicktest-size` samples of the model `weights` ({name: array} of the U-Net) against
        QuickTest's reference statistics."""
        from common.metrics.fid_features import make_extractor
        from common.models.diffusion import image_shape, sample, seeded_generator

        s = self.strategy
        model = make_model(s.task)
        load_weights(model, weights)
        model.to(s.device)
        images = sample(model, s.sampler, s.quicktest.quicktest_size, image_shape(s.task),
                        seeded_generator(s.seed, s._round, 0, _QUICKTEST_STREAM), s.device)
        extractor = make_extractor(s.quicktest.fid_features, s.task.dataset, image_shape(s.task)[1], s.task.data_dir,
                                   s.quicktest.cache_dir, s.device, channels=image_shape(s.task)[0])
        return extractor.fid(images, self.reference_stats(extractor))
