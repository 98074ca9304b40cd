"""The run's own keys: which algorithm, how many rounds, the seed and device, and where the results go.

One part of the run config (common/run/config.py's `RunConfig` composes the parts). These keys are
read by the drivers and the results folder (common/run/results.py, server_app/checkpoint.py):
evaluation cadence, the results folder's name, what is written there, checkpoints and resume.
Whether `algorithm` names a known strategy (or a user's plugin that imports and has the right types,
common/algorithms/plugins.py) is checked by `parse_run_config`.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.keys import check_text, key, require


@dataclass(frozen=True)
class RunSettings:
    """The run: algorithm, rounds, seed, device, evaluation cadence, results folder, checkpoints and resume."""

    algorithm: str = key("fedavg", "Algorithm to run: a name of the algorithm table (docs/algorithms.md), or a "
                         "user's own, package.module:Name, a fedsynth.algorithm.Algorithm naming its strategy class "
                         "and client rule (importable on the server and every node; docs/architecture.md, "
                         "\"Where a new piece goes\").")
    num_server_rounds: int = key(20, "Number of federated rounds.")
    seed: int = key(0, "Seed for partitions, model init, sampling and local training.")
    device: str = key("auto", "auto (CUDA when available), cpu, cuda or cuda:N.")
    eval_every: int = key(1, "Centralized evaluation every this many rounds (0: only at the end).")
    central_eval: bool = key(True, "Evaluate the global model on the official test split (or central-test-path); "
                             "diffusion task: FID against the real training split, with partition = node against "
                             "the nodes' pooled feature sums.")
    results_dir: str = key(
        "results", "Root of the results folders; relative paths are under $FEDSYNTH_HOME or cwd."
    )
    run_name: str = key("", "Name of the results folder; empty: algorithm-dataset-partition-time.")
    save_model: bool = key(True, "Write the final global model (safetensors).")
    tensorboard: bool = key(
        False, "Also write each round's metrics (and diffusion sample grids) as TensorBoard event files in the "
        "run's folder (needs the tensorboard package: pip install fedsynth[tensorboard])."
    )
    checkpoint_every: int = key(
        1, "Write the server checkpoint every this many rounds (and after the last); 0: never. "
        "1: a crash loses at most one round (a checkpoint costs < 1 % of a round, docs/deployment.md)."
    )
    resume: bool = key(
        False, "Continue the run named by run-name (in results-dir) from its latest checkpoint; the config must "
        "match the checkpoint's (docs/reliability.md).",
    )
    overwrite: bool = key(
        False, "Discard what the run-name folder holds and start over; with resume = true: resume when a checkpoint "
        "exists, else start over.",
    )
    accept_unverified_checkpoint: bool = key(
        False, "Resume (or fork) a checkpoint that has no checksum (format 1, or its checksum removed), whose contents "
        "therefore cannot be verified; without it such a checkpoint is refused.",
    )

    def check(self) -> None:
        """Validate these keys (all but `algorithm`'s name, see the module docstring); ConfigError names the key."""
        check_text(self, RunSettings)
        require(self.seed >= 0, "seed", self.seed, "an integer >= 0 (numpy's generators take no negative seed)")
        require(self.num_server_rounds >= 1, "num-server-rounds", self.num_server_rounds, "an integer >= 1")
        require(self.eval_every >= 0, "eval-every", self.eval_every, "an integer >= 0")
        device_ok = self.device in ("auto", "cpu", "cuda") or (
            self.device.startswith("cuda:") and self.device[5:].isdigit()
        )
        require(device_ok, "device", self.device, "auto, cpu, cuda or cuda:N")
        require(
            "/" not in self.run_name and self.run_name not in (".", ".."),
            "run-name",
            self.run_name,
            "a folder name without '/'",
        )
        require(self.checkpoint_every >= 0, "checkpoint-every", self.checkpoint_every, "an integer >= 0 (0: never)")
        require(not self.resume or bool(self.run_name), "run-name", self.run_name,
                "the name of the run to continue when resume = true")
