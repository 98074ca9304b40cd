"""The diffusion-task keys (issue 5): the DDPM's schedule and samplers, FID, and FedDDPM(+)'s server steps.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by the
diffusion task (common/models/diffusion.py; its functions take a protocol of the keys of several
parts they read), FID (common/metrics/fid.py, server_app/diffusion_eval.py) and FedDDPM(+)'s
strategy (server_app/strategies/fedddpm.py). Which algorithms and image sizes go with a U-Net, and
the auto FID extractor with partition = node, span parts: `RunConfig` settles them.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.keys import NODE, check_choice, check_text, key, require, same_key
from common.models.diffusion_names import FID_EXTRACTORS, SAMPLERS


FINAL_FID_SAMPLES_PER_ROUND = 500  # the final FID's images per round of the run, at most (`final_fid_count`)


def final_fid_count(final_fid_samples: int, fid_samples: int, num_server_rounds: int) -> int:
    """The images the final FID draws: `final-fid-samples`, at most FINAL_FID_SAMPLES_PER_ROUND per round of the
    run but never fewer than `fid-samples` (a round's FID); 0 stays 0 (no final score).

    A tiny FedDDPM run (2 rounds, 5 warm-up steps) once spent 600 s of its 900 s drawing 5,000 images for it.
    """
    if final_fid_samples == 0:
        return 0
    return min(final_fid_samples, max(fid_samples, FINAL_FID_SAMPLES_PER_ROUND * num_server_rounds))


def _check_warmup(settings: "DiffusionSettings | WarmupSettings") -> None:
    """The warm-up's length, of the run config's part or of the warm-up message (`WarmupSettings`)."""
    require(settings.warmup_epochs >= 1, "warmup-epochs", settings.warmup_epochs, "an integer >= 1")
    require(settings.warmup_steps >= 0, "warmup-steps", settings.warmup_steps,
            "an integer >= 0 (0: use warmup-epochs)")


# A bound on T far above the papers' 500 and 1000: the noise schedule holds T numbers, and a T of 10^12 made
# the strategy's constructor ask torch for 4 TB (benchmarks/results/hostile-probe.md).
MAX_DIFFUSION_TIMESTEPS = 100_000


@dataclass(frozen=True)
class DiffusionSettings:
    """The diffusion task: DDPM steps and samplers, FID, and FedDDPM(+)'s warmup, auxiliary set and QuickTest."""

    diffusion_timesteps: int = key(
        0, "Diffusion task: T, the number of DDPM steps (linear beta 1e-4 to 0.02); 0: the U-Net preset's "
        "(500 for unet-small and unet-paper-mnist, 1000 for unet-paper-cifar).", "FedDDPM: 500 MNIST, 1000 CIFAR",
    )
    sampler: str = key(
        "ddpm", "Diffusion task: sampler of the evaluation's images (FID, KID, grids, QuickTest): ddpm "
        "(ancestral, T steps) or ddim (eta 0, ddim-steps steps, for quick checks; results name the sampler).",
        "SPEC 4.4",
    )
    aux_sampler: str = key(
        "ddpm", "FedDDPM(+): sampler of the auxiliary set: ddpm (ancestral, the paper's) or ddim (ddim-steps steps).",
        "FedDDPM Alg. 1",
    )
    ddim_steps: int = key(50, "Diffusion task: steps of the ddim sampler.", "DDIM")
    fid_every: int = key(
        10, "Diffusion task: FID and a sample grid every this many rounds and after the last; 0: only after the "
        "last.", "SPEC 3.6",
    )
    fid_samples: int = key(1000, "Diffusion task: generated images per round's FID and KID (against the real "
                           "training split).", "SPEC 3.6")
    final_fid_samples: int = key(
        5000, "Diffusion task: generated images of the final model's final-fid, final-kid and class histogram "
        f"(mode coverage), at most {FINAL_FID_SAMPLES_PER_ROUND} per round of the run (but never fewer than "
        "fid-samples), so that a tiny run does not spend most of its time on its final score (a 2-round run draws "
        "1,000; runs of 10 rounds or more draw all 5,000); 0: none.",
    )
    fid_features: str = key(
        "auto", "FID feature extractor: classifier (small CNN trained on the server's copy of the training split, "
        "cached on disk, offline), random (the same CNN untrained, from a fixed seed: needs no data; its FIDs "
        "compare only with its own) or inception (Inception-v3, local weights only, on every host with partition = "
        "node); auto: random with partition = node (the server holds no images), else classifier.", "SPEC 3.6",
    )
    warmup_epochs: int = key(
        200, "FedDDPM(+): epochs each node trains its own DDPM before round 1 (uploaded once).",
        "FedDDPM: 200 MNIST, 400 CIFAR-10, 600 CIFAR-100", side=NODE,
    )
    warmup_steps: int = key(0, "FedDDPM(+): warmup length in local steps instead of epochs; 0: use warmup-epochs.",
                            "CPU presets", side=NODE)
    warmup_timeout: float = key(7200.0, "FedDDPM(+): seconds to wait for the nodes' warm models.")
    aux_fraction: float = key(
        0.1, "FedDDPM(+): the server samples aux-fraction * m_i images from node i's warm model (kept on the "
        "server only).", "FedDDPM: 0.1",
    )
    correction_epochs: int = key(
        1, "FedDDPM: server epochs E on the auxiliary set after every aggregation.", "FedDDPM: 1 MNIST, 5 CIFAR"
    )
    correction_lr: float = key(5e-5, "FedDDPM: learning rate eta of the server's epochs on the auxiliary set after "
                               "every aggregation (FedDDPM+'s one-shot uses oneshot-lr).",
                               "FedDDPM: 5e-5")
    oneshot_epochs: int = key(20, "FedDDPM+: epochs of the one-shot correction on the auxiliary set.",
                              "FedDDPM+: 20 MNIST, 30 CIFAR")
    oneshot_lr: float = key(
        0.0, "FedDDPM+: learning rate of the one-shot correction; 0: the clients' lr (zeta).", "FedDDPM Alg. 2"
    )
    quicktest_every: int = key(
        10, "FedDDPM+: QuickTest at t = 0, every, 2*every, ... (t = round - 1: rounds 1, 11, 21 with 10); 0: never "
        "(correct after the last).", "FedDDPM+ Alg. 3: t mod 10 = 0",
    )
    quicktest_size: int = key(500, "FedDDPM+: samples scored by each QuickTest (FID against the auxiliary set).",
                              "FedDDPM+: 500")
    quicktest_gamma: float = key(0.4, "FedDDPM+: EMA weight gamma of the newest QuickTest score.", "FedDDPM+: 0.4")
    quicktest_threshold: float = key(
        0.2, "FedDDPM+: stop when abs(EMA - score) <= threshold (in FID units of fid-features).", "FedDDPM+: 0.2"
    )
    quicktest_reference: str = key(
        "auxiliary", "FedDDPM+: QuickTest's reference statistics, none from real data at the server: auxiliary "
        "(the auxiliary set's features) or clients (the nodes' pooled feature sums, asked for once).", "SPEC 4.4",
    )

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, DiffusionSettings)
        require(self.diffusion_timesteps == 0 or 2 <= self.diffusion_timesteps <= MAX_DIFFUSION_TIMESTEPS,
                "diffusion-timesteps", self.diffusion_timesteps,
                f"0 (the U-Net preset's) or an integer in 2..{MAX_DIFFUSION_TIMESTEPS}")
        check_choice("sampler", self.sampler, SAMPLERS)
        check_choice("aux-sampler", self.aux_sampler, SAMPLERS)
        require(self.ddim_steps >= 1, "ddim-steps", self.ddim_steps, "an integer >= 1")
        require(self.fid_every >= 0, "fid-every", self.fid_every, "an integer >= 0 (0: only after the last round)")
        require(self.fid_samples >= 2, "fid-samples", self.fid_samples, "an integer >= 2")
        require(self.final_fid_samples == 0 or self.final_fid_samples >= 2, "final-fid-samples",
                self.final_fid_samples, "0 (none) or an integer >= 2")
        check_choice("fid-features", self.fid_features, FID_EXTRACTORS)
        _check_warmup(self)
        require(self.warmup_timeout > 0, "warmup-timeout", self.warmup_timeout, "seconds > 0")
        require(0 < self.aux_fraction <= 1, "aux-fraction", self.aux_fraction, "a fraction in (0, 1]")
        require(self.correction_epochs >= 0, "correction-epochs", self.correction_epochs, "an integer >= 0")
        require(self.correction_lr > 0, "correction-lr", self.correction_lr, "a number > 0")
        require(self.oneshot_epochs >= 0, "oneshot-epochs", self.oneshot_epochs, "an integer >= 0")
        require(self.oneshot_lr >= 0, "oneshot-lr", self.oneshot_lr, "a number >= 0 (0: the clients' lr)")
        require(self.quicktest_every >= 0, "quicktest-every", self.quicktest_every, "an integer >= 0 (0: never)")
        require(self.quicktest_size >= 2, "quicktest-size", self.quicktest_size, "an integer >= 2")
        require(0 < self.quicktest_gamma <= 1, "quicktest-gamma", self.quicktest_gamma, "a number in (0, 1]")
        require(self.quicktest_threshold >= 0, "quicktest-threshold", self.quicktest_threshold, "a number >= 0")
        check_choice("quicktest-reference", self.quicktest_reference, ("auxiliary", "clients"))


@dataclass(frozen=True)
class WarmupSettings:
    """FedDDPM(+)'s warm-up message: how long each node trains its own DDPM before round 1, the part's `NODE` keys.

    The server puts them in the warm-up's train config (server_app/strategies/fedddpm_warmup.py, `message_config`)
    and the node reads them back (common/run/client_settings.py `rule_settings`), each checked as the run config
    checks its key."""

    warmup_epochs: int = same_key(DiffusionSettings, "warmup_epochs")
    warmup_steps: int = same_key(DiffusionSettings, "warmup_steps")

    def check(self) -> None:
        """The warm-up's length is checked as the run config checks its keys."""
        _check_warmup(self)
