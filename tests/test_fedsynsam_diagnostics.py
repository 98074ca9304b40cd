"""FedSynSAM's diagnostics: the real-image oracle D_syn (not the method) and the per-step median statistics."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import client_app.rules as rules
import fedsynth.client as fc
from common.run.config import ConfigError, RunConfig, parse_run_config
from common.data.datasets import load_dataset
from common.metrics.evaluation import as_tensors
from common.records import model_weights
from common.algorithms.synsam import step_statistics
from fedsynth.study.ledger import Ledger
from fedsynth.study.plan import plan
from fedsynth.study.cli import run_config_check
from fedsynth.study.reuse import reusable
from fedsynth.study.studyfile import load_study
from common.algorithms.synsam_settings import SynSAMSettings
from server_app.distillation import (
    mean_matching_loss, oracle_indices, real_oracle, split_weights, uniform_labels,
)
from server_app.registry import SERVER_STRATEGIES
from tests.test_inprocess_runs import base_config, run_inprocess

# ----- the per-step statistics -------------------------------------------------------------


def test_step_statistics_hand_values():
    """The ratio's median is not moved by one step whose local gradient vanished; share and cosine as described."""
    stats = {"norm-ratio": [1.0, 2.0, 1e9], "share": [0.1, 0.2, 0.9], "cos": [-1.0, 0.0, 0.5]}
    out = step_statistics(stats)
    assert out == pytest.approx({"synsam-norm-ratio-median": 2.0, "synsam-share-median": 0.2,
                                 "synsam-share": 0.4, "synsam-cos": -0.5 / 3})
    assert step_statistics({"norm-ratio": [4.0, 1.0], "share": [], "cos": []}) == {"synsam-norm-ratio-median": 2.5}
    assert step_statistics({"norm-ratio": [], "share": [], "cos": []}) == {}


def test_train_fedsynsam_reports_the_median_ratio_of_its_steps(monkeypatch):
    """4 local steps whose ratios are 1, 1e9, 3, 2: the client reports 2.5 (their median), not 2.5e8 (their mean)."""
    ratios = itertools.cycle([1.0, 1e9, 3.0, 2.0])
    monkeypatch.setattr(rules, "norm_ratio", lambda local, synthetic: next(ratios))
    gen = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(20, 4, generator=gen), torch.randint(0, 3, (20,), generator=gen)),
                        batch_size=5, shuffle=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    result = fc.train_fedsynsam(model, loader, synthetic_x=torch.randn(6, 4, generator=gen),
                                synthetic_y=torch.tensor([0, 1, 2, 0, 1, 2]), rho=0.1, beta=0.9,
                                synthetic_batch_size=3, optimizer=fc.LocalOptimizer(lr=0.1))
    assert result.num_steps == 4
    assert result.metrics["synsam-norm-ratio-median"] == pytest.approx(2.5)
    assert "synsam-norm-ratio" not in result.metrics  # the old step mean is gone
    assert 0 < result.metrics["synsam-share-median"] <= 1 and 0 < result.metrics["synsam-share"] <= 1


# ----- the real-image oracle --------------------------------------------------------------


def test_oracle_indices_draw_ipc_of_every_class_class_major_and_seeded():
    labels = np.array([2, 0, 1, 1, 0, 2, 2, 0, 1, 0, 2, 1, 0, 1, 2])  # 5 of each class
    index = oracle_indices(labels, num_classes=3, ipc=2, seed=7)
    assert index.dtype == np.int64 and len(set(index.tolist())) == 6
    np.testing.assert_array_equal(labels[index], uniform_labels(3, 2))  # class-major, as distilled sets are
    np.testing.assert_array_equal(index, oracle_indices(labels, 3, 2, seed=7))
    draws = {tuple(oracle_indices(labels, 3, 2, seed=s)) for s in range(10)}
    assert len(draws) > 1  # the seed chooses the images
    np.testing.assert_array_equal(np.sort(oracle_indices(labels, 3, 5, seed=0)), np.arange(15))  # all of them
    with pytest.raises(ValueError, match="class 0 has 5 training examples, fewer than synthetic-ipc = 6"):
        oracle_indices(labels, 3, 6, seed=0)


