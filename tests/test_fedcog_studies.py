"""The FedCOG study files: their generation settings are the paper's unless the file says otherwise.

Parses `studies/fedcog-*.toml` and checks every run they describe (base, then
variant, then arm overrides) against the paper's setup (Ye et al., 2024,
section 6.1 and appendix A.2, Table 10), and that every run config is one the
app accepts.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from common.run.config import parse_run_config
from common.algorithm_table import COG_BASES
from server_app.registry import SERVER_STRATEGIES

STUDIES = Path(__file__).resolve().parents[1] / "studies"
FILES = sorted(STUDIES.glob("fedcog*.toml"))

# The paper's FedCOG setting, read off the paper (run-config keys).
PAPER_GENERATION = {"gen-steps": 100, "gen-budget": 256, "gen-lr": 0.01, "lambda-dis": 0.1}
PAPER_TRAINING = {"model": "cnn", "lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "batch-size": 64,
                  "dataset": "fashion-mnist"}
PAPER_BASELINES = {"server-momentum": 0.1, "proximal-mu": 0.01, "moon-mu": 0.01}
PAPER_ROUNDS, PAPER_COG_START, PAPER_LOCAL_STEPS = 70, 51, 400


def load(path: Path) -> dict:
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def runs(study: dict) -> dict[str, dict]:
    """Every run config of a study, `arm@variant` -> merged keys (without `paper`)."""
    variants = study.get("variants") or {"": {}}
    merged = {}
    for arm, keys in study["arms"].items():
        overrides = {k: v for k, v in keys.items() if k not in ("paper", "grid")}
        for variant, variant_keys in variants.items():
            merged[f"{arm}@{variant}" if variant else arm] = {**study["base"], **variant_keys, **overrides}
    return merged


def said_otherwise(study: dict, key: str, value: object) -> bool:
    """The study's description names the key, or the reduction 'paper -> value' of a setting."""
    text = study["study"]["description"]
    return key in text or bool(re.search(rf"->\s*{re.escape(str(value))}\b", text))


def test_there_are_the_three_fedcog_studies() -> None:
    assert {p.name for p in FILES} >= {"fedcog-cpu.toml", "fedcog-ablation-cpu.toml", "fedcog-paper.toml"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_generation_and_training_are_the_papers_unless_the_study_says_otherwise(path: Path) -> None:
    study = load(path)
    for name, raw in runs(study).items():
        for key, value in {**PAPER_GENERATION, **PAPER_TRAINING}.items():
            assert raw.get(key) == value or said_otherwise(study, key, raw.get(key)), (path.name, name, key)
        for key, value in PAPER_BASELINES.items():
            if key in raw:
                assert raw[key] == value, (path.name, name, key)
        # the paper's 50:20 ratio of base to FedCOG rounds, unless said otherwise
        rounds, start = raw["num-server-rounds"], raw["cog-start-round"]
        assert round(70 * (start - 1) / rounds) == 50, (path.name, name)
        for key, paper in (("num-server-rounds", PAPER_ROUNDS), ("local-steps", PAPER_LOCAL_STEPS)):
            assert raw[key] == paper or said_otherwise(study, key, raw[key]), (path.name, name, key)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_run_config_is_valid_and_scores_fedcog_rounds_only(path: Path) -> None:
    study = load(path)
    for name, raw in runs(study).items():
        cfg = parse_run_config(raw, SERVER_STRATEGIES)
        assert cfg.eval_every == 1, name
        # the last-k window lies inside the FedCOG rounds
        assert cfg.num_server_rounds - study["study"]["last-k"] + 1 >= cfg.cog_start_round, name
    assert set(study["study"]["report-seeds"]).isdisjoint(study["study"]["tuning-seeds"])


def test_cpu_study_has_every_base_with_and_without_cog_and_a_claim_each() -> None:
    study = load(STUDIES / "fedcog-cpu.toml")
    assert set(study["arms"]) == set(COG_BASES) | {f"{b}+cog" for b in COG_BASES}
    assert [c["claim"] for c in study["claims"]] == [f"{b}+cog > {b}" for b in COG_BASES]
    # X and X+cog differ only in the plug-in, so that the paired claim compares FedCOG alone
    for base in COG_BASES:
        plain = {k: v for k, v in study["arms"][base].items() if k not in ("algorithm", "paper")}
        cog = {k: v for k, v in study["arms"][f"{base}+cog"].items() if k not in ("algorithm", "paper")}
        assert plain == cog, base
        assert study["arms"][f"{base}+cog"]["algorithm"] == f"{base}+cog"
    assert study["variants"]["niid1"] == {"partition": "dirichlet", "alpha": 0.1}
    assert study["variants"]["niid2"] == {"partition": "pairs", "classes-per-client": 2}
    assert len(study["study"]["report-seeds"]) >= 3
    # Table 1's Fashion-MNIST column beside the bases and FedAvg+FedCOG
    assert study["arms"]["fedavg+cog"]["paper"] == {"niid1": 77.34, "niid2": 73.68}
    assert study["arms"]["scaffold"]["paper"] == {"niid1": 77.02, "niid2": 58.47}


def test_paper_study_is_the_papers_size() -> None:
    study = load(STUDIES / "fedcog-paper.toml")
    (raw,) = {k: v for k, v in runs(study).items() if k == "fedavg+cog"}.values()
    size = (raw["num-server-rounds"], raw["cog-start-round"], raw["local-steps"], raw["batch-size"])
    assert size == (70, 51, 400, 64)
    assert raw["partition"] == "pairs"
    assert len(study["study"]["report-seeds"]) >= 2


def test_ablation_study_has_table5s_four_rows() -> None:
    study = load(STUDIES / "fedcog-ablation-cpu.toml")
    ablations = {raw.get("cog-ablation", "none") for name, raw in runs(study).items() if "cog" in raw["algorithm"]}
    assert ablations == {"none", "noise", "global-only", "hard-label"}
