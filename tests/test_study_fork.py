"""benchmarks/study_fork.py: X runs start from X+cog's checkpoints of the shared rounds, and nothing else forks."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.records import model_weights
from common.run.task import make_model
from fedsynth.study.studyfile import parse_study
from server_app.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def forks():
    return load_benchmark("study_fork")


def _study(**base):
    raw = {"study": {"report-seeds": [0, 1], "tuning-seeds": []},
           "base": {"model": "mlp", "num-server-rounds": 5, "cog-start-round": 3, **base},
           "arms": {"fedavg": {"algorithm": "fedavg"}, "fedavg+cog": {"algorithm": "fedavg+cog"},
                    "fedprox+cog": {"algorithm": "fedprox+cog"}},
           "claims": ["fedavg+cog > fedavg"]}
    return parse_study(raw, Path("s.toml"))


def _checkpoint(forks, study, runs_dir: Path, arm: str, seed: int, server_round: int) -> dict:
    spec = forks.runs_of(study, arm)[seed]
    cfg = forks.run_config(spec)
    weights = model_weights(make_model(cfg, seeded=True))
    metrics = [{"round": r, "central-accuracy": 0.1 * r + seed} for r in range(server_round + 1)]
    save_checkpoint(runs_dir / spec.folder_name, cfg, Checkpoint(server_round, weights, {}, {}, metrics))
    return weights


def test_keep_then_fork_gives_each_x_run_its_seeds_shared_rounds(tmp_path, forks):
    study, runs = _study(), tmp_path / "runs"
    weights = {seed: _checkpoint(forks, study, runs, "fedavg+cog", seed, 2) for seed in (0, 1)}
    kept = forks.keep(study, "fedavg+cog", runs, tmp_path / "kept", poll_seconds=0, write=lambda _: None)
    assert sorted(kept) == [0, 1]
    forks.fork(study, "fedavg+cog", "fedavg", runs, tmp_path / "kept", write=lambda _: None)
    for seed, spec in forks.runs_of(study, "fedavg").items():
        ckpt = load_checkpoint(runs / spec.folder_name, forks.run_config(spec), weights[seed])  # X's config accepts it
        assert ckpt.server_round == 2
        assert [m["central-accuracy"] for m in ckpt.metrics] == pytest.approx([seed, 0.1 + seed, 0.2 + seed])
    with pytest.raises(forks.ForkError, match="exists"):  # a second fork never overwrites a run
        forks.fork(study, "fedavg+cog", "fedavg", runs, tmp_path / "kept", write=lambda _: None)


def test_keep_refuses_a_checkpoint_already_past_the_shared_rounds(tmp_path, forks):
    study, runs = _study(), tmp_path / "runs"
    _checkpoint(forks, study, runs, "fedavg+cog", 0, 3)  # round 3 is FedCOG's first
    with pytest.raises(forks.ForkError, match="round 2 was not kept"):
        forks.keep(study, "fedavg+cog", runs, tmp_path / "kept", poll_seconds=0, write=lambda _: None)


def test_a_fork_that_would_not_replay_x_is_refused(forks):
    study = _study()
    cog, x, prox = (forks.run_config(forks.runs_of(study, arm)[0]) for arm in ("fedavg+cog", "fedavg", "fedprox+cog"))
    identity = cog.as_dict()
    forks.check_fork(cog, 2, identity, x)  # the shared rounds, only the algorithm differs: accepted
    with pytest.raises(forks.ForkError, match="after FedCOG started"):
        forks.check_fork(cog, 3, identity, x)
    with pytest.raises(forks.ForkError, match="only X\\+cog forks into X"):
        forks.check_fork(prox, 2, prox.as_dict(), x)
    with pytest.raises(forks.ForkError, match="lr"):
        forks.check_fork(cog, 2, {**identity, "lr": identity["lr"] * 2}, x)
