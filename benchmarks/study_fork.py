"""Start a study's X runs from its X+cog runs' checkpoints, so that the rounds the two arms share run once.

    .venv/bin/python benchmarks/study_fork.py keep STUDY.toml --from-arm X+cog --runs-dir RUNS --into DIR
    .venv/bin/python benchmarks/study_fork.py fork STUDY.toml --from-arm X+cog --to-arm X --runs-dir RUNS --checkpoints DIR

FedCOG's `X+cog` runs X bit for bit until `cog-start-round` (tests/test_fedcog.py), so on each seed the runs of
the arms X and X+cog share their first `cog-start-round - 1` rounds. At the paper's size (50 rounds of FedAvg,
then 20 of FedCOG, 400 local steps) they are a quarter of what a FedAvg-against-FedAvg+FedCOG study computes on
cpu (fedcog-paper, two runs sharing 2 cores: 53-64 s a FedAvg round, 220-228 s a FedCOG round, so about 47 of
each seed's 190 minutes), which is what let it fit in a 3-hour session.

`keep` waits while the study runs the X+cog arm (`fedsynth study … --arms X+cog`) and copies each report run's
checkpoint the moment it holds round `cog-start-round - 1` (a run keeps only its latest checkpoint, so the
study's `checkpoint-every` must divide that round). `fork` writes each kept checkpoint into the folder of the
same seed's X run under X's config (`server_app.checkpoint.fork_checkpoint`); `fedsynth study` then finds a
checkpoint in that folder and resumes the run from it (`fedsynth.study.runner` resumes any run folder holding one),
with the shared rounds' metrics restored from the checkpoint.

A fork is refused unless it reproduces the X run exactly: the source arm is the target arm with `+cog` and
nothing else changed, the checkpoint is from before `cog-start-round`, and the target run has no folder yet.
The X run's ledger time (`seconds`) then counts only the rounds it ran itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, only benchmarks/ is on sys.path

from common.run.config import RunConfig  # noqa: E402
from fedsynth.simulation import prepare_run_config  # noqa: E402
from fedsynth.study.studyfile import RunSpec, Study, load_study, report_runs  # noqa: E402
from server_app.checkpoint import CHECKPOINT_FILE, config_differences, fork_checkpoint  # noqa: E402


class ForkError(ValueError):
    """A fork that would not reproduce the target run."""


def checkpoint_header(path: Path) -> tuple[int, dict[str, Any]]:
    """A checkpoint file's round and the config identity it was written under."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        meta = handle.metadata() or {}
    return int(meta["round"]), json.loads(meta["identity"])


def run_config(spec: RunSpec, app_dir: Path = REPO_ROOT) -> RunConfig:
    """The config a study run computes with (the app's defaults, then the run's overrides)."""
    return prepare_run_config(app_dir, {**spec.overrides, "run-name": spec.folder_name})[1]


def shared_rounds(cfg: RunConfig) -> int:
    """The rounds an X+cog run shares with X: those before FedCOG starts."""
    return cfg.first_cog_round(cfg.num_server_rounds) - 1


def runs_of(study: Study, arm: str) -> dict[int, RunSpec]:
    """An arm's report runs by seed (arms with a grid have no fixed report runs before tuning: refused)."""
    if arm not in study.arms:
        raise ForkError(f"the study has no arm {arm!r} (arms: {', '.join(study.arms)})")
    specs = {s.seed: s for s in report_runs(study, {}) if s.arm == arm}
    if study.arms[arm].grid:
        raise ForkError(f"arm {arm!r} is tuned: fork only arms without a grid")
    return specs


def check_fork(source: RunConfig, source_round: int, source_identity: dict[str, Any], target: RunConfig) -> None:
    """Refuse any fork that would not replay the target run exactly (see the module docstring)."""
    if source.algorithm != f"{target.algorithm}+cog":
        raise ForkError(f"only X+cog forks into X: {source.algorithm!r} into {target.algorithm!r}")
    if source_round > shared_rounds(source):
        raise ForkError(f"the checkpoint is from round {source_round}, after FedCOG started "
                        f"(round {source.first_cog_round(source.num_server_rounds)}): the runs no longer agree")
    differing = set(config_differences(source_identity, target)) - {"algorithm"}
    if differing:
        raise ForkError(f"source and target differ in more than the algorithm: {', '.join(sorted(differing))}")


