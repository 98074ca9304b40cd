"""The diffusion task (common/models/diffusion.py) against diffusers and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.models.diffusion import (
    UNET_PRESETS,
    DDPMLoss,
    SamplerSpec,
    add_noise,
    ancestral_step,
    build_unet,
    ddim_step,
    ddim_timesteps,
    ddpm_loss,
    draw_noise,
    linear_schedule,
    predict_noise,
    sample,
    save_image_grid,
    to_diffusion_input,
    to_uint8,
)

torch.set_num_threads(1)


def tiny_unet(seed: int = 0, side: int = 8, timesteps: int = 10) -> torch.nn.Module:
    return build_unet("unet-small", 1, side, timesteps, seed=seed)


def test_linear_schedule_matches_diffusers_and_hand_values():
    from diffusers import DDPMScheduler

    ours = linear_schedule(500)
    theirs = DDPMScheduler(num_train_timesteps=500, beta_schedule="linear", beta_start=1e-4, beta_end=0.02)
    torch.testing.assert_close(ours.betas, theirs.betas, rtol=0, atol=0)
    torch.testing.assert_close(ours.alphas_cumprod, theirs.alphas_cumprod, rtol=0, atol=0)
    assert float(ours.betas[0]) == pytest.approx(1e-4) and float(ours.betas[-1]) == pytest.approx(0.02)
    # abar_1 = (1 - beta_0)(1 - beta_1), beta_1 = 1e-4 + (0.02 - 1e-4) / 499
    beta_1 = 1e-4 + (0.02 - 1e-4) / 499
    assert float(ours.alphas_cumprod[1]) == pytest.approx((1 - 1e-4) * (1 - beta_1), rel=1e-6)


def test_add_noise_matches_diffusers():
    from diffusers import DDPMScheduler

    schedule = linear_schedule(100)
    theirs = DDPMScheduler(num_train_timesteps=100)
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.rand(5, 1, 4, 4, generator=g) * 2 - 1, torch.randn(5, 1, 4, 4, generator=g)
    t = torch.tensor([0, 10, 50, 98, 99])
    torch.testing.assert_close(add_noise(schedule, x0, noise, t), theirs.add_noise(x0, noise, t))


def test_one_training_step_matches_the_diffusers_training_loop():
    """Our loss and Adam step equal the diffusers example's step (same seed, same draw order)."""
    from diffusers import DDPMScheduler

    x0 = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(3)) * 2 - 1
    ours, theirs = tiny_unet(), tiny_unet()
    loss_fn = DDPMLoss(linear_schedule(10), torch.Generator().manual_seed(7))
    opt = torch.optim.Adam(ours.parameters(), lr=1e-3)
    loss = loss_fn(ours, x0, None)
    loss.backward()
    opt.step()

    scheduler = DDPMScheduler(num_train_timesteps=10)
    g = torch.Generator().manual_seed(7)
    noise = torch.randn(x0.shape, generator=g)
    timesteps = torch.randint(0, 10, (x0.shape[0],), generator=g)
    noisy = scheduler.add_noise(x0, noise, timesteps)
    ref_opt = torch.optim.Adam(theirs.parameters(), lr=1e-3)
    ref_loss = torch.nn.functional.mse_loss(theirs(noisy, timesteps).sample, noise)
    ref_loss.backward()
    ref_opt.step()

    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7, msg=name)


def test_loss_reuses_the_draw_for_the_same_batch_only():
    """SAM evaluates the loss twice on one batch: both see the same (eps, t); a new batch gets new ones."""
    model = tiny_unet()
    loss_fn = DDPMLoss(linear_schedule(10), torch.Generator().manual_seed(0))
    xb = torch.zeros(4, 1, 8, 8)
    with torch.no_grad():
        first, again = loss_fn(model, xb), loss_fn(model, xb)
        other = loss_fn(model, xb.clone())
    assert float(first) == float(again)
    assert float(other) != float(first)


def test_ddpm_loss_is_zero_for_a_perfect_noise_predictor():
    class Oracle(torch.nn.Module):
        """Knows x_0 = 0, so eps = x_t / sqrt(1 - abar_t)."""

        def __init__(self, schedule):
            super().__init__()
            self.schedule = schedule

        def forward(self, x, t, return_dict=False):
            abar = self.schedule.alphas_cumprod[t].reshape(-1, 1, 1, 1)
            return (x / (1 - abar).sqrt(),)

    schedule = linear_schedule(50)
    x0 = torch.zeros(3, 1, 4, 4)
    noise, t = draw_noise(x0, 50, torch.Generator().manual_seed(0))
    assert float(ddpm_loss(Oracle(schedule), schedule, x0, noise, t)) == pytest.approx(0.0, abs=1e-10)


