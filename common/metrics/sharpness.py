"""Sharpness of a trained model: the top eigenvalue of its training-loss Hessian (FedSynSAM Table I).

Power iteration on Hessian-vector products (Pearlmutter, 1994: the gradient of
`<grad L(w), v>` is `H v`), so the Hessian is never formed. The loss is the
mean cross-entropy over a fixed set of training examples (the whole training
split by default, or a seeded subsample), accumulated batch by batch, so the
same set gives the same number on any batch size. For a PSD Hessian power
iteration converges to its largest eigenvalue; in general it finds the one of
largest magnitude, as in PyHessian, which the paper's numbers come from.

    python -m common.metrics.sharpness <results-folder> [--max-examples N] [--iterations K]

reads `config.json` and `model.safetensors` of a run, prints the eigenvalue and
writes `sharpness.json` into the folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

Vector = list[torch.Tensor]


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(torch.sum(x * y) for x, y in zip(a, b))


def _normalized(v: Sequence[torch.Tensor]) -> Vector:
    norm = torch.sqrt(_dot(v, v))
    return [x / norm for x in v]


def hessian_vector_product(loss: torch.Tensor, params: Sequence[torch.Tensor], vector: Sequence[torch.Tensor]) -> Vector:
    """H v for the Hessian of `loss` with respect to `params`, by double backward."""
    grads = torch.autograd.grad(loss, list(params), create_graph=True)
    return [h.detach() for h in torch.autograd.grad(_dot(grads, vector), list(params))]


def dataset_hvp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> Callable[[Vector], Vector]:
    """v -> H v for the mean cross-entropy of `model` over all of (x, y), batch by batch."""
    params = [p for p in model.parameters() if p.requires_grad]

    def hvp(vector: Vector) -> Vector:
        total = [torch.zeros_like(p) for p in params]
        for start in range(0, len(y), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            # weighting each batch's mean loss by its share gives the whole set's mean loss
            loss = F.cross_entropy(model(xb), yb) * (len(yb) / len(y))
            for acc, h in zip(total, hessian_vector_product(loss, params, vector)):
                acc.add_(h)
        return total

    return hvp


def top_eigenvalue(
    hvp: Callable[[Vector], Vector], like: Sequence[torch.Tensor], iterations: int = 100, tol: float = 1e-4, seed: int = 0,
) -> tuple[float, int]:
    """(eigenvalue, iterations used) of the dominant eigenpair by power iteration with a Rayleigh quotient.

    Stops when the estimate changes by at most `tol` relative to itself.
    """
    generator = torch.Generator().manual_seed(seed)
    v = _normalized([torch.randn(p.shape, generator=generator).to(p) for p in like])
    estimate = 0.0
    for step in range(1, iterations + 1):
        hv = hvp(v)
        new = float(_dot(hv, v))  # Rayleigh quotient, ||v|| = 1
        if float(torch.sqrt(_dot(hv, hv))) == 0.0:
            return 0.0, step
        v = _normalized(hv)
        if step > 1 and abs(new - estimate) <= tol * max(abs(new), 1e-12):
            return new, step
        estimate = new
    return estimate, iterations


def results_folder_sharpness(folder: Path, max_examples: int = 10000, iterations: int = 100, tol: float = 1e-4,
                             data_dir: str | None = None) -> dict:
    """Top Hessian eigenvalue of a run's final model on its dataset's training split."""
    from safetensors.numpy import load_file

    from common.algorithms.codec_settings import METHOD_KEY
    from common.run.config import parse_run_config
    from common.data.datasets import load_run_dataset
    from common.metrics.evaluation import as_tensors, resolve_device
    from common.records import load_weights
    from common.run.task import make_model

    raw = json.loads((folder / "config.json").read_text())
    cfg = parse_run_config(raw, [raw.get("algorithm", "fedavg")])
    model_path = folder / "model.safetensors"
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path} not found: the run was made with save-model = false or did not finish")
    model = make_model(cfg)
    load_weights(model, load_file(str(model_path)))
    device = resolve_device(cfg.device)
    model = model.to(device).eval()
    data = load_run_dataset(cfg, data_dir)
    count = min(max_examples, len(data.y_train)) if max_examples > 0 else len(data.y_train)
    chosen = np.sort(np.random.default_rng(cfg.seed).choice(len(data.y_train), size=count, replace=False))
    x, y = as_tensors(data.x_train[chosen], data.y_train[chosen], cfg.dataset, device)
    params = [p for p in model.parameters() if p.requires_grad]
    eigenvalue, used = top_eigenvalue(dataset_hvp(model, x, y), params, iterations, tol, cfg.seed)
    result = {"top-hessian-eigenvalue": eigenvalue, "power-iterations": used, "examples": count,
              "algorithm": cfg.algorithm, METHOD_KEY: cfg.compression}
    (folder / "sharpness.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: the sharpness of one or more results folders."""
    parser = argparse.ArgumentParser(prog="python -m common.metrics.sharpness", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="results folders (config.json + model.safetensors)")
    parser.add_argument("--max-examples", type=int, default=10000, help="training examples used (0: all)")
    parser.add_argument("--iterations", type=int, default=100, help="maximum power iterations")
    parser.add_argument("--tol", type=float, default=1e-4, help="relative change that stops the iteration")
    parser.add_argument("--data-dir", default=None, help="override the run's data-dir")
    args = parser.parse_args(argv)
    for folder in args.folders:
        result = results_folder_sharpness(folder, args.max_examples, args.iterations, args.tol, args.data_dir)
        print(json.dumps({"folder": str(folder), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
