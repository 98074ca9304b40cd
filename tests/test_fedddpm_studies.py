"""The FedDDPM study files: every run config they make is valid, and their settings keep the paper's ratios."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from common.run.config import parse_run_config
from server_app.registry import SERVER_STRATEGIES
from server_app.strategies.fedddpm import auxiliary_count
from server_app.strategies.fedddpm_plus import quicktest_due

STUDIES = Path(__file__).resolve().parents[1] / "studies"
# The paper (MNIST): |A| = 0.1 * 60000, batch 128, E = 1 at eta 5e-5; clients 15 steps (600 images, batch 128,
# K = 3 epochs) at zeta 2e-4; one-shot 20 epochs at zeta.
PAPER_CORRECTION_RATIO = math.ceil(6000 / 128) * 1 * 5e-5 / (15 * 2e-4)
PAPER_ONESHOT_ROUNDS = 20 * math.ceil(6000 / 128) * 2e-4 / (15 * 2e-4)


def load(name: str) -> dict:
    with open(STUDIES / name, "rb") as handle:
        return tomllib.load(handle)


@pytest.mark.parametrize("name", ["fedddpm-cpu.toml", "fedddpm-gpu.toml", "fedddpm-paper.toml"])
def test_every_arm_and_variant_is_a_valid_run_config(name):
    study = load(name)
    variants = study.get("variants", {}) or {"": {}}
    for arm in study["arms"].values():
        overrides = {k: v for k, v in arm.items() if k not in ("grid", "paper")}
        for variant in variants.values():
            cfg = parse_run_config({**study["base"], **variant, **overrides}, SERVER_STRATEGIES)
            assert cfg.aux_sampler == "ddpm" and cfg.oneshot_rate() == cfg.lr  # the paper's sampler and rate
    assert study["study"]["tuning-metric"] == "fid"  # against the training split, never the test split
    claims = [c["claim"] for c in study["claims"]]
    baselines = [a for a in study["arms"] if not a.startswith("fedddpm")]
    for method in ("fedddpm", "fedddpm+"):
        assert {f"{method} < {b}" for b in baselines} <= set(claims)


@pytest.mark.parametrize("name, num_examples", [("fedddpm-cpu.toml", 60000), ("fedddpm-gpu.toml", 60000)])
def test_correction_strength_matches_the_papers(name, num_examples):
    """(server steps x eta) / (client steps x zeta) within 15 % of the paper's 0.78, and the one-shot within 15 %
    of the paper's 63 rounds' worth of client movement; QuickTest tests at least three times."""
    base = load(name)["base"]
    clients = load(name)["study"]["num-supernodes"]
    aux = clients * auxiliary_count(num_examples // clients, base["aux-fraction"])
    steps = math.ceil(aux / base["batch-size"])
    client_move = base["local-steps"] * base["lr"]
    ratio = steps * base["correction-epochs"] * base["correction-lr"] / client_move
    oneshot = base["oneshot-epochs"] * steps * base["lr"] / client_move
    assert PAPER_CORRECTION_RATIO == pytest.approx(0.78, abs=0.01)
    assert ratio == pytest.approx(PAPER_CORRECTION_RATIO, rel=0.15)
    assert oneshot == pytest.approx(PAPER_ONESHOT_ROUNDS, rel=0.15)
    assert sum(quicktest_due(r, base["quicktest-every"]) for r in range(1, base["num-server-rounds"] + 1)) >= 3
