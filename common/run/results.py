"""The results folder of a run: config, per-round metrics, summary, plots and final model.

`results/<run-name>/` holds `config.json` (the full effective config: every
run-config key, defaults resolved), `provenance.json` (the commit, versions and
device that made it, common/run/provenance.py), `metrics.jsonl` (one JSON object per
round, appended and flushed as the round ends, so a crashed run keeps what it
did), `summary.json`, PNG curves and `model.safetensors`. Plots are made with
matplotlib's Agg backend, so no display is needed. With `tensorboard = true`
the same rounds also go to TensorBoard event files there (common/run/tracking.py).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from common.algorithms.plugins import algorithm_label
from common.run.config import ConfigError, RunConfig
from common.run.provenance import SOURCE_DIFF_FILE, gather, write_source_diff


def results_root(results_dir: str) -> Path:
    """Absolute results root: relative paths are taken under $FEDSYNTH_HOME, else the cwd."""
    path = Path(results_dir).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("FEDSYNTH_HOME", os.getcwd())) / path
    return path


def default_run_name(cfg: RunConfig) -> str:
    """algorithm-dataset-partition-YYYYmmdd-HHMMSS (`hf:owner/name` written as `hf-owner-name`; a plugin
    `package.module:FedNova` as `fednova`: common/algorithms/plugins.py's `algorithm_label`)."""
    dataset = cfg.dataset.replace(":", "-").replace("/", "-")
    return f"{algorithm_label(cfg.algorithm)}-{dataset}-{cfg.partition}-{time.strftime('%Y%m%d-%H%M%S')}"


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


LOCK_FILE = ".lock"
CHECKPOINT_FILE = "checkpoint.safetensors"
PROVENANCE_FILE = "provenance.json"  # the commit, versions and device of the run (common/run/provenance.py)
# Files whose presence means the folder holds (part of) a run's results.
RESULT_FILES = ("config.json", "metrics.jsonl", "summary.json", "model.safetensors", CHECKPOINT_FILE)
HELD_LOCK_ENV = "FEDSYNTH_HELD_LOCK"  # "<pid>:<lock path>": this process's driver (fedsynth run) holds that lock


class ResultsFolderError(ConfigError):
    """The results folder cannot be used: another run holds it, or it holds a run that would be overwritten."""


def reserve_run_folder(root: Path, name: str) -> Path:
    """Create a new folder root/name, or root/name-2, -3, ... if taken (atomic: two runs never share one)."""
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = root / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise ResultsFolderError(f"could not reserve a new results folder for {root / name} (999 suffixes taken)")


def lock_run_folder(folder: Path) -> Any:
    """Take the exclusive lock of a results folder; returns the open lock file (closing it releases the lock).

    A second run on the same folder is refused at once. The lock is an `fcntl.flock`
    on `<folder>/.lock`, so a killed run leaves no stale lock behind.
    """
    import fcntl

    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK_FILE, "a+")
    except OSError as err:
        raise ResultsFolderError(f"cannot write the results folder {folder}: {err.strerror}; set 'results-dir' "
                                 "to a writable folder") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        if os.environ.get(HELD_LOCK_ENV) == f"{os.getpid()}:{folder / LOCK_FILE}":
            return None  # this process's driver took it before starting the engine, and holds it
        raise ResultsFolderError(
            f"results folder {folder} is in use by another run (process {holder}); wait for it to end, or choose "
            "another 'run-name'"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def folder_has_results(folder: Path) -> list[str]:
    """The result files present in `folder`."""
    return [name for name in RESULT_FILES if (folder / name).exists()]


def plan_run_folder(folder: Path, resume: bool, overwrite: bool) -> bool:
    """Whether the run resumes, after checking that no results would be lost; raises ResultsFolderError.

    - resume and a checkpoint: resume;
    - resume, no checkpoint: an error, unless overwrite (then start over);
    - no resume, the folder holds results: an error, unless overwrite (then start over).
    """
    present = folder_has_results(folder)
    if resume:
        if (folder / CHECKPOINT_FILE).is_file():
            return True
        if overwrite:
            return False
        raise ResultsFolderError(
            f"resume = true but there is no checkpoint at {folder / CHECKPOINT_FILE}; start without resume, set "
            "'run-name' (and 'results-dir') to the run to continue, or add overwrite = true to start this run over"
        )
    if present and not overwrite:
        hint = ("set resume = true to continue it from its checkpoint, " if CHECKPOINT_FILE in present else "")
        raise ResultsFolderError(
            f"results folder {folder} already holds a run ({', '.join(present)}); {hint}choose another "
            "'run-name' to keep it, or set overwrite = true to discard it"
        )
    return False


def clear_run_folder(folder: Path) -> None:
    """Delete everything in a results folder but its lock (overwrite = true)."""
    import shutil

    for entry in folder.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def run_folder(cfg: RunConfig) -> Path:
    """The run's folder: results-dir/run-name, or a new uniquely named one when run-name is empty."""
    root = results_root(cfg.results_dir)
    if cfg.run_name:
        return root / cfg.run_name
    return reserve_run_folder(root, default_run_name(cfg))


class RunResults:
    """Writes one run's results folder, holding its lock while the run lasts.

    Nothing in the folder is rewritten before the run knows it may: a folder
    holding another run is refused (unless `overwrite`), and a resumed run
    rewrites `config.json` and `metrics.jsonl` only in `restore_rounds`, after
    its checkpoint has been validated. Use as a context manager (or call
    `close`) to release the lock when the run ends.
    """

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.path = run_folder(cfg)
        self.metrics_path = self.path / "metrics.jsonl"
        self.rounds: list[dict[str, Any]] = []
        self.handshake_failures: list[dict[str, Any]] = []  # nodes lost at the start (server_app/handshake.py)
        self._summary_written = False
        self.tensorboard = None
        self._started = False  # True once this run writes into the folder (a resume: after its checkpoint passed)
        self._lock = lock_run_folder(self.path)
        try:
            self.resuming = plan_run_folder(self.path, cfg.resume, cfg.overwrite)
            if not self.resuming:
                if cfg.overwrite:
                    clear_run_folder(self.path)
                self._write_config()
                self._write_provenance(resumed=False)
                self.metrics_path.write_text("")
                self._started = True
            if cfg.tensorboard:
                from common.run.tracking import TensorBoardLog

                self.tensorboard = TensorBoardLog(self.path)
        except BaseException:
            self.close()
            raise
        log(INFO, "%s", resume_hint(self.path))

    def _write_config(self) -> None:
        (self.path / "config.json").write_text(json.dumps(self.cfg.as_dict(), indent=2) + "\n")

    def _write_provenance(self, resumed: bool) -> None:
        """provenance.json: what started the run; each resume appends what resumed it to its "resumed" list."""
        path = self.path / PROVENANCE_FILE
        record = gather(self.cfg.device)
        # a changed tree: the patch that rebuilds it, beside this file (each resume its own)
        resumes = len(list(self.path.glob("source-resumed-*.diff")))
        record = write_source_diff(record, self.path, f"source-resumed-{resumes + 1}.diff" if resumed else SOURCE_DIFF_FILE)
        if resumed:
            try:
                previous = json.loads(path.read_text())
            except (OSError, ValueError):
                previous = {"commit": "not recorded"}  # a folder from before provenance
            if not isinstance(previous, dict):
                previous = {"commit": "not recorded"}
            previous.setdefault("resumed", []).append(record)
            record = previous
        path.write_text(json.dumps(record, indent=2) + "\n")

    def close(self) -> None:
        """Release the folder's lock."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "RunResults":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        """Release the lock; a run that raised before writing its summary gets one with status "failed".

        Not a resume refused at its checkpoint: that folder is left exactly as it was.
        """
        from common.run.interrupt import RunInterrupted

        try:
            if isinstance(exc, RunInterrupted):
                self._write_interrupted(exc)
            elif exc is not None and self._started and not self._summary_written:
                self.write_summary({"status": "failed", "status-reason": f"{type(exc).__name__}: {exc}",
                                    "results-dir": str(self.path)})
        finally:
            self.close()

    def _write_interrupted(self, exc: Any) -> None:
        """summary.json of a run stopped by SIGINT/SIGTERM: status interrupted, its last finished round, how to go on.

        A resume that was refused at its checkpoint wrote nothing, and an interrupted one leaves nothing rewritten
        before it started; the checkpoint on disk is the run's latest either way.
        """
        from common.run.interrupt import record_stopped

        rounds = [r["round"] for r in self.rounds if isinstance(r.get("round"), int) and r.get("phase") is None]
        exc.last_round = max(rounds, default=0)
        exc.folder = self.path
        if not self._started:
            record_stopped(self.path, exc.last_round)
            return
        self.write_summary({
            "status": "interrupted",
            "status-reason": f"{exc}; stopped after round {exc.last_round}",
            "last-round": exc.last_round,
            "checkpoint": (self.path / CHECKPOINT_FILE).is_file(),
            "resume": f"--run-config \"run-name='{self.path.name}' resume=true\" with the same other settings",
            "results-dir": str(self.path),
        })
        record_stopped(self.path, exc.last_round)

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
        """Start metrics.jsonl over from a validated checkpoint's rounds (rounds after it are re-run).

        Written to a temporary file and renamed, so a failure leaves the old file whole.
        """
        safe = [_json_safe(dict(record)) for record in rounds]
        text = "".join(json.dumps(record) + "\n" for record in safe)
        tmp = self.metrics_path.with_name(".metrics.jsonl.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.metrics_path)
        self.rounds = safe
        self._write_config()
        self._write_provenance(resumed=True)
        if self.tensorboard is not None:
            self.tensorboard.resume_after(max((int(r["round"]) for r in rounds), default=-1))
        self._started = True

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """summary.json: final numbers of the run."""
        self._summary_written = True
        (self.path / "summary.json").write_text(json.dumps(_json_safe(dict(summary)), indent=2) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.close()

    def write_nodes(self, nodes: Sequence[Any]) -> None:
        """nodes.json: who took part, as the handshake learned it (name, partition id, train and test counts)."""
        rows = [{"name": n.name, "partition-id": n.partition_id, "node-id": n.node_id,
                 "num-train-examples": n.num_train_examples, "num-test-examples": n.num_test_examples}
                for n in nodes]
        (self.path / "nodes.json").write_text(json.dumps(rows, indent=2) + "\n")

    def write_model(self, weights: Mapping[str, np.ndarray]) -> Path:
        """The final global model as safetensors (loads without unpickling)."""
        from safetensors.numpy import save_file

        target = self.path / "model.safetensors"
        save_file({k: np.require(v, requirements="C") for k, v in weights.items()}, str(target))  # 0-d stays 0-d
        return target

    def write_plots(self) -> list[Path]:
        """PNG curves of accuracy/loss and of bytes per round."""
        return plot_rounds(self.rounds, self.path)


def run_accuracy(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The run's accuracy: central where the server evaluated, else the clients' aggregated local-test accuracy.

    A server without a test set (partition = node without central-test-path, or central-eval = false)
    has no central accuracy; the nodes' local test splits, weighted by their sizes, then stand for it.
    """
    for source, key in (("central", "final-central-accuracy"), ("local-test", "final-local-test-accuracy")):
        if isinstance(summary.get(key), (int, float)):
            return {"final-accuracy": summary[key], "accuracy-source": source}
    return {}


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