def test_real_oracle_keeps_the_images_learns_nothing_and_reports_their_matching_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    trajectory = []
    for step in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * step)
        trajectory.append(model_weights(model))
    x = np.random.default_rng(0).standard_normal((6, 1, 3, 4)).astype(np.float32)
    y = uniform_labels(3, 2)
    settings = SynSAMSettings(synthetic_ipc=2, distill_inner_steps=2, distill_alpha_init=0.05)
    result = real_oracle(model, trajectory, x, y, settings, torch.device("cpu"))
    np.testing.assert_array_equal(result.x, x)
    np.testing.assert_array_equal(result.y, y)
    assert result.alpha == 0.05 and result.losses == []
    tensors = [split_weights(model, w, torch.device("cpu")) for w in trajectory]
    expected = mean_matching_loss(model, tensors, torch.from_numpy(x), torch.from_numpy(y), torch.tensor(0.05), 2)
    assert result.start_loss == result.end_loss == pytest.approx(expected)
    assert 0 < expected < 10


def test_synthetic_source_is_checked_by_name():
    assert RunConfig().synthetic_source == "distilled"
    assert parse_run_config({"synthetic-source": "real-oracle"}, SERVER_STRATEGIES).synthetic_source == "real-oracle"
    with pytest.raises(ConfigError, match="'synthetic-source'"):
        parse_run_config({"synthetic-source": "real"}, SERVER_STRATEGIES)


def test_real_oracle_is_refused_where_the_server_has_no_dataset():
    with pytest.raises(ConfigError, match="'synthetic-source'.*partition = node"):
        parse_run_config({"synthetic-source": "real-oracle", "partition": "node", "dataset": "own",
                          "image-channels": 1, "image-size": 28, "num-classes": 10}, SERVER_STRATEGIES)


def test_a_fedsynsam_run_with_the_oracle_sends_real_training_images(tmp_path, tiny_data_dir):
    """From the outside: after round R every node holds D_syn = 2 real training images per class, seeded."""
    raw = base_config(tmp_path, tiny_data_dir, **{
        "algorithm": "fedsynsam", "model": "mlp", "num-server-rounds": 2, "trajectory-rounds": 1,
        "synthetic-ipc": 2, "synthetic-source": "real-oracle", "central-eval": False, "seed": 3,
    })
    _, results, strategy, _ = run_inprocess(raw, 3)
    arrays = load_dataset("fashion-mnist", tiny_data_dir)
    index = oracle_indices(arrays.y_train, 10, 2, seed=3)
    x, y = as_tensors(arrays.x_train[index], arrays.y_train[index], "fashion-mnist", torch.device("cpu"))
    np.testing.assert_array_equal(strategy.synthetic[0], x.numpy())
    np.testing.assert_array_equal(strategy.synthetic[1], uniform_labels(10, 2))
    np.testing.assert_array_equal(y.numpy(), uniform_labels(10, 2))
    report = results.rounds[0]  # round R = 1: D_syn taken
    assert report["distill-alpha"] == 0.01 and report["distill-loss-start"] == report["distill-loss-end"]
    assert report["synthetic-examples"] == 20
    assert strategy.synthetic_holders == {0, 1, 2}
    assert results.rounds[1]["stat-synsam-norm-ratio-median"] > 0  # round 2: the nodes train with it


# ----- the study -----------------------------------------------------------------------------


def test_the_why_study_no_longer_reuses_the_lr_studys_runs_of_an_unrecorded_rule(tmp_path):
    """fedsynsam-bucket-lr's ledger was made before provenance: the server rule its runs ran under is not recorded
    (the defaults changed twice while these studies ran), so --reuse refuses them rather than mixing rules."""
    from fedsynth.study.reuse import ReuseRefused

    root = Path(__file__).resolve().parents[1]
    study = load_study(root / "studies" / "fedsynsam-bucket-why.toml", run_config_check(root))
    source = Ledger(root / "benchmarks" / "results" / "studies" / "fedsynsam-bucket-lr" / "ledger.jsonl")
    _, report, _ = plan(study, Ledger(tmp_path / "ledger.jsonl"))
    with pytest.raises(ReuseRefused, match="effective config"):
        reusable(study, report, Ledger(tmp_path / "ledger.jsonl"), [source])


def test_step_stats_script_summarises_the_rounds_after_d_syn():
    from tests.conftest import load_benchmark

    script = load_benchmark("synsam_step_stats")
    rounds = [{"round": 1}, {"round": 2, "k": 10.0}, {"round": 4, "k": 1e6}, {"round": 3, "k": 2.0}]
    assert script.summarise(rounds, "k", last_k=2) == (10.0, (2.0 + 1e6) / 2)  # rounds 3 and 4 are the last two
    assert np.isnan(script.summarise(rounds, "absent", last_k=2)[0])
