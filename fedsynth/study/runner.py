"""`fedsynth study FILE.toml`: tune each arm, run every arm on the report seeds, test the claims.

The runner works in two phases. Tuning runs every grid point of every arm that
has a grid on the tuning seeds, scored on the validation metric (the clients'
held-out local split by default; tuning runs switch central evaluation off, so
the official test split is never read), and picks each arm's values. Report
runs then run every arm on every report seed with its chosen values. Every run
goes through Flower's simulation engine by the same path as `fedsynth run`
(`fedsynth.simulation.run_simulation`), in a process of its own, so `--jobs N` runs N
at once. Each finished run is scored (`fedsynth.study.scores`) and appended to the
ledger (`fedsynth.study.ledger`); a run whose key is in the ledger is never run
again, which makes a killed study resumable and a committed ledger portable.
The report (`fedsynth.study.report`) is remade from the ledger alone.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.run.interrupt import STOP, raise_if_stopped
from common.run.provenance import gather
from common.run.results import PROVENANCE_FILE
from fedsynth.app_process import app_process_env
from fedsynth.study.checks import METRICS_DIGEST, metrics_digest, other_study_in
from fedsynth.study.inputs import partition_record
from fedsynth.study.ledger import Ledger, thin
from fedsynth.study.claims import Claim, Claims
from fedsynth.study.scores import curve, score_run
from fedsynth.study.sharpness import SHARPNESS, Measurer, can_measure, lacks_sharpness, sharpness_scores
from fedsynth.study.plan import keyed_for, plan, read_rounds, total_runs
from fedsynth.study.report import write_report
from fedsynth.study.reuse import reuse_runs
from fedsynth.study.studyfile import RunSpec, Study, StudyError
from fedsynth.workers import run_worker

CHECKPOINT_FILE = "checkpoint.safetensors"
INTERRUPTED_EXIT_CODES = (130, 143)  # a run stopped by SIGINT / SIGTERM (common/run/interrupt.py)


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run process left: its exit code and wall seconds."""

    exit_code: int
    seconds: float


# An executor runs one study run and returns its outcome; the default starts a process.
Executor = Callable[[RunSpec, dict[str, Any], Path], RunOutcome]


@dataclass
class StudyPaths:
    """Where a study writes: its ledger and report (`out`), and its runs' folders (`runs`)."""

    out: Path
    runs: Path

    @property
    def ledger(self) -> Path:
        return self.out / "ledger.jsonl"

    @property
    def claims(self) -> Path:
        """The claim files of runs under way (`fedsynth.study.claims`), for processes sharing this folder."""
        return self.out / "claims"

    def log(self, spec: RunSpec) -> Path:
        """The log of one run (its process's output, then its sharpness measurement's)."""
        return self.runs / "logs" / f"{spec.folder_name}.log"


def simulation_executor(app_dir: Path, study: Study, jobs: int, gpus_per_client: float | None = None,
                        cpus_per_client: float | None = None, ray_address: str | None = None,
                        engine: str = "simulation") -> Executor:
    """Runs each study run as `python -m fedsynth.study.worker` (Flower's simulation engine, one process per run).

    Without `ray_address` each run starts a Ray of its own; with it, each run's
    ClientApps go to that cluster's nodes. With `engine = "inprocess"` each run's
    process runs its nodes itself, without Ray (`fedsynth.simulation._run_in_process`).
    """
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))

    def execute(spec: RunSpec, overrides: dict[str, Any], log_path: Path) -> RunOutcome:
        job = {
            "app-dir": str(app_dir),
            "overrides": overrides,
            "num-supernodes": study.num_supernodes,
            "cpus-per-client": study.cpus_per_client if cpus_per_client is None else cpus_per_client,
            "gpus-per-client": study.gpus_per_client if gpus_per_client is None else gpus_per_client,
            "ray-address": ray_address,
            "engine": engine,
        }
        env = app_process_env(app_dir, threads)
        env["RAY_ADDRESS"] = ray_address or "local"  # else each run its own Ray: never join a concurrent run's
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(log_path, "w") as log:
            # a worker the study signals and that never outlives it (fedsynth/workers.py)
            code = run_worker([sys.executable, "-m", "fedsynth.study.worker", json.dumps(job)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(app_dir))
        return RunOutcome(code, time.monotonic() - start)

    return execute


def run_provenance(folder: Path, device: str) -> dict[str, Any]:
    """The run folder's provenance.json (what its process recorded), else this process's record of this machine."""
    try:
        record = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict):
        return record
    return {**gather(device), "source": "the study process (the run left no provenance.json)"}