def keep(study: Study, from_arm: str, runs_dir: Path, into: Path, poll_seconds: float = 30.0,
         write=print) -> dict[int, Path]:
    """Copy each source run's checkpoint of its last shared round into `into/s<seed>/`; waits for all seeds."""
    specs = runs_of(study, from_arm)
    wanted_round = {seed: shared_rounds(run_config(spec)) for seed, spec in specs.items()}
    kept: dict[int, Path] = {}
    while len(kept) < len(specs):
        for seed, spec in specs.items():
            source = runs_dir / spec.folder_name / CHECKPOINT_FILE
            if seed in kept or not source.is_file():
                continue
            wanted = wanted_round[seed]
            saved_round, _ = checkpoint_header(source)
            if saved_round > wanted:
                raise ForkError(f"{source} already holds round {saved_round}: round {wanted} was not kept "
                                "(start `keep` before the run passes it, with checkpoint-every dividing it)")
            if saved_round < wanted:
                continue
            folder = into / f"s{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{CHECKPOINT_FILE}.partial"
            shutil.copyfile(source, partial)  # the run replaces its checkpoint atomically: this is one whole file
            if checkpoint_header(partial)[0] != wanted:
                partial.unlink()
                continue
            os.replace(partial, folder / CHECKPOINT_FILE)
            kept[seed] = folder
            write(f"{time.strftime('%H:%M:%S')} kept seed {seed}: round {wanted} of {spec.folder_name}")
        if len(kept) < len(specs):
            time.sleep(poll_seconds)
    return kept


def fork(study: Study, from_arm: str, to_arm: str, runs_dir: Path, checkpoints: Path, write=print) -> list[Path]:
    """Write each kept checkpoint into the same seed's target run folder under the target's config."""
    sources, targets = runs_of(study, from_arm), runs_of(study, to_arm)
    written = []
    for seed, spec in sorted(targets.items()):
        kept = checkpoints / f"s{seed}"
        if seed not in sources or not (kept / CHECKPOINT_FILE).is_file():
            raise ForkError(f"no kept checkpoint for seed {seed} in {kept}")
        folder = runs_dir / spec.folder_name
        if folder.exists():
            raise ForkError(f"{folder} exists: the run started (or was forked) already")
        source_round, identity = checkpoint_header(kept / CHECKPOINT_FILE)
        target_cfg = run_config(spec)
        check_fork(run_config(sources[seed]), source_round, identity, target_cfg)
        written.append(fork_checkpoint(kept, folder, target_cfg))
        write(f"seed {seed}: {spec.folder_name} starts from round {source_round} of {sources[seed].folder_name}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["keep", "fork"])
    parser.add_argument("study", type=Path, help="the study file")
    parser.add_argument("--from-arm", required=True, help="the X+cog arm whose checkpoints are forked")
    parser.add_argument("--to-arm", help="the X arm that starts from them (fork)")
    parser.add_argument("--runs-dir", type=Path, required=True, help="the study's --runs-dir")
    parser.add_argument("--into", "--checkpoints", dest="checkpoints", type=Path, required=True,
                        help="where the kept checkpoints are (s<seed>/checkpoint.safetensors)")
    args = parser.parse_args(argv)
    from fedsynth.app_config import app_defaults

    study = load_study(args.study, app_defaults=app_defaults(REPO_ROOT))  # the keys `fedsynth study` gives its runs
    try:
        if args.mode == "keep":
            keep(study, args.from_arm, args.runs_dir, args.checkpoints)
        else:
            if not args.to_arm:
                parser.error("fork needs --to-arm")
            fork(study, args.from_arm, args.to_arm, args.runs_dir, args.checkpoints)
    except ForkError as err:
        print(f"study_fork: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
