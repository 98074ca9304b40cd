"""The results folder of a run: config, per-round metrics, summary, plots and final model.

`results/<run-name>/` holds `config.json`, `metrics.jsonl` (one JSON object per
round, appended and flushed as the round ends, so a crashed run keeps what it
did), `summary.json`, PNG curves and `model.safetensors`. Plots are made with
matplotlib's Agg backend, so no display is needed. With `tensorboard = true`
the same rounds also go to TensorBoard event files there (common/tracking.py).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from common.config import RunConfig


def results_root(results_dir: str) -> Path:
    """Absolute results root: relative paths are taken under $FEDSYNTH_HOME, else the cwd."""
    path = Path(results_dir).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("FEDSYNTH_HOME", os.getcwd())) / path
    return path


def default_run_name(cfg: RunConfig) -> str:
    """algorithm-dataset-partition-YYYYmmdd-HHMMSS (`hf:owner/name` written as `hf-owner-name`)."""
    dataset = cfg.dataset.replace(":", "-").replace("/", "-")
    return f"{cfg.algorithm}-{dataset}-{cfg.partition}-{time.strftime('%Y%m%d-%H%M%S')}"


def resume_hint(folder: Path) -> str:
    """The line a run prints first: its results folder and the run config that resumes it (docs/deployment.md)."""
    return (f"results folder: {folder} (to resume this run: --run-config \"run-name='{folder.name}' "
            f"resume=true\" with the same other settings)")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer)):
        return _json_safe(value.item())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class RunResults:
    """Writes one run's results folder."""

    def __init__(self, cfg: RunConfig) -> None:
        name = cfg.run_name or default_run_name(cfg)
        self.path = results_root(cfg.results_dir) / name
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.path / "metrics.jsonl"
        self.rounds: list[dict[str, Any]] = []
        self.tensorboard = None
        if cfg.tensorboard:
            from common.tracking import TensorBoardLog

            self.tensorboard = TensorBoardLog(self.path)
        (self.path / "config.json").write_text(json.dumps(cfg.as_dict(), indent=2) + "\n")
        if not cfg.resume:  # a resumed run rewrites its metrics from the checkpoint instead
            self.metrics_path.write_text("")
        log(INFO, "%s", resume_hint(self.path))

    def log_round(self, record: Mapping[str, Any], tensorboard: bool = True) -> None:
        """Append one round's metrics to metrics.jsonl and flush (and to TensorBoard when on)."""
        safe = _json_safe(dict(record))
        self.rounds.append(safe)
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(safe) + "\n")
        if self.tensorboard is not None and tensorboard:
            self.tensorboard.log_round(safe)

    def log_image(self, tag: str, png: Path, step: int) -> None:
        """An image file written for a round (e.g. a sample grid), also to TensorBoard when on."""
        if self.tensorboard is not None:
            self.tensorboard.log_image(tag, png, step)

    def restore_rounds(self, rounds: list[dict[str, Any]]) -> None:
        """Start metrics.jsonl over from a checkpoint's rounds (rounds after it are re-run)."""
        self.rounds = []
        self.metrics_path.write_text("")
        for record in rounds:
            self.log_round(record, tensorboard=False)  # already in the event files
        if self.tensorboard is not None:
            self.tensorboard.resume_after(max((int(r["round"]) for r in rounds), default=-1))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """summary.json: final numbers of the run."""
        (self.path / "summary.json").write_text(json.dumps(_json_safe(dict(summary)), indent=2) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.close()

    def write_model(self, weights: Mapping[str, np.ndarray]) -> Path:
        """The final global model as safetensors (loads without unpickling)."""
        from safetensors.numpy import save_file

        target = self.path / "model.safetensors"
        save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(target))
        return target

    def write_plots(self) -> list[Path]:
        """PNG curves of accuracy/loss and of bytes per round."""
        return plot_rounds(self.rounds, self.path)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rounds of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _series(rounds: list[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for record in rounds:
        value = record.get(key)
        if isinstance(value, (int, float)):
            xs.append(record["round"])
            ys.append(value)
    return xs, ys


def plot_rounds(rounds: list[Mapping[str, Any]], folder: Path) -> list[Path]:
    """accuracy.png (central and local accuracy, losses) and bytes.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("central-accuracy", "central test"), ("local-test-accuracy", "clients' local test")):
        xs, ys = _series(rounds, key)
        if xs:
            ax_acc.plot(xs, ys, marker=".", label=label)
    for key, label in (("central-loss", "central test"), ("train-loss", "train")):
        xs, ys = _series(rounds, key)
        if xs:
            ax_loss.plot(xs, ys, marker=".", label=label)
    ax_acc.set(xlabel="round", ylabel="accuracy", title="Accuracy")
    ax_loss.set(xlabel="round", ylabel="loss", title="Loss")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    written.append(folder / "accuracy.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    for key, label in (("uplink-bytes", "uplink"), ("downlink-bytes", "downlink")):
        xs, ys = _series(rounds, key)
        if xs:
            ax.plot(xs, [y / 1e6 for y in ys], marker=".", label=label)
    ax.set(xlabel="round", ylabel="MB per round", title="Traffic")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    written.append(folder / "bytes.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written
