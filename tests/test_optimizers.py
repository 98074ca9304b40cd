"""The local optimizers compute bitwise what torch.optim computes, and a ClientApp message never imports torch._dynamo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.algorithms.optimizers import SGD, Adam, make_optimizer

ROOT = Path(__file__).resolve().parents[1]


def small_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def train(model: torch.nn.Module, optimizer, steps: int = 7) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=generator)
        y = torch.randint(0, 3, (8,), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.5, 1e-2)])
def test_sgd_is_bitwise_torch_optim_sgd(momentum, weight_decay):
    ours = small_model(0)
    reference = small_model(0)
    got = train(ours, SGD(ours.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay))
    want = train(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=momentum,
                                            weight_decay=weight_decay, foreach=False))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("betas, weight_decay", [((0.9, 0.999), 0.0), ((0.5, 0.9), 0.0), ((0.9, 0.999), 1e-3)])
def test_adam_is_bitwise_torch_optim_adam(betas, weight_decay):
    ours = small_model(2)
    reference = small_model(2)
    got = train(ours, Adam(ours.parameters(), lr=2e-3, betas=betas, weight_decay=weight_decay))
    want = train(reference, torch.optim.Adam(reference.parameters(), lr=2e-3, betas=betas,
                                             weight_decay=weight_decay, foreach=False))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_sgd_step_by_hand():
    """One parameter, two steps: w1 = w0 - lr (g0 + wd w0); buffer b1 = m b0 + g1'."""
    w = torch.tensor([1.0], requires_grad=True)
    optimizer = SGD([w], lr=0.5, momentum=0.5, weight_decay=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        (3.0 * w).sum().backward()  # gradient 3
        optimizer.step()
    # step 1: g = 3 + 0.1 * 1 = 3.1, b = 3.1, w = 1 - 1.55 = -0.55
    # step 2: g = 3 + 0.1 * -0.55 = 2.945, b = 0.5 * 3.1 + 2.945 = 4.495, w = -0.55 - 2.2475 = -2.7975
    assert abs(float(w.detach()) + 2.7975) < 1e-6


def test_parameters_without_gradient_are_left_alone_and_bad_kinds_are_refused():
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(2, requires_grad=True)
    optimizer = make_optimizer([a, b], "adam", lr=0.1)
    a.sum().backward()
    optimizer.step()
    assert torch.equal(b, torch.ones(2)) and not torch.equal(a, torch.ones(2))
    with pytest.raises(ValueError, match="sgd, adam"):
        make_optimizer([a], "rmsprop", lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)


def test_a_clientapp_message_does_not_import_torch_dynamo(tmp_path, tiny_data_dir):
    """torch.optim imports torch._dynamo (1.8 s here), once per process: every deployed message would pay it."""
    code = f"""
import sys, json
from fedsynth.inprocess import InProcessGrid, run_federation
for algorithm, extra in [("fedavg", {{}}), ("fedsam", {{}}), ("fedavg", {{"local-optimizer": "adam"}})]:
    raw = {{"data-dir": {str(tiny_data_dir)!r}, "cache-dir": {str(tmp_path / 'cache')!r},
           "results-dir": {str(tmp_path / 'results')!r}, "run-name": algorithm + str(len(extra)),
           "num-server-rounds": 1, "local-steps": 2, "batch-size": 8, "model": "mlp", "central-eval": False,
           "algorithm": algorithm, **extra}}
    run_federation(raw, InProcessGrid(2, raw))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("torch._dynamo"))))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def train_clipped(model: torch.nn.Module, optimizer, max_norm: float, steps: int = 7) -> list[torch.Tensor]:
    """`train` with torch.nn.utils.clip_grad_norm_ between backward() and step(), the usual torch recipe."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = 10 * torch.randn(8, 6, generator=generator)  # large inputs: gradients well above the bound
        y = torch.randint(0, 3, (8,), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind, momentum, weight_decay", [("sgd", 0.0, 0.0), ("sgd", 0.9, 5e-4), ("adam", 0.0, 1e-3)])
def test_clipping_equals_clip_grad_norm_before_torch_optim(kind, momentum, weight_decay):
    """clip-grad-norm = torch.nn.utils.clip_grad_norm_ on the loss gradient, then torch.optim's step."""
    ours, reference, unclipped = small_model(3), small_model(3), small_model(3)
    lr = 0.1 if kind == "sgd" else 2e-3
    got = train_clipped(ours, make_optimizer(ours.parameters(), kind, lr, momentum, weight_decay, clip_grad_norm=0.5), 0.0)
    torch_optimizer = (torch.optim.SGD(reference.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay,
                                       foreach=False) if kind == "sgd" else
                       torch.optim.Adam(reference.parameters(), lr=lr, weight_decay=weight_decay, foreach=False))
    want = train_clipped(reference, torch_optimizer, 0.5)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    free = train_clipped(unclipped, make_optimizer(unclipped.parameters(), kind, lr, momentum, weight_decay), 0.0)
    assert any(not torch.equal(a, b) for a, b in zip(got, free))  # the bound was active


def test_clipping_bounds_the_gradient_norm_and_keeps_its_direction():
    a = torch.zeros(3, requires_grad=True)
    b = torch.zeros(4, requires_grad=True)
    a.grad = torch.tensor([3.0, 0.0, 0.0])
    b.grad = torch.tensor([0.0, 4.0, 0.0, 0.0])  # global norm 5
    optimizer = SGD([a, b], lr=1.0, clip_grad_norm=1.0)
    assert optimizer.clip_gradients() == pytest.approx(5.0)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0, 0.0]), rtol=0, atol=1e-6)
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 0.8, 0.0, 0.0]), rtol=0, atol=1e-6)
    # below the bound nothing changes (the factor 1 / (norm + 1e-6) is clamped at 1)
    a.grad, b.grad = torch.tensor([0.3, 0.0, 0.0]), torch.tensor([0.0, 0.4, 0.0, 0.0])
    optimizer.clip_gradients()
    assert torch.equal(a.grad, torch.tensor([0.3, 0.0, 0.0])) and torch.equal(b.grad, torch.tensor([0.0, 0.4, 0.0, 0.0]))
    assert SGD([a], lr=1.0).clip_gradients() is None  # 0: off
    with pytest.raises(ValueError, match="clip_grad_norm"):
        SGD([a], lr=1.0, clip_grad_norm=-1.0)
