"""Long server phases show progress and say how much they draw; a tiny run's final FID stays small (issue 54)."""

from __future__ import annotations

from logging import INFO

import numpy as np
import pytest
import torch
from torch import nn

from common.models.diffusion import SamplerSpec, sample
from common.models.diffusion_settings import final_fid_count
from common.run.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(calls):
    """The text of each captured log(level, format, *args) call."""
    return [call[1] % call[2:] for call in calls]


def test_progress_says_the_total_then_logs_each_tenth_once():
    calls, clock = [], Clock()
    progress = Progress("final FID sampling", 1000, "images", clock=clock, emit=lambda *a: calls.append(a))
    progress.start(" from the global model (ddpm)")
    for _ in range(40):  # batches of 25 images, 1 s each
        clock.now += 1.0
        progress.advance(25)
    text = lines(calls)
    assert text[0] == "final FID sampling: 1000 images from the global model (ddpm)"
    assert text[1:] == [f"final FID sampling: {n}/1000 images ({n // 10}%), {n // 25} s" for n in range(100, 1001, 100)]
    assert all(call[0] == INFO for call in calls)


def test_progress_also_logs_after_the_interval_within_a_tenth():
    calls, clock = [], Clock()
    progress = Progress("distillation", 1000, "iterations", seconds=30.0, clock=clock,
                        emit=lambda *a: calls.append(a))
    clock.now = 31.0
    progress.advance(1)  # far from a tenth, but 31 s passed
    clock.now = 40.0
    progress.advance(1)  # neither
    assert lines(calls) == ["distillation: 1/1000 iterations (0%), 31 s"]


@pytest.mark.parametrize(("final", "per_round", "rounds", "expected"), [
    (5000, 1000, 2, 1000),    # the tiny run of the issue: 2 rounds draw 1,000, not 5,000
    (5000, 1000, 9, 4500),
    (5000, 1000, 10, 5000),   # 10 rounds or more: the default's 5,000, as before
    (5000, 1000, 400, 5000),
    (10000, 1000, 400, 10000),
    (48, 32, 2, 48),          # a small explicit count is kept
    (5000, 3000, 2, 3000),    # never fewer than a round's fid-samples
    (0, 1000, 2, 0),          # 0: no final score
])
def test_the_final_fid_draws_at_most_500_images_per_round(final, per_round, rounds, expected):
    assert final_fid_count(final, per_round, rounds) == expected


class ZeroNoise(nn.Module):
    def forward(self, x: torch.Tensor, t: torch.Tensor, return_dict: bool = True) -> tuple[torch.Tensor]:
        return (torch.zeros_like(x),)


def test_sampling_reports_each_batch_and_draws_the_same_images():
    spec, shape = SamplerSpec("ddim", 10, 2), (1, 4, 4)
    seen: list[int] = []
    with_progress = sample(ZeroNoise(), spec, 10, shape, torch.Generator().manual_seed(0), torch.device("cpu"),
                           batch_size=4, on_batch=seen.append)
    plain = sample(ZeroNoise(), spec, 10, shape, torch.Generator().manual_seed(0), torch.device("cpu"), batch_size=4)
    assert seen == [4, 4, 2]
    np.testing.assert_array_equal(with_progress, plain)


def test_the_distillation_says_its_size_and_logs_its_progress():
    import logging

    from common.algorithms.synsam_settings import SynSAMSettings
    from server_app.distillation import distill

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.INFO)
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    def small() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 4))

    start = {k: v.detach().numpy().copy() for k, v in small().state_dict().items()}
    trajectory = [{k: v + np.float32(0.01 * i) for k, v in start.items()} for i in range(3)]
    handler, logger = Lines(), logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        distill(small(), trajectory, 4, (1, 4, 4),
                SynSAMSettings(synthetic_ipc=2, distill_iterations=20, distill_inner_steps=1),
                torch.device("cpu"))
    finally:
        logger.removeHandler(handler)
    progress = [line for line in handler.lines if line.startswith("distillation: ") and "/20" in line]
    assert "distillation: 20 iterations of 1 unrolled steps each, learning 8 synthetic images (2 per class)" in \
        handler.lines
    assert [line.split(" (")[0] for line in progress] == [f"distillation: {n}/20 iterations" for n in range(2, 21, 2)]
