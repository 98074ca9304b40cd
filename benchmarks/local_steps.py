"""Local training speed of the paper-size setups, and whether the data path or the model is the bottleneck.

    .venv/bin/python benchmarks/local_steps.py [--devices cpu,cuda] [--threads N] [--out FILE]

For each paper-size client setup of the presets (the model, dataset shape,
batch size, partition size and local-step count K of one message) and each
available device, it runs the project's own client code and measures:

- **model**: seconds per local step of `run_local_steps` with the algorithm's
  real gradient rule (`fedavg`: one forward/backward; `fedsam`: SAM's two), the
  partition resident on the device as the ClientApp keeps it, so a step is
  index -> gather -> forward/backward -> optimizer step;
- **gather**: seconds per step spent only on indexing the batch out of the
  resident partition (the ClientApp's whole per-step "data loader");
- **data path**: the per-message cost before the first step, as `client_app.app`
  pays it: `np.load` of the node's cached partition file (written here in the
  cache's own format), `to_model_input` and the copy to the device;
- **bf16 autocast**: the same steps under `torch.autocast(bfloat16)` on CUDA
  (what optional mixed precision could buy);
- the share of one message's compute (data path + K steps) that the data path
  takes, which answers "data loader or model".

The reference in the same run is the CPU of the same machine (`--threads`
torch threads), reported as the device's speed-up over it. Random images of
the dataset's shape stand in for the real files, so the script needs no
dataset. DDPM U-Nets are measured by benchmarks/ddpm.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from flwr.app import RecordDict  # noqa: E402
from timing import add_device_options, available_devices, sync  # noqa: E402

from client_app.training import LocalJob  # noqa: E402
from client_app.registry import CLIENT_UPDATES  # noqa: E402
from server_app.registry import train_records_of  # noqa: E402
from fedsynth.app_config import app_defaults  # noqa: E402
from common.run.config import parse_run_config  # noqa: E402
from common.data.datasets import dataset_info  # noqa: E402
from common.metrics.evaluation import as_tensors  # noqa: E402
from common.run.task import make_model  # noqa: E402


@dataclass(frozen=True)
class Setup:
    """One paper-size client setup: what one ClientApp message trains."""

    name: str
    dataset: str
    model: str
    algorithm: str
    batch: int
    partition_size: int   # training images of one node in the paper's split
    steps_per_message: int  # K of one round in the paper


SETUPS = (
    # FedSynSAM: Fashion-MNIST MLP, 10 clients (6000 images each), K = 10, batch 128; FedSAM/FedSynSAM use SAM
    Setup("FedSynSAM F-MNIST mlp", "fashion-mnist", "mlp", "fedsam", 128, 6000, 10),
    # FedSynSAM / DynaFed: CIFAR-10 ConvNet, 10 clients (5000 each), K = 10, batch 128
    Setup("FedSynSAM CIFAR-10 convnet", "cifar10", "convnet", "fedsam", 128, 5000, 10),
    # FedCOG: CIFAR-10 simple CNN, 10 clients, 400 local iterations of batch 64
    Setup("FedCOG CIFAR-10 cnn", "cifar10", "cnn", "fedavg", 64, 5000, 400),
    # OledFL: CIFAR-10 ResNet-18 (GroupNorm), 100 nodes (500 images each), 5 local epochs of batch 128
    Setup("OledFL CIFAR-10 resnet18 (DFedAvg)", "cifar10", "resnet18", "fedavg", 128, 500, 20),
    Setup("OledFL CIFAR-10 resnet18 (DFedSAM)", "cifar10", "resnet18", "fedsam", 128, 500, 20),
)


@dataclass
class Row:
    """One (setup, device) measurement."""

    setup: str
    device: str
    params_millions: float
    batch: int
    step_s: float
    images_per_s: float
    gather_ms: float
    data_path_s: float
    steps_per_message: int
    data_share: float
    bf16_step_s: float | None
    peak_memory_mb: float | None
    speedup_vs_cpu: float | None = None


def _partition_file(folder: Path, setup: Setup) -> Path:
    """A node's cached partition in the cache's format (uint8 NHWC images, int64 labels), random content."""
    info = dataset_info(setup.dataset)
    rng = np.random.default_rng(0)
    path = folder / f"{setup.dataset}-{setup.partition_size}.npz"
    if not path.is_file():
        x = rng.integers(0, 256, size=(setup.partition_size, info.height, info.width, info.channels), dtype=np.uint8)
        y = rng.integers(0, info.num_classes, size=setup.partition_size).astype(np.int64)
        np.savez(path, x_train=x, y_train=y, x_test=x[:0], y_test=y[:0])
    return path


def _data_path(path: Path, dataset: str, device: torch.device) -> tuple[float, torch.Tensor, torch.Tensor]:
    """What a ClientApp message does before training: load the cached partition, normalise, copy to the device."""
    sync(device)
    start = time.perf_counter()
    with np.load(path, allow_pickle=False) as stored:
        images, labels = stored["x_train"], stored["y_train"]
    x, y = as_tensors(images, labels, dataset, device)
    sync(device)
    return time.perf_counter() - start, x, y


def _steps_time(setup: Setup, device: torch.device, x: torch.Tensor, y: torch.Tensor, steps: int,
                autocast: bool) -> float:
    """Seconds per step of the setup's client rule over `steps` steps (after one warm-up round)."""
    raw = {**app_defaults(REPO_ROOT), "dataset": setup.dataset, "model": setup.model, "algorithm": setup.algorithm,
           "batch-size": setup.batch, "local-steps": steps, "lr": 0.01, "device": str(device)}
    cfg = parse_run_config(raw, CLIENT_UPDATES)
    model = make_model(cfg, seeded=True).to(device)
    context = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

    def one_round(server_round: int) -> None:
        job = LocalJob(cfg=cfg, server_round=server_round, partition_id=0, model=model, x=x, y=y,
                       device=device, incoming=train_records_of(cfg, server_round), state=RecordDict())
        with context:
            CLIENT_UPDATES[setup.algorithm](job)

    one_round(1)
    sync(device)
    start = time.perf_counter()
    one_round(2)
    sync(device)
    return (time.perf_counter() - start) / steps


