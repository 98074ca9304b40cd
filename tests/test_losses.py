"""Tests for common.algorithms.losses and common.algorithms.sam against hand-computed numbers (SPEC 3.4, 4.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from common.algorithms.losses import (
    moon_contrastive_loss,
    proximal_term,
    scaffold_client_control,
    scaffold_server_control,
)
from common.algorithms.sam import (
    current_gradients,
    fedsam_gradients,
    perturbed_gradients,
    sam_perturbation,
)

# ----- FedProx -----------------------------------------------------------------------


def test_proximal_term_hand_value() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    anchor = torch.tensor([0.0, 0.0])
    value = proximal_term([w], [anchor], 0.1)
    # (0.1 / 2) * (1 + 4) = 0.25
    assert value.item() == pytest.approx(0.25)


def test_proximal_term_gradient_is_mu_times_difference() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    anchor = torch.tensor([0.5, -1.0])
    proximal_term([w], [anchor], 0.1).backward()
    assert torch.allclose(w.grad, torch.tensor([0.05, 0.3]))


def test_proximal_term_sums_over_several_tensors_and_is_zero_at_anchor() -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    b = torch.tensor([3.0], requires_grad=True)
    anchors = [torch.zeros(2, 2), torch.tensor([1.0])]
    # (0.5 / 2) * (1 + 1 + 4) = 1.5
    assert proximal_term([a, b], anchors, 0.5).item() == pytest.approx(1.5)
    assert proximal_term([a, b], [a.detach(), b.detach()], 0.5).item() == 0.0
    # mu = 0 disables the term
    assert proximal_term([a, b], anchors, 0.0).item() == 0.0


def test_proximal_term_does_not_backprop_into_anchor() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    anchor = w.detach().clone() - 1.0
    proximal_term([w], [anchor], 2.0).backward()
    assert torch.allclose(w.grad, torch.tensor([2.0, 2.0]))


# ----- SCAFFOLD ----------------------------------------------------------------------


def test_scaffold_client_control_option_two_hand_value() -> None:
    one = lambda v: {"w": np.array([v], dtype=np.float32)}  # noqa: E731
    c_new = scaffold_client_control(one(1.0), one(0.5), one(1.0), one(0.8), num_steps=4, lr=0.1)
    # 1 - 0.5 + (1.0 - 0.8) / (4 * 0.1) = 0.5 + 0.5 = 1.0
    assert c_new["w"].dtype == np.float32
    assert c_new["w"][0] == pytest.approx(1.0, abs=1e-6)


def test_scaffold_client_control_several_arrays() -> None:
    c_local = {"a": np.array([0.0, 1.0], np.float32), "b": np.array([[2.0]], np.float32)}
    c_global = {"a": np.array([1.0, 1.0], np.float32), "b": np.array([[0.0]], np.float32)}
    w_global = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([[0.0]], np.float32)}
    w_local = {"a": np.array([0.0, 3.0], np.float32), "b": np.array([[-1.0]], np.float32)}
    out = scaffold_client_control(c_local, c_global, w_global, w_local, num_steps=2, lr=0.5)
    # a: [0-1 + 1/1, 1-1 + (-1)/1] = [0, -1];  b: 2 - 0 + 1/1 = 3
    np.testing.assert_allclose(out["a"], [0.0, -1.0])
    np.testing.assert_allclose(out["b"], [[3.0]])


def test_scaffold_server_control_hand_value() -> None:
    c = {"w": np.array([1.0, 0.0], np.float32)}
    deltas = [{"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([3.0, -2.0], np.float32)}]
    out = scaffold_server_control(c, deltas, num_clients=4)
    # c + (1/4) * ([1,2] + [3,-2]) = [1,0] + [1,0] = [2, 0]
    np.testing.assert_allclose(out["w"], [2.0, 0.0])
    assert out["w"].dtype == np.float32
    # N is the federation size, not the number of replies
    out10 = scaffold_server_control(c, deltas, num_clients=10)
    np.testing.assert_allclose(out10["w"], [1.4, 0.0], rtol=1e-6)


def test_scaffold_server_control_without_deltas_is_unchanged() -> None:
    c = {"w": np.array([0.25], np.float32)}
    assert scaffold_server_control(c, [], num_clients=3)["w"][0] == pytest.approx(0.25)


# ----- MOON --------------------------------------------------------------------------


def test_moon_loss_aligned_with_global_orthogonal_to_previous() -> None:
    z = torch.tensor([[1.0, 0.0]])
    z_global = torch.tensor([[2.0, 0.0]])  # same direction: cosine 1
    z_prev = torch.tensor([[0.0, 3.0]])    # orthogonal: cosine 0
    loss = moon_contrastive_loss(z, z_global, z_prev, tau=0.5)
    expected = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0)))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_moon_loss_is_log2_when_previous_equals_global() -> None:
    z = torch.tensor([[0.3, -1.2, 2.0], [1.0, 1.0, 0.0]])
    other = torch.tensor([[1.0, 0.5, -0.5], [0.0, 2.0, 1.0]])
    loss = moon_contrastive_loss(z, other, other.clone(), tau=0.5)
    assert loss.item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_moon_loss_is_batch_mean() -> None:
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    z_global = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    tau = 1.0
    # row 1: cos(z, g) = 1, cos(z, p) = 0;  row 2: cos(z, g) = 0, cos(z, p) = 1
    first = -math.log(math.e / (math.e + 1.0))
    second = -math.log(1.0 / (1.0 + math.e))
    loss = moon_contrastive_loss(z, z_global, z_prev, tau)
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)


def test_moon_loss_gradient_flows_only_through_z() -> None:
    z = torch.tensor([[1.0, 1.0]], requires_grad=True)
    z_global = torch.tensor([[1.0, 0.0]])
    z_prev = torch.tensor([[0.0, 1.0]])
    moon_contrastive_loss(z, z_global, z_prev, tau=0.5).backward()
    # Pulling z towards z_global: the loss decreases along +x and -y.
    assert z.grad[0, 0] < 0 < z.grad[0, 1]


# ----- SAM on a quadratic -------------------------------------------------------------

A_DIAG = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
W0 = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)


def quadratic(w: torch.Tensor) -> torch.Tensor:
    """f(w) = 0.5 w^T A w with A = diag(A_DIAG); grad f = A w."""
    return 0.5 * torch.sum(A_DIAG * w * w)


def test_sam_perturbation_is_rho_g_over_norm() -> None:
    g = A_DIAG * W0  # [1, -2, 2], norm 3
    (e,) = sam_perturbation([g], rho=0.3)
    assert torch.allclose(e, torch.tensor([0.1, -0.2, 0.2], dtype=torch.float64))
    assert torch.linalg.vector_norm(e).item() == pytest.approx(0.3)


def test_sam_perturbation_of_zero_direction_is_zero() -> None:
    (e,) = sam_perturbation([torch.zeros(3)], rho=0.5)
    assert torch.equal(e, torch.zeros(3))


def test_fedsam_gradients_closed_form_and_w_unchanged() -> None:
    w = nn.Parameter(W0.clone())
    rho = 0.3
    loss = fedsam_gradients([w], lambda: quadratic(w), rho)
    g = A_DIAG * W0                          # [1, -2, 2]
    w_adv = W0 + rho * g / torch.linalg.vector_norm(g)  # [1.1, -1.2, 0.7]
    expected_grad = A_DIAG * w_adv           # [1.1, -2.4, 2.8]
    assert torch.allclose(expected_grad, torch.tensor([1.1, -2.4, 2.8], dtype=torch.float64))
    assert torch.allclose(w.grad, expected_grad)
    assert torch.allclose(w.detach(), W0, rtol=0, atol=1e-12)  # restored
    assert loss.item() == pytest.approx(quadratic(w_adv).item())


def test_one_sgd_step_with_sam_gradient_matches_closed_form() -> None:
    w = nn.Parameter(W0.clone())
    rho, lr = 0.3, 0.1
    opt = torch.optim.SGD([w], lr=lr)
    opt.zero_grad()
    fedsam_gradients([w], lambda: quadratic(w), rho)
    opt.step()
    g = A_DIAG * W0
    expected = W0 - lr * A_DIAG * (W0 + rho * g / torch.linalg.vector_norm(g))
    # [1 - 0.11, -1 + 0.24, 0.5 - 0.28]
    assert torch.allclose(expected, torch.tensor([0.89, -0.76, 0.22], dtype=torch.float64))
    assert torch.allclose(w.detach(), expected)


def test_fedsam_with_rho_zero_is_the_plain_gradient() -> None:
    w = nn.Parameter(W0.clone())
    fedsam_gradients([w], lambda: quadratic(w), 0.0)
    assert torch.allclose(w.grad, A_DIAG * W0)


def test_fedsam_ignores_stale_grad() -> None:
    w = nn.Parameter(W0.clone())
    w.grad = torch.full_like(W0, 100.0)  # left over from some earlier backward
    fedsam_gradients([w], lambda: quadratic(w), 0.3)
    assert torch.allclose(w.grad, torch.tensor([1.1, -2.4, 2.8], dtype=torch.float64))


def test_perturbed_gradients_uses_global_norm_across_tensors() -> None:
    # loss = 0.5 (||a||^2 + ||b||^2): gradient at w + e is w + e, so .grad - w recovers e.
    a = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    b = nn.Parameter(torch.tensor([[0.5], [-0.5]], dtype=torch.float64))
    a0, b0 = a.detach().clone(), b.detach().clone()
    direction = [torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([[0.0], [4.0]], dtype=torch.float64)]
    rho = 0.5

    def loss_fn() -> torch.Tensor:
        return 0.5 * (torch.sum(a * a) + torch.sum(b * b))

    loss = perturbed_gradients([a, b], loss_fn, direction, rho)
    # Global norm sqrt(9 + 16) = 5: e_a = 0.1 * [3, 0] = [0.3, 0], e_b = 0.1 * [0, 4] = [0, 0.4]
    # (per-tensor normalisation would give [0.5, 0] and [0, 0.5]).
    assert torch.allclose(a.grad - a0, torch.tensor([0.3, 0.0], dtype=torch.float64))
    assert torch.allclose(b.grad - b0, torch.tensor([[0.0], [0.4]], dtype=torch.float64))
    # restored by subtracting e again: equal up to rounding (1.0 + 0.3 - 0.3 != 1.0 exactly)
    assert torch.allclose(a.detach(), a0, rtol=0, atol=1e-12)
    assert torch.allclose(b.detach(), b0, rtol=0, atol=1e-12)
    expected_loss = 0.5 * ((1.3**2 + 2.0**2) + (0.5**2 + 0.1**2))
    assert loss.item() == pytest.approx(expected_loss)
    assert not loss.requires_grad


def test_perturbed_gradients_float32_direction() -> None:
    a = nn.Parameter(torch.tensor([0.0, 0.0]))
    perturbed_gradients([a], lambda: 0.5 * torch.sum(a * a), [torch.tensor([3.0, 4.0])], rho=1.0)
    assert torch.allclose(a.grad, torch.tensor([0.6, 0.8]))
    assert torch.allclose(a.detach(), torch.zeros(2), rtol=0, atol=1e-7)


def test_current_gradients_copies_and_fills_missing_with_zeros() -> None:
    a = nn.Parameter(torch.tensor([1.0, 2.0]))
    b = nn.Parameter(torch.tensor([3.0]))
    (2 * a).sum().backward()
    grads = current_gradients([a, b])
    assert torch.equal(grads[0], torch.tensor([2.0, 2.0]))
    assert torch.equal(grads[1], torch.zeros(1))
    grads[0].add_(1.0)
    assert torch.equal(a.grad, torch.tensor([2.0, 2.0]))  # a copy, not the .grad itself