def test_ancestral_steps_match_diffusers_ddpm_scheduler():
    from diffusers import DDPMScheduler

    T = 10
    schedule = linear_schedule(T)
    scheduler = DDPMScheduler(num_train_timesteps=T)
    scheduler.set_timesteps(T)
    model = tiny_unet()
    x_ours = x_theirs = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    g_ours, g_theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    with torch.no_grad():
        for t in scheduler.timesteps.tolist():
            tt = torch.full((2,), t)
            eps = predict_noise(model, x_ours, tt)
            noise = torch.randn(x_ours.shape, generator=g_ours) if t > 0 else None
            x_ours = ancestral_step(schedule, x_ours, eps, t, noise)
            x_theirs = scheduler.step(predict_noise(model, x_theirs, tt), t, x_theirs, generator=g_theirs).prev_sample
            torch.testing.assert_close(x_ours, x_theirs, rtol=1e-5, atol=1e-5)


def test_ddim_steps_match_diffusers_ddim_scheduler():
    from diffusers import DDIMScheduler

    T, steps = 20, 5
    assert ddim_timesteps(T, steps) == [19, 15, 11, 7, 3]
    schedule = linear_schedule(T)
    scheduler = DDIMScheduler(num_train_timesteps=T, timestep_spacing="trailing")
    scheduler.set_timesteps(steps)
    assert scheduler.timesteps.tolist() == ddim_timesteps(T, steps)
    model = tiny_unet(timesteps=T)
    x_ours = x_theirs = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for t in scheduler.timesteps.tolist():
            tt = torch.full((2,), t)
            x_ours = ddim_step(schedule, x_ours, predict_noise(model, x_ours, tt), t, t - T // steps)
            x_theirs = scheduler.step(predict_noise(model, x_theirs, tt), t, x_theirs, eta=0.0).prev_sample
            torch.testing.assert_close(x_ours, x_theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["ddpm", "ddim"])
def test_sampler_gives_shape_range_and_is_seeded(kind):
    model = tiny_unet()
    spec = SamplerSpec(kind, timesteps=10, ddim_steps=5)
    a = sample(model, spec, 5, (1, 8, 8), torch.Generator().manual_seed(0), torch.device("cpu"), batch_size=3)
    b = sample(model, spec, 5, (1, 8, 8), torch.Generator().manual_seed(0), torch.device("cpu"), batch_size=3)
    assert a.shape == (5, 1, 8, 8) and a.dtype == np.float32
    assert a.min() >= -1.0 and a.max() <= 1.0 and a.std() > 0
    np.testing.assert_array_equal(a, b)
    assert model.training  # sampling restores the mode it found
    assert spec.label == ("ddim-5-of-T10" if kind == "ddim" else "ddpm-ancestral-T10")


def test_unet_presets_build_and_refuse_bad_sides():
    assert UNET_PRESETS["unet-paper-mnist"].channels == (128, 128, 256)
    assert UNET_PRESETS["unet-paper-cifar"].timesteps == 1000
    model = build_unet("unet-small", 3, 16, 100, seed=0)
    same = build_unet("unet-small", 3, 16, 100, seed=0)
    out = predict_noise(model, torch.zeros(2, 3, 16, 16), torch.tensor([0, 5]))
    assert out.shape == (2, 3, 16, 16)
    for p, q in zip(model.parameters(), same.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="divisible by 4"):
        build_unet("unet-paper-mnist", 1, 30, 500)


def test_diffusion_input_range_resize_and_round_trip(tmp_path):
    images = np.array([[[[0], [255]], [[128], [64]]]], dtype=np.uint8)  # (1, 2, 2, 1)
    x = to_diffusion_input(images, 2)
    np.testing.assert_allclose(x[0, 0], [[-1.0, 1.0], [128 / 127.5 - 1, 64 / 127.5 - 1]], atol=1e-6)
    np.testing.assert_array_equal(to_uint8(x), images)
    big = np.full((3, 28, 28, 1), 255, dtype=np.uint8)
    small = to_diffusion_input(big, 16)
    assert small.shape == (3, 1, 16, 16)
    np.testing.assert_allclose(small, 1.0, atol=1e-5)
    path = save_image_grid(x.repeat(5, axis=0), tmp_path / "grid.png", columns=4, scale=1)
    from PIL import Image

    assert Image.open(path).size == (4 * 3 + 1, 2 * 3 + 1)
