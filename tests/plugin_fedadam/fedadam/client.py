"""FedAdam's client rule: plain local SGD at the round's lr times this plugin's node-side `local-lr-scale`.

The factor comes from the train message ("fedadam.local-lr-scale", checked by the node with the settings group's
`check()` before this runs: `job.own_settings`), and the reply reports it back, so a test sees that it arrived.
"""

from __future__ import annotations

import dataclasses

from fedsynth.client import train_steps
from fedsynth.algorithm import LocalJob, LocalResult, plain_rule

SCALE_METRIC = "stat-fedadam-local-lr-scale"  # the factor the node trained with (the round log: mean and max)


def fedadam_update(job: LocalJob) -> LocalResult:
    """K seeded batches of the run's local optimizer at lr * local-lr-scale."""
    scale = job.own_settings.local_lr_scale
    optimizer = dataclasses.replace(job.optimizer, lr=job.lr * scale)
    result = train_steps(job.model, job.batches(), plain_rule(job), optimizer)
    return LocalResult(train_loss=result.train_loss, num_steps=result.num_steps, metrics={SCALE_METRIC: scale})
