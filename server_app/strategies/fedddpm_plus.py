"""FedDDPM+ (Peng et al., Algorithms 2 and 3): FedDDPM's warm-up and auxiliary set, QuickTest, one correction.

Plain FedAvg rounds after FedDDPM's warm-up (server_app/strategies/fedddpm.py). At t = 0, 10, 20, ...
(Algorithm 3 counts t from 0: 1-based rounds 1, 11, 21 with `quicktest-every` = 10) QuickTest scores
`quicktest-size` samples of the global model by FID against reference statistics that need no real data at the
server (`quicktest-reference`): those of A's features, or the pooled Gaussian of all nodes' features, asked for
once with the `fid_stats` phase (server_app/fid_reference.py). It keeps an EMA
`avg = gamma * score + (1 - gamma) * avg`; when `|avg - score| <= quicktest-threshold`, the server runs
`oneshot-epochs` epochs on A once, at the clients' learning rate zeta (Algorithm 2; `oneshot-lr` overrides it),
and the run stops. Our choice where the paper is silent: if QuickTest has not fired by `start()`'s last round,
the one-shot correction runs after it, so a run with a fixed round budget still ends corrected (`stop-reason`).
torch, the diffusion task and FID's extractors are imported by the methods that use them, as in FedDDPM.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.keys import parameter
from common.records import Weights
from server_app.strategies.fedddpm import FedDDPM
from server_app.strategies.parameters import documented
from server_app.strategies.quicktest_scorer import QuickTestScorer
from server_app.strategies.server_training import QuickTestSettings, field_list, grouped


def quicktest(average: float | None, score: float, gamma: float, threshold: float) -> tuple[bool, float | None]:
    """Algorithm 3: (stop?, new average). Stop when |avg - score| <= threshold, else fold score into the EMA."""
    if average is not None and abs(average - score) <= threshold:
        return True, average
    if average is None:
        return False, score
    return False, gamma * score + (1.0 - gamma) * average


def quicktest_due(server_round: int, every: int) -> bool:
    """Algorithm 3's `t mod every == 0` with t = server_round - 1 counted from 0: rounds 1, 1 + every, ..."""
    return every > 0 and (server_round - 1) % every == 0


@dataclass(frozen=True)
class FedDDPMPlusSettings:
    """FedDDPM+'s class settings beside FedDDPM's (not a part of the run config): QuickTest's stop, the sampler
    and features of its FID, and the one-shot correction, one grouped value (each key declared by its run-config
    part)."""

    quicktest: QuickTestSettings = parameter(
        QuickTestSettings(), "QuickTest and the one-shot correction: a "
        f"`QuickTestSettings({field_list(QuickTestSettings)})`, each field the run-config key of the same name.")

    def check(self) -> None:
        """Refuse a `quicktest` that is not a `QuickTestSettings` (which checked its keys when built)."""
        grouped(QuickTestSettings, "quicktest", self.quicktest)


@documented
class FedDDPMPlus(FedDDPM):
    """FedDDPM+ (Peng et al.): the warm-up and auxiliary set of FedDDPM, plain FedAvg rounds, QuickTest every
    `quicktest.quicktest_every` rounds, and one correction of `quicktest.oneshot_epochs` on the auxiliary set (at the
    clients' rate)
    when QuickTest fires (or after `start()`'s last round), after which the run stops.
    """

    settings = FedDDPMPlusSettings
    fixed_parameters = ("correction",)  # no correction every round: the one-shot's instead

    def __post_init__(self) -> None:
        from common.models.diffusion import SamplerSpec, num_timesteps

        self.sampler = SamplerSpec(self.quicktest.sampler, num_timesteps(self.task), self.diffusion.ddim_steps)
        self.quicktest_average: float | None = None
        self.stopped_at: int | None = None
        self.stop_reason = ""
        self.quicktest_scorer = QuickTestScorer(self)  # QuickTest's FID (server_app/strategies/quicktest_scorer.py)
        self._grid: Grid | None = None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._grid = grid  # the nodes' feature sums are asked for at the first QuickTest
        return super().configure_train(server_round, arrays, config, grid)

    def state_meta(self) -> dict[str, Any]:
        return {**super().state_meta(), "quicktest-average": self.quicktest_average, "stopped-at": self.stopped_at,
                "stop-reason": self.stop_reason}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        super().load_state_meta(meta)
        self.quicktest_average = meta.get("quicktest-average")
        self.stopped_at = meta.get("stopped-at")
        self.stop_reason = str(meta.get("stop-reason", ""))

    def _stop_requested(self) -> bool:
        return self.stopped_at is not None

    def after_aggregation(self, weights: Weights) -> Weights:
        last = self._round == self.num_rounds  # start()'s num_rounds rules (fedsynth's app passes num-server-rounds)
        if self.auxiliary is not None and quicktest_due(self._round, self.quicktest.quicktest_every):
            start = time.monotonic()
            score = self.quicktest_scorer.score(weights)
            fired, self.quicktest_average = quicktest(self.quicktest_average, score, self.quicktest.quicktest_gamma,
                                                      self.quicktest.quicktest_threshold)
            self._round_metrics.update({"quicktest-fid": score, "quicktest-time": time.monotonic() - start})
            if self.quicktest_average is not None:
                self._round_metrics["quicktest-average"] = self.quicktest_average
            log(INFO, "[round %d] QuickTest FID %.3f (reference: %s), average %s -> %s", self._round, score,
                self.quicktest.quicktest_reference, self.quicktest_average, "stop" if fired else "continue")
            if fired:
                self.stop_reason = "quicktest"
        if self.stop_reason == "quicktest" or last:
            self.stop_reason = self.stop_reason or "last-round"
            self.stopped_at = self._round
            return self._correct(weights, self.quicktest.oneshot_epochs, self.quicktest_scorer.oneshot_rate())
        return weights

    def run_summary(self, rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {**super().run_summary(rounds), "stopped-at-round": self.stopped_at, "stop-reason": self.stop_reason}
