"""Shared fixtures: a tiny dataset in torchvision's on-disk format, a quiet Flower environment, benchmark scripts."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

# One OpenMP/BLAS thread per test process, as Ray gives each ClientApp actor (and `fedsynth study` each run on
# a 2-core host): set before numpy and torch load their thread pools. The last bits of numpy's and torch's sums
# depend on the thread count, and the tests that compare a run in this process with one in the simulation
# engine (tests/test_simulation.py) compare bits.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402 - after the thread count
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """A script of benchmarks/ imported as a module (benchmarks/ is not a package: its scripts run by path)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_idx_images(path: Path, images: np.ndarray) -> None:
    """uint8 (N, H, W) -> gzipped IDX3 file, as MNIST/Fashion-MNIST ship."""
    header = struct.pack(">BBBB", 0, 0, 8, 3) + struct.pack(">III", *images.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as handle:
        handle.write(header + images.astype(np.uint8).tobytes())


def write_idx_labels(path: Path, labels: np.ndarray) -> None:
    """uint8 (N,) -> gzipped IDX1 file."""
    header = struct.pack(">BBBB", 0, 0, 8, 1) + struct.pack(">I", len(labels))
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as handle:
        handle.write(header + labels.astype(np.uint8).tobytes())


def synthetic_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """28x28 grey images whose class is learnable: a bright bar at a class-dependent row, plus noise."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 60, size=(len(labels), 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        row = 2 + int(label) * 2
        images[i, row:row + 2, 4:24] = 230
    return images


def write_fashion_mnist(root: Path, num_train: int = 1200, num_test: int = 300, seed: int = 0) -> Path:
    """A small learnable Fashion-MNIST stand-in under root/FashionMNIST/raw."""
    rng = np.random.default_rng(seed)
    raw = root / "FashionMNIST" / "raw"
    y_train = rng.integers(0, 10, size=num_train)
    y_test = rng.integers(0, 10, size=num_test)
    write_idx_images(raw / "train-images-idx3-ubyte.gz", synthetic_images(y_train, seed + 1))
    write_idx_labels(raw / "train-labels-idx1-ubyte.gz", y_train)
    write_idx_images(raw / "t10k-images-idx3-ubyte.gz", synthetic_images(y_test, seed + 2))
    write_idx_labels(raw / "t10k-labels-idx1-ubyte.gz", y_test)
    return root


# The tests that run Flower's deployment engine (a SuperLink, SuperNodes, one ClientApp process per message). They
# spend most of their time waiting (the SuperNodes' pulls, heartbeats, process start-up: 0.5 of a core on average,
# tests/test_decentralized_deployment.py measured at 36 s CPU in 72 s), so under `make test`'s two pytest-xdist
# workers one worker runs them while the other runs the CPU-bound rest.
DEPLOYMENT_MODULES = (
    "test_deployment_failures.py", "test_own_data_deployment.py", "test_decentralized_deployment.py",
    "test_deployment_multihost.py", "test_fedsynsam_deployment.py", "test_fedcog_deployment.py",
    "test_hf_datasets.py", "test_supernode_watchdog.py", "test_warm_clientapp_deployment.py",
)
DOCKER_MODULE = "test_deployment_docker.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The deployment tests first, the Docker tests last (.ci/run may still be building the Docker base they wait for;
    last, they leave it the most time without holding back a worker), every module's tests in their own order."""
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return 0 if name in DEPLOYMENT_MODULES else 2 if name == DOCKER_MODULE else 1

    items.sort(key=rank)  # stable


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """pytest-xdist's `--dist loadscope` (a module's tests on one worker, so its module- and class-scoped fixtures
    such as test_simulation's one Ray are made once), with all deployment modules as one scope: one worker runs them
    one after the other while the other worker runs the CPU-bound modules. xdist's own `loadgroup` cannot say this
    under pytest 9 (it renames `item._nodeid`, which pytest 9's nodes no longer read)."""
    from xdist.scheduler import LoadScopeScheduling

    class DeploymentTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "deployment" if Path(module).name in DEPLOYMENT_MODULES else module

    return DeploymentTogether(config, log)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data-dir holding a 1200/300-image learnable Fashion-MNIST stand-in."""
    return write_fashion_mnist(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def fid_classifier(tmp_path_factory: pytest.TempPathFactory, tiny_data_dir: Path) -> Path:
    """The FID feature classifier of `tiny_data_dir` at the tiny diffusion task's side, trained once.

    A diffusion run trains it on first use into its cache-dir (27 s on a 2-core machine, most of a tiny
    diffusion run) and later runs on that cache-dir load it; tests that run the diffusion task many times
    start their runs from a copy (`with_fid_classifier`). Its training on first use stays tested by the
    diffusion runs that start from an empty cache-dir (test_simulation.py's FedDDPM+ case, whose in-process
    run then loads what its simulated run trained).
    """
    from common.metrics.fid_features import classifier_extractor, classifier_path
    from tests.diffusion_tiny import TINY_DIFFUSION

    cache, side = str(tmp_path_factory.mktemp("fid-classifier")), TINY_DIFFUSION["image-size"]
    classifier_extractor("fashion-mnist", side, str(tiny_data_dir), cache)
    return classifier_path("fashion-mnist", side, str(tiny_data_dir), cache)


def with_fid_classifier(cache_dir: Path, classifier: Path) -> None:
    """Put a trained classifier (`fid_classifier`) where a run with `cache-dir = cache_dir` looks for it."""
    from common.metrics.fid_features import fid_cache_dir

    target = fid_cache_dir(str(cache_dir)) / classifier.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(classifier, target)


@pytest.fixture(scope="session", autouse=True)
def quiet_flower_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep Flower and Ray state out of the home directory and off the network."""
    home = tmp_path_factory.mktemp("flwr-home")
    os.environ.setdefault("FLWR_HOME", str(home))
    # short: Ray's socket paths below it must stay within AF_UNIX's 107 bytes, which pytest-xdist's
    # /tmp/pytest-of-USER/pytest-N/popen-gwK/ base folders come close to; outside pytest's rotated
    # base folders, so it is removed at the end of the session
    ray_tmp = None
    if "RAY_TMPDIR" not in os.environ:
        ray_tmp = tempfile.mkdtemp(prefix="ray-")
        os.environ["RAY_TMPDIR"] = ray_tmp
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    os.environ["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    import torch

    # The suite runs on 2 cores shared with other work: a second intra-op thread per process
    # oversubscribes them (an in-process FedDDPM test run: 12 s CPU with 1 thread, 137 s with 2).
    torch.set_num_threads(1)
    yield
    if ray_tmp is not None:
        shutil.rmtree(ray_tmp, ignore_errors=True)
        os.environ.pop("RAY_TMPDIR", None)


@pytest.fixture(scope="session")
def flower_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app as `flwr run` ships it, copied once: the deployment tests' `flwr run` builds its FAB from here.

    From the checkout, `flwr build` first walks the `.venv` that `make install` puts there (29 s
    against 7 s for this copy on a loaded 2-core machine, per run). `flwr run .` from the checkout
    itself, as the README shows it, is tested in test_simulation.py.
    """
    from fedsynth.loopback import app_copy

    return app_copy(BENCHMARKS.parent, tmp_path_factory.mktemp("flower-app") / "app")


@pytest.fixture(scope="session")
def two_node_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A SuperLink and two SuperNodes (partitions 0 and 1 of 2) on loopback, started once for the session.

    Shared by the deployment tests whose runs need nothing else of their federation (FedCOG,
    FedSynSAM with qsgd, a local Hugging Face dataset): each test's run is a Flower run of its own,
    with its own run config, results and cache folders, and its own node state (Flower keeps a
    Context per run), so one run cannot see another. Starting and stopping a federation costs
    10-20 s on a loaded 2-core machine; a test that kills a node or gives its nodes their own
    config starts its own.
    """
    from fedsynth.loopback import LoopbackFederation

    work = tmp_path_factory.mktemp("two-node-federation")
    with LoopbackFederation(work, num_nodes=2, extra_env={"OMP_NUM_THREADS": "1"}) as federation:
        yield federation
