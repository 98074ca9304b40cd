"""Top Hessian eigenvalue by power iteration with Hessian-vector products, and its command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from common.run.config import RunConfig
from common.records import model_weights
from common.metrics.sharpness import dataset_hvp, main, top_eigenvalue
from common.run.task import make_model


def test_power_iteration_finds_the_top_eigenvalue_of_a_known_matrix():
    matrix = torch.diag(torch.tensor([5.0, 2.0, -1.0, 0.5], dtype=torch.float64))
    value, used = top_eigenvalue(lambda v: [matrix @ v[0]], [torch.zeros(4, dtype=torch.float64)], iterations=500, tol=1e-10)
    assert value == pytest.approx(5.0, rel=1e-8) and used < 500


def test_matches_the_explicit_hessian_of_a_small_network():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 3)).double()
    x, y = torch.randn(50, 4, dtype=torch.float64), torch.randint(0, 3, (50,))
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    flat0 = torch.cat([p.detach().reshape(-1) for p in params])

    def loss_of(flat: torch.Tensor) -> torch.Tensor:
        chunks, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            chunks.append(flat[start:start + size].reshape(shape))
            start += size
        names = [n for n, _ in model.named_parameters()]
        out = torch.func.functional_call(model, dict(zip(names, chunks)), (x,))
        return nn.functional.cross_entropy(out, y)

    hessian = torch.autograd.functional.hessian(loss_of, flat0)
    eigenvalues = torch.linalg.eigvalsh(hessian)
    dominant = float(eigenvalues[eigenvalues.abs().argmax()])
    # batches of 20 (the last one 10) must give the same whole-set Hessian as one batch
    value, _ = top_eigenvalue(dataset_hvp(model, x, y, batch_size=20), params, iterations=1000, tol=1e-12)
    assert value == pytest.approx(dominant, rel=1e-6)


def test_command_line_on_a_results_folder(tmp_path, tiny_data_dir):
    from safetensors.numpy import save_file

    cfg = RunConfig(model="mlp", data_dir=str(tiny_data_dir), cache_dir=str(tmp_path / "cache"))
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg.as_dict()))
    save_file(model_weights(make_model(cfg, seeded=True)), str(folder / "model.safetensors"))
    assert main([str(folder), "--max-examples", "300", "--iterations", "30"]) == 0
    result = json.loads((folder / "sharpness.json").read_text())
    assert result["examples"] == 300 and result["top-hessian-eigenvalue"] > 0 and result["power-iterations"] <= 30