def ledger_entry(study: Study, spec: RunSpec, folder: Path, outcome: RunOutcome) -> dict[str, Any]:
    """The ledger line of a finished run: identity, its effective config and provenance, exit code, scores of every
    metric and thinned curves."""
    rounds = read_rounds(folder)
    scores = score_run(rounds, study.metrics, last_k=study.last_k, targets=study.targets)
    measured = sharpness_scores(folder) if SHARPNESS in study.metrics else None
    if measured is not None:
        scores[SHARPNESS] = measured
    curves = {m: thin([[r, v] for r, v, _ in curve(rounds, m)]) for m in study.metrics}
    identity: dict[str, Any] = {
        **spec.recorded(), "study": study.name, "cell": spec.cell, "arm": spec.arm, "variant": spec.variant,
        "phase": spec.phase, "seed": spec.seed, "grid-point": spec.grid_point}
    if spec.effective is not None:
        identity["provenance"] = run_provenance(folder, str(spec.effective.get("device", "auto")))
    return {
        **identity,
        "exit-code": outcome.exit_code, "seconds": round(outcome.seconds, 2),
        "rounds": max((int(r.get("round", 0)) for r in rounds), default=0),
        "scores": scores, "curves": curves, "run-dir": str(folder), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        METRICS_DIGEST: metrics_digest(folder), "partition": partition_record(folder),
    }


