"""Every script in benchmarks/ runs at its smallest size: a smoke test, so that none breaks unseen (not a measurement).

The scripts are found by glob: a new script without a case here fails `test_every_script_has_a_case`. Each case runs
its script in this process, as `python benchmarks/NAME.py ARGS` would (`runpy`, `__name__ == "__main__"`), with its
outputs in a temporary folder. A script whose work needs something that does not fit a few seconds (Flower's
simulation engine, a loopback deployment, child interpreters, a GPU) is checked up to the point where it would start
it: the harness puts a stop there (`BOUNDARIES`, and a case's own `stop`), and the case names the stop it must reach.
Reaching another stop, an error, a non-zero exit where none is expected, a case that no longer reaches its stop, a
file written into the committed results or docs, or more than `SECONDS` seconds fails the case, naming the script.

Helper modules (no `if __name__ == "__main__":`) are imported as their scripts import them.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import BENCHMARKS

REPO = BENCHMARKS.parent
SECONDS = 90  # a case's limit (a loaded 2-core machine); most take a few seconds
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
STUDIES = REPO / "benchmarks" / "results" / "studies"


class Stopped(BaseException):
    """A script reached a stop: the thing it would start (`what`) instead of starting it (a BaseException: a
    script's own `except Exception` that records a failed arm and goes on must not swallow it)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


SIMULATION = "Flower's simulation engine"
DEPLOYMENT = "a loopback deployment"
CHILD = "a child process"
FORK = "a forked child"
INPROCESS = "an in-process federation"
ROUNDS = "a strategy's rounds"
SAMPLING = "sampling a DDPM"


class RanTooLong(BaseException):
    """A case past its time (a BaseException, for the same reason as `Stopped`)."""


@dataclass(frozen=True)
class Smoke:
    """How one script runs at its smallest size.

    `argv`: its arguments (`{tmp}` becomes the case's temporary folder, `{data}` the tests' small Fashion-MNIST);
    `stops_at`: the stop it must reach (None: it runs to its end); `stop`: ("module:attribute", what) a stop of this case's own, in a function the script calls;
    `exit_code`: the status it must end with; `module`: a helper module, imported only; `inprocess`: its in-process
    federations run (fedsynth.inprocess, seconds at its size) instead of being a stop."""

    argv: tuple[str, ...] = ()
    stops_at: str | None = None
    stop: tuple[str, str] | None = None
    exit_code: int = 0
    module: bool = False
    inprocess: bool = False
    data: bool = False  # reads Fashion-MNIST from the system's dataset package (skipped where it is absent)
    note: str = ""


def study(name: str) -> str:
    return str(REPO / "studies" / f"{name}.toml")


CASES: dict[str, Smoke] = {
    "app_work": Smoke(("--rounds", "2", "--clients", "2", "--repeats", "1", "--out", "{tmp}/a.md"),
                      stops_at=INPROCESS),
    "bounded_influence_codec": Smoke(("--rounds", "1", "--seeds", "1", "--out", "{tmp}/out.md"),
                                     stops_at=INPROCESS),
    "checkpoint_cost": Smoke(("--rounds", "2", "--configs", "default", "--out", "{tmp}/out.md"),
                             stops_at=INPROCESS),
    "claims_figure": Smoke(("--figure", "{tmp}/claims.png"), stop=("fedsynth.study.figure:plot_claim_panels",
                                                                    "plotting"), stops_at="plotting"),
    "codecs": Smoke(("--size", "1000", "--repeats", "1", "--out", "{tmp}/codecs.md")),
    "ddpm": Smoke(("--devices", "cpu", "--threads", "1", "--repeats", "1", "--presets", "unet-small",
                   "--sides", "8", "--out", "{tmp}/ddpm.md"), stop=("common.models.diffusion:sample", SAMPLING),
                  stops_at=SAMPLING),
    "deployment": Smoke(("--rounds", "1", "--repeats", "1", "--out", "{tmp}/d.md"), stops_at=CHILD),
    "deployment_first_round": Smoke(("--repeats", "1", "--wait", "0", "--out", "{tmp}/d.md"), stops_at=DEPLOYMENT),
    "deployment_timeline": Smoke(("--rounds", "1", "--out", "{tmp}/d.md"), stops_at=DEPLOYMENT),
    "deployment_vs_simulation": Smoke(("--rounds", "1", "--out", "{tmp}/d.md"), stops_at=CHILD),
    "engine_round_time": Smoke(("--out", "{tmp}/e", "--rounds", "1", "--repeats", "1", "--jobs", "1"),
                               stops_at=CHILD),
    "doc_numbers": Smoke(note="without --write it checks the committed pages' numbers against the ledgers"),
    "fedcog_timing": Smoke(("--local-steps", "1", "--batch-size", "8", "--gen-steps", "1", "--budgets", "8",
                            "--out", "{tmp}/f.md"), data=True),
    "fedddpm_fingerprints": Smoke(("--out", "{tmp}/f.txt"), stop=("tests.test_inprocess_runs:run_inprocess",
                                                                  "an in-process diffusion run"),
                                  stops_at="an in-process diffusion run"),
    "fedddpm_study_details": Smoke(("--ledger", str(STUDIES / "fedddpm-cpu" / "ledger.jsonl"),
                                    "--out", "{tmp}/details.md"), exit_code=1,
                                   note="the committed ledger's run folders are not on this machine"),
    "fedsynsam_distillation": Smoke(("trajectory", "none", "--work", "{tmp}/work"),
                                    stop=("fedsynth.inprocess:InProcessGrid", INPROCESS), stops_at=INPROCESS),
    "fedsynsam_sharpness": Smoke(("--clients", "2", "--rounds", "1", "--codecs", "none", "--out", "{tmp}/s.md"),
                                 stops_at=SIMULATION),
    "fid": Smoke(("--samples", "8", "--threads", "1", "--cache-dir", "{tmp}/cache", "--out", "{tmp}/fid.md"),
                 stop=("common.metrics.fid_features:classifier_extractor", "training the FID classifier"),
                 stops_at="training the FID classifier"),
    "fid_random": Smoke(("--sides", "8", "--out", "{tmp}/fid.md"), data=True),
    "fingerprints": Smoke(("--only", "fedavg-mlp", "--data-dir", "{data}", "--out", "{tmp}/f.txt"), inprocess=True),
    "fingerprints_extra": Smoke(("fedprox",), stops_at=INPROCESS,
                                note="its runs are benchmarks/fingerprints.py's (that case runs one)"),
    "gpu_round_time": Smoke(("--tiny", "--out", "{tmp}/g", "--work-dir", "{tmp}/w", "--budget", "30"),
                            stops_at=INPROCESS),
    "hostile_probe": Smoke(("--only", "checkpoint", "--out", "{tmp}/h.md"), stops_at=INPROCESS,
                           note="building the checkpoint family's cases runs a federation first"),
    "hostile_probe_config": Smoke(module=True),
    "hostile_probe_files": Smoke(module=True),
    "hostile_probe_imports": Smoke(module=True),
    "hostile_probe_replies": Smoke(module=True),
    "hostile_probe_site": Smoke(module=True),
    "import_cost": Smoke(("--repeats", "1"), stops_at=CHILD),
    "local_steps": Smoke(("--devices", "cpu", "--threads", "1", "--cpu-steps", "1", "--setups", "F-MNIST mlp",
                          "--out", "{tmp}/l.md")),
    "memory": Smoke(("--rounds", "1", "--nodes", "2", "--out", "{tmp}/m.md"), stops_at=SIMULATION),
    "oledfl_jacobian": Smoke(("--nodes", "4", "--peers", "2", "--local-epochs", "1", "--local-steps", "1",
                              "--warmup", "1", "--rounds", "1", "--betas", "0", "--probe-nodes", "1",
                              "--data-dir", "{data}", "--cache-dir", "{tmp}/cache", "--out", "{tmp}/j.md")),
    "oledfl_sweep": Smoke(("eigen", "--nodes", "4", "--peers", "2", "--betas", "0")),
    "overhead": Smoke(("--rounds", "1", "--clients", "2", "--set", "model=mlp", "--set", "local-steps=1",
                       "--out", "{tmp}/o.md"), stops_at=INPROCESS, data=True),
    "quicktest_firing": Smoke(),
    "ray_cluster": Smoke(("--actors", "1", "--rounds", "1", "--out", "{tmp}/r.md"), stops_at=CHILD),
    "scaffold_momentum": Smoke(("--configs", "scaffold:0.9:0.01", "--rounds", "1", "--local-steps", "1",
                                "--out", "{tmp}/s.md"), stop=("server_app.app:run_strategy", ROUNDS),
                               stops_at=ROUNDS),
    "report": Smoke(module=True),
    "scaling": Smoke(("--clients", "2", "--rounds", "1", "--local-steps", "1", "--out", "{tmp}/s.md"),
                     stops_at=SIMULATION),
    "server_work": Smoke(("--devices", "cpu", "--threads", "1", "--out", "{tmp}/w.md"),
                         stop=("server_app.distillation:distill", "distilling"), stops_at="distilling"),
    "study_fork": Smoke(("fork", study("fedcog-cpu"), "--from-arm", "fedavg+cog", "--to-arm", "fedavg",
                         "--runs-dir", "{tmp}/runs", "--into", "{tmp}/kept"), exit_code=2,
                        note="no kept checkpoints in an empty --into"),
    "study_logged_values": Smoke((study("fedcog-cpu"), "--out", str(STUDIES / "fedcog-cpu"), "--keys",
                                  "round-time", "--report", "{tmp}/v.md")),
    "study_windows": Smoke((study("fedcog-cpu"), "--out", str(STUDIES / "fedcog-cpu"), "--window", "2",
                            "--report", "{tmp}/w.md")),
    "superlink_request_rate": Smoke(("--nodes", "2", "--idle", "1", "--rounds", "1", "--work", "0.1",
                                     "--out", "{tmp}/r.md"), stops_at=CHILD),
    "superlink_state_lock": Smoke(("--nodes", "1", "--rounds", "1")),
    "synsam_step_stats": Smoke((str(STUDIES / "fedsynsam-cpu-codecs"),), exit_code=1,
                               note="the committed study's run folders are not on this machine"),
    "timing": Smoke(module=True),
    "warm_clientapp_cpu": Smoke(("--repeats", "1"), stops_at=CHILD),
}


def stopper(what: str, unless: Callable[..., bool] | None = None, real: Callable | None = None) -> Callable:
    """A stand-in that raises `Stopped(what)` (or calls `real` when `unless(*args, **kwargs)` holds)."""

    def stand_in(*args, **kwargs):  # type: ignore[no-untyped-def]
        if unless is not None and real is not None and unless(*args, **kwargs):
            return real(*args, **kwargs)
        raise Stopped(what)

    return stand_in


def starts_work(args: object) -> bool:
    """Whether a child process's command line starts an interpreter or Flower's, Ray's or fedsynth's commands."""
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")  # type: ignore[call-overload]
    name = os.path.basename(os.fsdecode(first).split()[0] if first else "")
    return name.startswith(("python", "flower-", "flwr", "fedsynth", "ray")) or name == os.path.basename(sys.executable)


def install_stops(monkeypatch: pytest.MonkeyPatch, case: Smoke) -> None:
    """The harness's stops (`BOUNDARIES`), and the case's own."""
    import multiprocessing.process

    import fedsynth.loopback
    import fedsynth.simulation

    real_simulation = fedsynth.simulation.run_simulation
    # the in-process engine is the cheap path (benchmarks/fingerprints.py): it runs
    monkeypatch.setattr(fedsynth.simulation, "run_simulation",
                        stopper(SIMULATION, lambda *a, **k: k.get("engine") == "inprocess", real_simulation))
    monkeypatch.setattr(fedsynth.loopback.LoopbackFederation, "__init__", stopper(DEPLOYMENT))
    real_popen = subprocess.Popen.__init__
    # a child interpreter or one of Flower's, Ray's or fedsynth's commands; the rest (git, for a run's commit) runs
    monkeypatch.setattr(subprocess.Popen, "__init__", stopper(CHILD, lambda self, args, *a, **k: not starts_work(args),
                                                              real_popen))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", stopper(CHILD))
    monkeypatch.setattr(os, "fork", stopper(FORK))
    if not case.inprocess:
        import fedsynth.inprocess

        monkeypatch.setattr(fedsynth.inprocess, "run_federation", stopper(INPROCESS))
    if case.stop is not None:
        import importlib

        target, what = case.stop
        module_name, attribute = target.split(":")
        monkeypatch.setattr(importlib.import_module(module_name), attribute, stopper(what))


def checkout_changes() -> str:
    """What `git status` says of the committed results and docs (a script's default `--out`, the README's table):
    a smoke run must not write there."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "benchmarks/results",
                           "README.md", "docs"], cwd=REPO, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process as it was after the case: its environment, torch's threads, the path and benchmarks' modules."""
    import torch

    environment, threads, path, modules = dict(os.environ), torch.get_num_threads(), list(sys.path), set(sys.modules)
    yield
    os.environ.clear()
    os.environ.update(environment)
    torch.set_num_threads(threads)
    sys.path[:] = path
    for name in set(sys.modules) - modules:  # the scripts' own modules by their file names (timing, memory, ...)
        if str(BENCHMARKS) in str(getattr(sys.modules[name], "__file__", "") or ""):
            del sys.modules[name]


def alarm(seconds: int, name: str) -> Callable[[], None]:
    """Fail the case after `seconds` (SIGALRM: pytest runs tests in the main thread); returns the cancel."""

    def expired(signum, frame):  # type: ignore[no-untyped-def]
        raise RanTooLong(f"benchmarks/{name}.py ran past {seconds} s at its smallest size")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)

    def cancel() -> None:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

    return cancel


