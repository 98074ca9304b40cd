"""The smallest diffusion-task run config the tests use (8x8 images, T = 20, DDIM-5 samples; the auxiliary set
ancestral; FedDDPM+'s one-shot correction 1 epoch, not the default 20: tests that count its epochs set their own)."""

TINY_DIFFUSION = {
    "model": "unet-small", "image-size": 8, "diffusion-timesteps": 20, "lr": 1e-3, "aggregation": "uniform",
    "sampler": "ddim", "ddim-steps": 5, "fid-samples": 32, "final-fid-samples": 48, "fid-every": 0,
    "warmup-epochs": 1, "aux-fraction": 0.05, "quicktest-size": 16, "oneshot-epochs": 1,
}