def _prepare_folder(folder: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """A run killed mid-way: resume it from its checkpoint, else keep its folder aside and start over."""
    if not folder.exists():
        return overrides
    if (folder / CHECKPOINT_FILE).is_file():
        return {**overrides, "resume": True}
    aside = folder.parent / ".interrupted" / f"{folder.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(folder), str(aside))
    return overrides


class Progress:
    """One line per finished run: its score, its time and the study's time left (mean run time × runs left / jobs)."""

    def __init__(self, total: int, jobs: int, metric: str, tuning_metric: str,
                 write: Callable[[str], None] = print) -> None:
        self.total, self.jobs, self.write = total, max(1, jobs), write
        self.metric, self.tuning_metric = metric, tuning_metric
        self.done = 0
        self.seconds: list[float] = []

    def finished(self, spec: RunSpec, entry: Mapping[str, Any]) -> None:
        self.done += 1
        self.seconds.append(float(entry["seconds"]))
        left = (self.total - self.done) * (sum(self.seconds) / len(self.seconds)) / self.jobs
        metric = self.tuning_metric if spec.phase == "tune" else self.metric  # tuning runs skip the test split
        value = entry["scores"].get(metric, {}).get("last-k")
        score = f"{value:.4f}" if isinstance(value, (int, float)) and math.isfinite(value) else "none"
        status = "" if entry["exit-code"] == 0 else f" (exit {entry['exit-code']})"
        self.write(f"[{self.done}/{self.total}] {spec.cell} {spec.phase} seed {spec.seed} "
                   f"{json.dumps(spec.grid_point) if spec.grid_point else ''}: last-k {metric} {score}{status} "
                   f"in {entry['seconds']:.0f} s; about {_duration(left)} left")


def _duration(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min" if minutes else f"{seconds:.0f} s"


def _run_and_measure(executor: Executor, measurer: Measurer | None, spec: RunSpec, overrides: dict[str, Any],
                     log_path: Path, folder: Path) -> RunOutcome:
    """One job slot: the run, then (when the study measures it) its final model's sharpness."""
    outcome = executor(spec, overrides, log_path)
    if measurer is not None and can_measure(spec.phase, outcome.exit_code, folder):
        measurer(folder, log_path)  # a failed measurement leaves no sharpness.json; the next call tries again
    return outcome


def _unrecorded(exit_code: int) -> str:
    """Why a run's end is not a result: stopped by a signal, killed, or failed before its first round."""
    if exit_code in INTERRUPTED_EXIT_CODES:
        return f"stopped by a signal (exit {exit_code})"
    if exit_code < 0:
        return f"killed by signal {-exit_code} (exit {exit_code}; SIGKILL is often the out-of-memory killer)"
    return f"exit {exit_code} before any round finished"


def seed_by_seed(study: Study, report: Sequence[RunSpec]) -> list[RunSpec]:
    """The report runs in the order they are run: every cell on the first report seed, then on the next, ...

    Why: a study stopped part-way (a session's end, `--max-runs`) then holds whole seeds, so every claim
    has as many pairs as the runs allow, where an arm-by-arm order would leave the last arms with none.
    """
    return sorted(report, key=lambda spec: study.report_seeds.index(spec.seed))


def execute_runs(study: Study, specs: Sequence[RunSpec], ledger: Ledger, paths: StudyPaths, executor: Executor,
                 jobs: int, progress: Progress, max_runs: int | None = None, retry_failed: bool = False,
                 measurer: Measurer | None = None) -> int:
    """Run every spec not in the ledger (or failed, with retry_failed), N at once; returns how many were run.

    Each run is claimed first (`fedsynth.study.claims`): a run another process on
    the same study folder finished or holds meanwhile is skipped.
    """
    todo = []
    for spec in specs:
        entry = ledger.get(spec.key)
        if entry is None or (retry_failed and entry.get("exit-code") != 0):
            if spec not in todo:
                todo.append(spec)
    if max_runs is not None:
        todo = todo[:max_runs]
    planned = {spec.key: ledger.get(spec.key) for spec in todo}
    claims = Claims(ledger, paths.claims)
    ran = taken_elsewhere = 0
    pending: dict[Future[RunOutcome], tuple[RunSpec, Path, Claim]] = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            queue = list(todo)
            while (queue and not STOP.is_set()) or pending:
                while queue and len(pending) < max(1, jobs) and not STOP.is_set():  # a signal: start no new run
                    spec = queue.pop(0)
                    claim = claims.claim(spec.key, planned[spec.key])
                    if claim is None:
                        taken_elsewhere += 1
                        continue
                    folder = paths.runs / spec.folder_name
                    try:
                        overrides = {**_prepare_folder(folder, dict(spec.overrides)),
                                     "results-dir": str(paths.runs), "run-name": spec.folder_name}
                        future = pool.submit(_run_and_measure, executor, measurer, spec, overrides, paths.log(spec),
                                             folder)
                    except BaseException:
                        claims.release(claim)
                        raise
                    pending[future] = (spec, folder, claim)
                if not pending:
                    continue
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    spec, folder, claim = pending[future]
                    outcome = future.result()
                    del pending[future]
                    entry = ledger_entry(study, spec, folder, outcome)
                    if (outcome.exit_code < 0 or outcome.exit_code in INTERRUPTED_EXIT_CODES
                            or (outcome.exit_code != 0 and entry["rounds"] == 0)):
                        # Killed or interrupted by a signal (130/143: it stopped cleanly and kept its checkpoint),
                        # or failed before its first round (the engine did not start): not a result of the
                        # method; it runs again (resumes) on the next call.
                        claims.release(claim)
                        progress.write(f"{spec.cell} {spec.phase} seed {spec.seed}: {_unrecorded(outcome.exit_code)}; "
                                       f"not recorded, it runs again (resumes from its checkpoint, if any) next time "
                                       f"(log: {paths.log(spec)})")
                        continue
                    claims.record(claim, entry)
                    progress.finished(spec, entry)
                    ran += 1
    finally:
        for _, _, claim in pending.values():  # this process stops (its pool waited for them): free to take again
            claims.release(claim)
    if taken_elsewhere:
        progress.write(f"{taken_elsewhere} run(s) skipped: finished or under way in another `fedsynth study` on "
                       f"{paths.out}")
    raise_if_stopped()  # the study was signalled: its workers stopped, it stops too (exit 130/143)
    return ran


def measure_recorded_runs(study: Study, ledger: Ledger, paths: StudyPaths, measurer: Measurer, jobs: int,
                          write: Callable[[str], None] = print) -> int:
    """Measure the sharpness of report runs recorded without it, from the models they left; returns how many.

    Their ledger entries are appended again with the sharpness score added (the
    last entry of a key wins). Runs whose folder has no model are listed once.
    """
    _, report, _ = plan(study, ledger)
    todo: list[tuple[dict[str, Any], Path, Path]] = []
    without_model = 0
    for spec in report:
        entry = ledger.get(spec.key)
        if entry is None or entry.get("exit-code") != 0 or not lacks_sharpness(entry):
            continue
        folder = paths.runs / spec.folder_name
        if can_measure(spec.phase, 0, folder):
            todo.append((entry, folder, paths.log(spec)))
        else:
            without_model += 1
    if without_model:
        write(f"sharpness: {without_model} recorded report run(s) have no model.safetensors under {paths.runs}; "
              f"not measured (save-model = false, or the runs' folders are elsewhere: --runs-dir)")
    measured = 0
    claims = Claims(ledger, paths.claims)  # another process on this folder may be measuring the same runs
    held = []
    for entry, folder, log in todo:
        claim = claims.claim(entry["key"], entry)
        if claim is not None:
            held.append((entry, folder, log, claim))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(measurer, folder, log): (entry, folder, claim) for entry, folder, log, claim in held}
        try:
            for future in list(futures):
                entry, folder, claim = futures.pop(future)
                try:
                    future.result()
                    scores = sharpness_scores(folder)
                except BaseException:
                    claims.release(claim)
                    raise
                if scores is None:
                    claims.release(claim)
                    write(f"sharpness of {folder} failed; see its log under {paths.runs / 'logs'}")
                    continue
                claims.record(claim, {**entry, "scores": {**entry.get("scores", {}), SHARPNESS: scores}})
                measured += 1
                write(f"sharpness {entry.get('cell')} seed {entry.get('seed')}: {scores['last-k']:.4f}")
        finally:
            for _, _, claim in futures.values():
                claims.release(claim)
    return measured


def refuse_before_provenance(study: Study, ledger: Ledger) -> None:
    """Raise StudyError when the ledger is another study's (`fedsynth.study.checks.other_study_in`), or was made
    before provenance or before run keys covered the run's inputs: running on it would mix rules unseen.

    Its entries are keyed by their study settings and record no effective config, so the
    defaults they ran under are unknown; runs made now would run again under new keys and
    sit beside them. Their report is remade with `--report-only`; the study runs anew on
    another `--out` (docs/studies.md).
    """
    other = other_study_in(study, ledger, ledger.path.parent)
    if other is not None:
        raise StudyError(other)
    read_as = keyed_for(study, ledger)
    if not study.keyed_by_settings and not read_as.keyed_by_settings and read_as.key_version < study.key_version:
        raise StudyError(
            f"ledger {ledger.path} was made before run keys covered the client count and the data (key version "
            f"{read_as.key_version}): its entries do not record how many clients ran nor on which data, so runs made "
            f"now would sit beside them under other keys. Nothing was run. `--report-only` remakes its report from "
            f"it; to run the study under today's code, give another --out (docs/studies.md)")
    if study.keyed_by_settings or not read_as.keyed_by_settings:
        return
    raise StudyError(
        f"ledger {ledger.path} was made before provenance: its {len(ledger.entries)} entries record no effective "
        f"config (their run keys digest the study's settings alone, and the defaults they ran under are unknown). "
        f"Nothing was run. `--report-only` remakes its report from it; to run the study under today's code, give "
        f"another --out (the runs then get keys that digest their effective config; docs/studies.md)")


def run_study(study: Study, paths: StudyPaths, executor: Executor, jobs: int = 1, max_runs: int | None = None,
              retry_failed: bool = False, write: Callable[[str], None] = print,
              measurer: Measurer | None = None, reuse: Sequence[Ledger] = ()) -> Ledger:
    """Both phases, then the report; returns the ledger. Safe to call again after a kill.

    `reuse` (`fedsynth study --reuse`) is read again once tuning has chosen: the
    report runs at the chosen values are known only then, and another study may
    have finished them.

    Several processes (hosts on shared storage) may run the same study on one
    `paths.out` at once: each claims a run before it starts it
    (`fedsynth.study.claims`), so no run runs twice, and each reads the others'
    entries before it plans the report runs and writes the report (the last to
    finish writes the whole report). With a `measurer`, a study that scores
    `sharpness` measures each report run's final model.
    """
    paths.out.mkdir(parents=True, exist_ok=True)
    if SHARPNESS not in study.metrics:
        measurer = None
    ledger = Ledger(paths.ledger)
    with ledger.locked():
        repaired = ledger.repair()
        ledger.reload()
    if repaired:
        write(f"ledger {paths.ledger}: {repaired}")
    refuse_before_provenance(study, ledger)
    tuning, report, _ = plan(study, ledger)
    remaining = total_runs(study) - sum(1 for spec in tuning + report if spec.key in ledger)
    write(f"study {study.name}: {total_runs(study)} runs ({len(tuning)} tuning, "
          f"{len(study.cells()) * len(study.report_seeds)} report), {len(ledger.entries)} in the ledger {paths.ledger}")
    progress = Progress(max(0, remaining), jobs, study.metric, study.tuning_metric, write)
    budget = max_runs
    ran = execute_runs(study, tuning, ledger, paths, executor, jobs, progress, budget, retry_failed, measurer)
    if budget is not None:
        budget -= ran
    ledger.reload()  # tuning runs other processes finished meanwhile
    if reuse:
        copied = reuse_runs(study, ledger, reuse)
        if copied:
            write(f"reused {copied} report run(s) at the tuned values")
    _, report, chosen = plan(study, ledger)
    for cell, point in chosen.items():
        write(f"tuned {cell}: {json.dumps(point)}")
    if budget is None or budget > 0:
        execute_runs(study, seed_by_seed(study, report), ledger, paths, executor, jobs, progress, budget,
                     retry_failed, measurer)
    if measurer is not None:
        measure_recorded_runs(study, ledger, paths, measurer, jobs, write)
    with ledger.locked():  # the last process to finish writes last, from the whole ledger
        ledger.reload()
        write_report(study, ledger, paths.out)
    write(f"report: {paths.out / 'report.md'}")
    return ledger
