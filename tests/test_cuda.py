"""The CUDA code paths: every algorithm family runs on a GPU and agrees with its CPU run.

Skipped on machines without CUDA (CI has none); run on a GPU host with
`python -m pytest tests/test_cuda.py`. Each case runs the real ServerApp and
ClientApp code in process twice, once with `device = "cpu"` and once with
`device = "cuda"`, from the same seeds. GPU kernels sum in other orders than
the CPU's, so the two runs agree to a tolerance, not bitwise; TF32 is turned
off so that the tolerance can be tight for the plain rules.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tests.diffusion_tiny import TINY_DIFFUSION
from fedsynth.inprocess import InProcessGrid, run_federation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

# One run config per algorithm family: (name, extra keys, nodes, how close the final models must be).
CASES = [
    ("fedavg", {"algorithm": "fedavg"}, 3, 1e-4),
    ("scaffold", {"algorithm": "scaffold"}, 3, 1e-4),
    ("fedsam", {"algorithm": "fedsam", "sam-rho": 0.05}, 3, 1e-4),
    ("fedavg-qsgd", {"algorithm": "fedavg", "compression": "qsgd", "bits": 4}, 3, None),
    ("fedlesam", {"algorithm": "fedlesam", "model": "mlp"}, 3, 1e-4),
    ("fedsynsam", {"algorithm": "fedsynsam", "model": "mlp", "trajectory-rounds": 1, "distill-iterations": 5,
                   "synthetic-ipc": 2}, 3, 1e-3),
    ("dynafed", {"algorithm": "dynafed", "model": "mlp", "trajectory-rounds": 1, "distill-iterations": 5,
                 "synthetic-ipc": 2, "dynafed-epochs": 1}, 3, 1e-3),
    ("fedcog", {"algorithm": "fedcog", "gen-steps": 3, "gen-budget": 16, "cog-start-round": 2}, 3, 1e-3),
    ("oledfl-sam", {"algorithm": "oledfl-sam", "topology": "random", "peers": 1, "lr": 0.1}, 4, 1e-4),
    ("fedddpm", {"algorithm": "fedddpm", **TINY_DIFFUSION}, 2, None),
]


def _run(tmp_path, data_dir, name: str, extra: dict, nodes: int, device: str) -> tuple[dict, dict]:
    raw = {
        "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / device),
        "run-name": name, "num-server-rounds": 2, "local-steps": 3, "batch-size": 16, "device": device,
        "checkpoint-every": 0, **extra,
    }
    run_federation(raw, InProcessGrid(nodes, raw))
    folder = tmp_path / device / name
    summary = json.loads((folder / "summary.json").read_text())
    from safetensors.numpy import load_file

    return summary, load_file(folder / "model.safetensors")


@pytest.mark.parametrize("name, extra, nodes, atol", CASES, ids=[c[0] for c in CASES])
def test_algorithm_runs_on_cuda_and_matches_cpu(tmp_path, tiny_data_dir, name, extra, nodes, atol) -> None:
    matmul_tf32, cudnn_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        cpu_summary, cpu_model = _run(tmp_path, tiny_data_dir, name, extra, nodes, "cpu")
        gpu_summary, gpu_model = _run(tmp_path, tiny_data_dir, name, extra, nodes, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32
    assert gpu_summary["rounds"] == cpu_summary["rounds"] == 2
    assert sorted(gpu_model) == sorted(cpu_model)
    for key, value in gpu_model.items():
        assert value.dtype == cpu_model[key].dtype and np.all(np.isfinite(value)), key
        if atol is not None:
            np.testing.assert_allclose(value, cpu_model[key], atol=atol, rtol=1e-3, err_msg=key)
    if "final-central-accuracy" in cpu_summary:
        # stochastic rounding and DDPM noise amplify last-bit differences: compare outcomes for those
        assert math.isfinite(gpu_summary["final-central-accuracy"])
        assert abs(gpu_summary["final-central-accuracy"] - cpu_summary["final-central-accuracy"]) <= 0.1
    if "final-fid" in cpu_summary:
        assert math.isfinite(gpu_summary["final-fid"])


def test_model_input_normalised_on_the_gpu_equals_the_cpu_bitwise() -> None:
    """The ClientApp normalises images on its device; the GPU's numbers are the CPU's exactly."""
    from common.metrics.evaluation import as_tensors

    images = np.random.default_rng(0).integers(0, 256, size=(64, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(64) % 10
    x_cpu, _ = as_tensors(images, labels, "cifar10", torch.device("cpu"))
    x_gpu, y_gpu = as_tensors(images, labels, "cifar10", torch.device("cuda"))
    assert x_gpu.is_cuda and y_gpu.is_cuda
    np.testing.assert_array_equal(x_gpu.cpu().numpy(), x_cpu.numpy())