def _gather_ms(x: torch.Tensor, batch: int, device: torch.device, repeats: int = 200) -> float:
    rng = np.random.default_rng(1)
    indices = [torch.from_numpy(rng.permutation(len(x))[:batch]).to(device) for _ in range(repeats)]
    sync(device)
    start = time.perf_counter()
    for index in indices:
        x[index]
    sync(device)
    return 1000 * (time.perf_counter() - start) / repeats


def measure(setup: Setup, device: torch.device, folder: Path, steps: int) -> Row:
    path = _partition_file(folder, setup)
    _data_path(path, setup.dataset, device)  # warm the page cache and the device context
    data_s, x, y = _data_path(path, setup.dataset, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_s = _steps_time(setup, device, x, y, steps, autocast=False)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    bf16 = _steps_time(setup, device, x, y, steps, autocast=True) if device.type == "cuda" else None
    params = sum(p.numel() for p in make_model(parse_run_config(
        {**app_defaults(REPO_ROOT), "dataset": setup.dataset, "model": setup.model}, CLIENT_UPDATES)).parameters())
    compute = setup.steps_per_message * step_s
    return Row(
        setup=setup.name, device=str(device), params_millions=round(params / 1e6, 3), batch=setup.batch,
        step_s=step_s, images_per_s=setup.batch / step_s, gather_ms=_gather_ms(x, setup.batch, device),
        data_path_s=data_s, steps_per_message=setup.steps_per_message,
        data_share=data_s / (data_s + compute), bf16_step_s=bf16, peak_memory_mb=peak,
    )


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "",
             "| setup | device | params (M) | batch | s / step | images/s | speed-up vs CPU | gather ms / step | "
             "data path s / message | K | data share of a message | bf16 s / step | peak GPU MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        speedup = f"{r.speedup_vs_cpu:.1f}x" if r.speedup_vs_cpu else "-"
        bf16 = f"{r.bf16_step_s:.4f}" if r.bf16_step_s is not None else "-"
        peak = f"{r.peak_memory_mb:.0f}" if r.peak_memory_mb is not None else "-"
        lines.append(
            f"| {r.setup} | {r.device} | {r.params_millions:.2f} | {r.batch} | {r.step_s:.4f} | "
            f"{r.images_per_s:.0f} | {speedup} | {r.gather_ms:.3f} | {r.data_path_s:.3f} | {r.steps_per_message} | "
            f"{100 * r.data_share:.1f} % | {bf16} | {peak} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_options(parser, REPO_ROOT / "benchmarks/results/local_steps.md")
    parser.add_argument("--cpu-steps", type=int, default=5, help="timed steps per setup on the CPU")
    parser.add_argument("--gpu-steps", type=int, default=50, help="timed steps per setup on a GPU")
    parser.add_argument("--setups", default="", help="comma-separated substrings selecting setups")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setups = [s for s in SETUPS if not args.setups or any(k in s.name for k in args.setups.split(","))]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for device in available_devices(args.devices):
            for setup in setups:
                steps = args.gpu_steps if device.type == "cuda" else args.cpu_steps
                row = measure(setup, device, Path(tmp), steps)
                print(json.dumps(asdict(row)), flush=True)
                rows.append(row)
    cpu_step = {r.setup: r.step_s for r in rows if r.device == "cpu"}
    for r in rows:
        if r.device != "cpu" and r.setup in cpu_step:
            r.speedup_vs_cpu = cpu_step[r.setup] / r.step_s
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    header = (f"Local training speed on {platform.node()}: {os.cpu_count()} CPUs, torch {torch.__version__}, "
              f"{args.threads} torch thread(s) for the CPU rows, GPU: {gpu}; load average {os.getloadavg()[0]:.1f} "
              f"at the end. Command: `python benchmarks/local_steps.py --devices {args.devices} "
              f"--threads {args.threads}`.")
    table = markdown(rows, header)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": [asdict(r) for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
