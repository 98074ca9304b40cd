"""Opt-in experiment tracking: a run's metrics as TensorBoard event files (`tensorboard = true`).

metrics.jsonl stays the record of a run; with `tensorboard = true` every round's
numeric metrics are also written as TensorBoard scalars (tag = the metrics key,
step = the round) and image grids (diffusion samples) as images, into the run's
own folder, so `tensorboard --logdir results/` shows every run by its name.
The writer is flushed after every round, as metrics.jsonl is, so a crashed run
keeps what it did; a resumed run purges the events after its checkpoint's
round, so a re-run round is not shown twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def round_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics of one round's record (booleans, texts, lists and the round number left out)."""
    return {
        key: float(value) for key, value in record.items()
        if key != "round" and isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool) and math.isfinite(float(value))
    }


class TensorBoardLog:
    """TensorBoard event files in a run's folder; the writer opens on first use."""

    def __init__(self, folder: Path) -> None:
        try:
            import tensorboard  # noqa: F401 - torch's SummaryWriter needs it
        except ImportError:
            raise RuntimeError("run config key 'tensorboard' = true needs the tensorboard package: "
                               "pip install 'fedsynth[tensorboard]' (or set tensorboard = false)") from None
        self.folder = Path(folder)
        self.purge_step: int | None = None
        self._writer = None

    def _open(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.folder), purge_step=self.purge_step)
        return self._writer

    def resume_after(self, last_round: int) -> None:
        """A resumed run: drop events of rounds after `last_round` (they are run again)."""
        self.close()
        self.purge_step = last_round + 1

    def log_round(self, record: Mapping[str, Any]) -> None:
        """Every numeric metric of a round as a scalar at step = its round."""
        writer = self._open()
        step = int(record["round"])
        for key, value in round_scalars(record).items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def log_image(self, tag: str, png: Path, step: int) -> None:
        """An image file (e.g. a sample grid) as an image at `step`."""
        from PIL import Image

        pixels = np.asarray(Image.open(png).convert("RGB"))
        writer = self._open()
        writer.add_image(tag, pixels, step, dataformats="HWC")
        writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