def test_every_script_has_a_case() -> None:
    """A script added to benchmarks/ without a smoke case here fails; a case without its script too."""
    assert set(SCRIPTS) == set(CASES), (f"without a smoke case: {sorted(set(SCRIPTS) - set(CASES))}; "
                                        f"a case without its script: {sorted(set(CASES) - set(SCRIPTS))}")


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_at_its_smallest_size(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          isolated: None, tiny_data_dir: Path) -> None:
    case = CASES[name]
    if case.data and not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file():
        pytest.skip("needs Fashion-MNIST (the dataset-fashion-mnist package, `make install` installs it)")
    script = BENCHMARKS / f"{name}.py"
    argv = [arg.replace("{tmp}", str(tmp_path)).replace("{data}", str(tiny_data_dir)) for arg in case.argv]
    before = checkout_changes()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.syspath_prepend(str(REPO))
    install_stops(monkeypatch, case)
    reached, status = None, 0
    cancel = alarm(SECONDS, name)
    try:
        runpy.run_path(str(script), run_name="benchmark_smoke" if case.module else "__main__")
    except Stopped as stop:
        reached = stop.what
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        cancel()
        monkeypatch.undo()
    assert reached == case.stops_at, (f"benchmarks/{name}.py reached {reached or f'its end (exit {status})'}, its "
                                      f"case says {case.stops_at or 'its end'}")
    assert status == case.exit_code, f"benchmarks/{name}.py exited {status}, its case says {case.exit_code}"
    assert checkout_changes() == before, f"benchmarks/{name}.py wrote into the checkout"
