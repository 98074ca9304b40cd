"""FedSynSAM: trajectory distillation, the SAM-family client rules, D_syn delivery, DynaFed, the diagnostic."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from torch import nn

from client_app.sam_family import STATE_SYNTHETIC, fedsam_rule, fedsynsam_update, fixed_direction_rule, fedlesam_direction
from client_app.training import LocalJob, run_local_steps
from client_app.registry import CLIENT_UPDATES
from common.run.config import ConfigError, RunConfig, parse_run_config
from common.data.datasets import dataset_info
from common.protocol import PREVIOUS_UPDATE, SYNTHETIC_DATA
from common.records import model_weights, to_record
from common.run.task import make_model
from common.algorithms.synsam_settings import SynSAMSettings
from server_app.distillation import distill, matching_loss, split_weights, unroll
from common.run.results import read_metrics
from common.algorithms.synsam import mix_ascent, norm_ratio, synthetic_share
from server_app.perturbation import cosine
from server_app.registry import SERVER_STRATEGIES, train_config_of
from server_app.strategies.sam_baselines import feddyn_server_state, smoo_global_perturbation
from fedsynth.inprocess import InProcessGrid
from tests.test_inprocess_runs import base_config, run_inprocess


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).double()


# ----- distillation math -------------------------------------------------------------


def test_matching_loss_hand_values():
    start, target, w_hat = ({"a": torch.tensor(v)} for v in ([0.0, 0.0], [3.0, 4.0], [3.0, 0.0]))
    assert float(matching_loss(w_hat, start, target)) == pytest.approx(16 / 25)
    # eq. 9, unnormalised: ||(3, 0) - (3, 4)||^2 = 16 whatever the segment's length
    assert float(matching_loss(w_hat, start, target, normalized=False)) == pytest.approx(16.0)
    two = ({"a": torch.tensor(v[:1]), "b": torch.tensor(v[1:])} for v in ([1.0, 1.0, 0.0], [1.0, 3.0, 2.0],
                                                                          [2.0, 2.0, 1.0]))
    start2, target2, w_hat2 = two
    # all tensors together: (1 + 1 + 1) / (0 + 4 + 4)
    assert float(matching_loss(w_hat2, start2, target2)) == pytest.approx(3 / 8)
    assert float(matching_loss(w_hat2, start2, target2, normalized=False)) == pytest.approx(3.0)


def test_matching_loss_key_reaches_the_distillation_settings():
    assert RunConfig().normalized_matching is True
    assert RunConfig(matching_loss="paper").normalized_matching is False


def test_functional_unroll_equals_plain_gradient_descent():
    model = _tiny_model()
    x, y = torch.randn(6, 1, 3, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    params, buffers = split_weights(model, model_weights(model), torch.device("cpu"))
    w_hat = unroll(model, params, buffers, x, y, torch.tensor(0.1, dtype=torch.float64), steps=2)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(w_hat[name], p.detach(), atol=1e-12, rtol=0)


def test_matching_loss_is_differentiated_through_the_inner_steps():
    """d loss / d alpha from create_graph=True equals a central finite difference (float64)."""
    model = _tiny_model()
    x = torch.randn(5, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0, 1])
    params, buffers = split_weights(model, model_weights(model), torch.device("cpu"))
    target = {k: v + 0.05 * torch.randn_like(v) for k, v in params.items()}

    def loss_at(alpha: torch.Tensor) -> torch.Tensor:
        return matching_loss(unroll(model, params, buffers, x, y, alpha, steps=3), params, target)

    alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    loss_at(alpha).backward()
    eps = 1e-6
    numeric = (loss_at(torch.tensor(0.3 + eps, dtype=torch.float64)) - loss_at(torch.tensor(0.3 - eps, dtype=torch.float64))) / (2 * eps)
    assert float(alpha.grad) == pytest.approx(float(numeric.detach()), rel=1e-5)
    assert float(x.grad.abs().sum()) > 0  # the images get a gradient too


def _random_walk(model: nn.Module, length: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    start = model_weights(model)
    return [{k: (v + 0.01 * i * rng.standard_normal(v.shape)).astype(np.float32) for k, v in start.items()}
            for i in range(length)]


@pytest.mark.parametrize("name", ["mlp", "cnn", "convnet"])
def test_distillation_works_for_each_model(name):
    cfg = RunConfig(model=name)
    info = dataset_info(cfg.dataset)
    model = make_model(cfg, seeded=True)
    settings = SynSAMSettings(synthetic_ipc=1, distill_iterations=2, distill_inner_steps=2)
    result = distill(make_model(cfg), _random_walk(model, 3, 0), info.num_classes, info.shape, settings, torch.device("cpu"))
    assert result.x.shape == (10, 1, 28, 28) and result.x.dtype == np.float32 and np.isfinite(result.x).all()
    assert result.y.tolist() == list(range(10)) and len(result.losses) == 2 and np.isfinite(result.start_loss)


def _gd_trajectory(model: nn.Module, rounds: int, steps: int, lr: float) -> list[dict[str, np.ndarray]]:
    """Global models of `rounds` rounds of `steps` full-batch GD steps on a small fixed 4-class set of 4x4 images."""
    generator = torch.Generator().manual_seed(0)
    prototypes = torch.randn(4, 1, 4, 4, generator=generator)
    y = torch.arange(4).repeat_interleave(10)
    x = prototypes[y] + 0.5 * torch.randn(len(y), 1, 4, 4, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trajectory = [model_weights(model)]
    for _ in range(rounds):
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        trajectory.append(model_weights(model))
    return trajectory


def test_distillation_reduces_the_matching_loss_well_below_its_start():
    """On a clean (uncompressed) trajectory, 100 iterations with the paper's grey-image settings
    (Adam 0.05, alpha 0.01, alpha lr 1e-5, s = 3) must bring the mean matching loss over all segments
    to half of its start or below (it reaches ~0.24 of ~1.0)."""
    def small() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    trajectory = _gd_trajectory(small(), rounds=6, steps=5, lr=0.02)
    settings = SynSAMSettings(synthetic_ipc=3, distill_iterations=100, distill_inner_steps=3, distill_optimizer="adam",
                              distill_lr=0.05, distill_alpha_init=0.01, distill_alpha_lr=1e-5)
    result = distill(small(), trajectory, 4, (1, 4, 4), settings, torch.device("cpu"))
    assert result.start_loss > 0.95  # noise images with a small alpha hardly move: a loss of about 1
    assert result.end_loss < 0.5 * result.start_loss
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:10])  # the sampled segments' loss falls too
    assert result.alpha > settings.distill_alpha_init  # the step size learns to grow towards the trajectory's


def test_distillation_matches_a_real_federated_trajectory(tmp_path, tiny_data_dir):
    """The global models of 6 FedSAM rounds: the matching loss over all segments falls well below its start."""
    raw = base_config(tmp_path, tiny_data_dir, **{
        "algorithm": "fedsynsam", "model": "mlp", "num-server-rounds": 6, "trajectory-rounds": 6,
        "distill-iterations": 40, "synthetic-ipc": 2, "central-eval": False,
    })
    _, _, strategy, _ = run_inprocess(raw, 3)
    report = strategy.distill_report
    assert len(strategy.trajectory) == 7 and strategy.synthetic[0].shape == (20, 1, 28, 28)
    assert report["distill-loss-start"] > 0.95  # not moving at all is a loss of 1
    assert report["distill-loss-end"] < 0.85 * report["distill-loss-start"]


def test_distill_settings_follow_the_paper_by_dataset():
    grey = SynSAMSettings().distillation_resolved(grey=True)
    colour = SynSAMSettings().distillation_resolved(grey=False)
    assert (grey.distill_inner_steps, grey.distill_optimizer, grey.distill_lr) == (3, "adam", 0.05)
    assert (colour.distill_inner_steps, colour.distill_optimizer, colour.distill_lr) == (5, "sgd", 1000.0)
    given = SynSAMSettings(distill_inner_steps=2, distill_optimizer="adam", distill_lr=0.1).distillation_resolved(False)
    assert (given.distill_inner_steps, given.distill_optimizer, given.distill_lr) == (2, "adam", 0.1)
    assert (grey.synthetic_ipc, grey.distill_iterations, grey.distill_alpha_init, grey.distill_alpha_lr) == (
        20, 200, 0.01, 1e-5)


# ----- client rules ------------------------------------------------------------------


def _job(cfg: RunConfig, incoming: RecordDict | None = None, state: RecordDict | None = None, n: int = 40) -> LocalJob:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (n,), generator=generator)
    incoming = RecordDict() if incoming is None else incoming
    # what the app's strategy sends in round 2 (a config without an algorithm: FedSynSAM's, which sends every
    # setting of the SAM rules here: sam-rho, synsam-beta, synsam-mix)
    sender = cfg if cfg.algorithm != "fedavg" else dataclasses.replace(cfg, algorithm="fedsynsam")
    incoming["config"] = ConfigRecord(train_config_of(sender, 2))
    return LocalJob(cfg=cfg, server_round=2, partition_id=0, model=make_model(cfg, seeded=True), x=x, y=y,
                    device=torch.device("cpu"), incoming=incoming, state=RecordDict() if state is None else state)


def test_fedlesam_perturbs_along_the_negated_previous_update_with_one_global_norm():
    cfg = RunConfig(model="mlp", sam_rho=0.5, local_steps=1, batch_size=8)
    model = make_model(cfg, seeded=True)
    rng = np.random.default_rng(3)
    # tensors of very different norms: a per-tensor normalisation would move each by rho
    update = {name: (rng.standard_normal(p.shape) * (100.0 if i == 0 else 0.01)).astype(np.float32)
              for i, (name, p) in enumerate(model.named_parameters())}
    job = _job(cfg, RecordDict({PREVIOUS_UPDATE: to_record(update)}))
    start = {name: p.detach().clone() for name, p in job.model.named_parameters()}
    seen = {}

    def spy(model, xb, yb):
        seen.update({name: p.detach().clone() for name, p in model.named_parameters()})
        return nn.functional.cross_entropy(model(xb), yb)

    job.loss_fn = spy
    fixed_direction_rule(job, fedlesam_direction(job))(job.x[:8], job.y[:8])
    norm = np.sqrt(sum(float(np.sum(u.astype(np.float64) ** 2)) for u in update.values()))
    for name, u in update.items():
        expected = start[name] - 0.5 * torch.from_numpy(u) / norm
        torch.testing.assert_close(seen[name], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(job.model.state_dict()[name], start[name])  # w restored after the step


def test_fedlesam_round_one_is_plain_sgd():
    cfg = RunConfig(model="mlp", local_steps=3, batch_size=8)
    lesam, plain = _job(cfg), _job(cfg)
    run_local_steps(lesam, fixed_direction_rule(lesam, fedlesam_direction(lesam)))
    from client_app.training import plain_rule

    run_local_steps(plain, plain_rule(plain))
    for a, b in zip(lesam.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _synthetic(n_per_class: int = 2) -> RecordDict:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((10 * n_per_class, 1, 28, 28)).astype(np.float32)
    y = np.repeat(np.arange(10, dtype=np.int64), n_per_class)
    return RecordDict({SYNTHETIC_DATA: to_record({"x": x, "y": y})})


def test_fedsynsam_is_fedsam_with_beta_one_or_without_synthetic_data():
    cfg = RunConfig(model="mlp", local_steps=4, batch_size=8, sam_rho=0.1, synsam_beta=1.0)
    reference = _job(cfg)
    run_local_steps(reference, fedsam_rule(reference))
    for incoming in (RecordDict(), _synthetic()):
        job = _job(cfg, incoming)
        result = fedsynsam_update(job)
        assert result.metrics["synthetic-examples"] == (20 if incoming.array_records else 0)
        for a, b in zip(job.model.parameters(), reference.model.parameters()):
            torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    mixed = _job(RunConfig(model="mlp", local_steps=4, batch_size=8, sam_rho=0.1), _synthetic())
    fedsynsam_update(mixed)
    assert any(not torch.allclose(a, b) for a, b in zip(mixed.model.parameters(), reference.model.parameters()))


def test_fedsynsam_keeps_the_synthetic_set_in_node_state_and_refuses_a_bad_one():
    cfg = RunConfig(model="mlp", local_steps=2, batch_size=8)
    state = RecordDict()
    fedsynsam_update(_job(cfg, _synthetic(), state))
    assert STATE_SYNTHETIC in state.array_records
    # the next message carries no D_syn: the node uses the one in its state
    assert fedsynsam_update(_job(cfg, RecordDict(), state)).metrics["synthetic-examples"] == 20
    bad = _synthetic()
    record = bad.array_records[SYNTHETIC_DATA]
    x = record["x"].numpy().copy()
    x[0, 0, 0, 0] = np.nan
    bad[SYNTHETIC_DATA] = to_record({"x": x, "y": record["y"].numpy()})
    with pytest.raises(ValueError, match="non-finite"):
        fedsynsam_update(_job(cfg, bad, RecordDict()))


def _t(*values: float) -> list[torch.Tensor]:
    return [torch.tensor(list(values), dtype=torch.float64)]


def test_the_papers_mix_and_the_normalized_ablation_hand_values():
    local, synthetic = _t(3.0, 4.0), _t(0.0, 0.5)   # norms 5 and 0.5: ratio 0.1
    paper = mix_ascent(local, synthetic, 0.9, "paper")
    torch.testing.assert_close(paper[0], torch.tensor([2.7, 3.65], dtype=torch.float64))
    normalized = mix_ascent(local, synthetic, 0.9, "normalized")   # 0.9 (0.6, 0.8) + 0.1 (0, 1)
    torch.testing.assert_close(normalized[0], torch.tensor([0.54, 0.82], dtype=torch.float64))
    assert norm_ratio(local, synthetic) == pytest.approx(0.1)
    # paper: ||0.1 * g_syn|| / (||0.9 g_loc|| + ||0.1 g_syn||) = 0.05 / 4.55; normalized: exactly 1 - beta
    assert synthetic_share(local, synthetic, 0.9, "paper") == pytest.approx(0.05 / 4.55)
    assert synthetic_share(local, synthetic, 0.9, "normalized") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="synsam-mix"):
        mix_ascent(local, synthetic, 0.9, "mean")


def test_normalized_mix_changes_the_training_and_reports_its_share():
    paper_job = _job(RunConfig(model="mlp", local_steps=3, batch_size=8, sam_rho=0.1), _synthetic())
    paper = fedsynsam_update(paper_job)
    ablation_job = _job(RunConfig(model="mlp", local_steps=3, batch_size=8, sam_rho=0.1, synsam_mix="normalized"),
                        _synthetic())
    ablation = fedsynsam_update(ablation_job)
    assert ablation.metrics["stat-synsam-share"] == pytest.approx(0.1)
    assert paper.metrics["stat-synsam-share"] != pytest.approx(0.1)
    # same batches, same gradients: only the ascent mix differs
    assert ablation.metrics["stat-synsam-norm-ratio-median"] == pytest.approx(paper.metrics["stat-synsam-norm-ratio-median"], rel=0.5)
    assert any(not torch.allclose(a, b) for a, b in zip(paper_job.model.parameters(), ablation_job.model.parameters()))


# ----- server: D_syn delivery, diagnostic, DynaFed, checkpoints ---------------------------


def _fss_config(tmp_path, data_dir, **extra) -> dict:
    return base_config(tmp_path, data_dir, **{
        "algorithm": "fedsynsam", "model": "mlp", "trajectory-rounds": 1, "distill-iterations": 5,
        "synthetic-ipc": 2, "compression": "qsgd", **extra,
    })


def test_synthetic_set_reaches_every_node_once_even_after_a_missed_round(tmp_path, tiny_data_dir):
    raw = _fss_config(tmp_path, tiny_data_dir, **{"num-server-rounds": 4, "perturbation-diagnostic": True})
    grid = InProcessGrid(3, raw)
    grid.faults[(2, 2, "train")] = "timeout"  # node 2 misses the round that first carries D_syn
    _, results, strategy, _ = run_inprocess(raw, 3, grid)
    carried = {}
    for message in grid.sent:
        config = message.content.config_records.get("config")
        if message.metadata.message_type == "train" and SYNTHETIC_DATA in message.content.array_records:
            pid = grid.contexts[message.metadata.dst_node_id].node_config["partition-id"]
            carried.setdefault(int(config["server-round"]), []).append(pid)
    assert carried == {2: [0, 1, 2], 3: [2]}
    assert all(STATE_SYNTHETIC in ctx.state.array_records for ctx in grid.contexts.values())
    rounds = results.rounds
    assert rounds[1]["distill-loss-end"] < rounds[1]["distill-loss-start"]
    assert rounds[1]["synthetic-examples"] == 20
    # the diagnostic: FedSAM's and FedLESAM's cosines every round (FedLESAM's once there is an update),
    # FedSynSAM's once D_syn exists
    assert "cos-fedsam" in rounds[1] and "cos-fedsynsam" not in rounds[1]
    # ... as written to metrics.jsonl, with the synthetic share of the ascent and the norm ratio
    logged = read_metrics(results.metrics_path)
    assert [r["round"] for r in logged] == [0, 1, 2, 3, 4]
    for record in logged[2:]:
        for key in ("cos-fedsam", "cos-fedlesam", "cos-fedsynsam", "cos-synthetic", "cos-local-synthetic"):
            assert -1.0 <= record[key] <= 1.0
        assert record["synthetic-norm-ratio"] > 0 and 0 < record["synthetic-share"] < 1
        # the clients' mini-batch view of the same (mean and max over the round's clients)
        assert record["stat-synsam-norm-ratio-median"] > 0 and 0 < record["stat-synsam-share"] < 1
        assert -1.0 <= record["stat-synsam-cos"] <= 1.0 and "stat-synsam-share-max" in record
    assert "stat-synsam-share" not in logged[1]  # round 1: nobody holds D_syn yet
    assert strategy.synthetic_holders == {0, 1, 2}


def test_fedsynsam_resumes_to_the_same_model(tmp_path, tiny_data_dir):
    from fedsynth.inprocess import run_federation

    def cfg(name, rounds, **extra):
        return _fss_config(tmp_path, tiny_data_dir, **{"run-name": name, "num-server-rounds": rounds,
                                                      "trajectory-rounds": 2, "checkpoint-every": 1, **extra})

    full = cfg("full", 4)
    run_federation(full, InProcessGrid(3, full))
    first = cfg("split", 3)
    run_federation(first, InProcessGrid(3, first))
    resumed = cfg("split", 4, resume=True)  # a fresh grid: nodes start with empty state
    run_federation(resumed, InProcessGrid(3, resumed))
    from safetensors.numpy import load_file

    expected = load_file(str(tmp_path / "results" / "full" / "model.safetensors"))
    got = load_file(str(tmp_path / "results" / "split" / "model.safetensors"))
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_dynafed_is_fedavg_until_it_trains_on_the_synthetic_set(tmp_path, tiny_data_dir):
    common = {"model": "mlp", "num-server-rounds": 3, "trajectory-rounds": 2, "distill-iterations": 5,
              "synthetic-ipc": 2, "dynafed-epochs": 2, "dynafed-lr": 1e-3}
    fedavg, fa, _, _ = run_inprocess(base_config(tmp_path / "a", tiny_data_dir, **common), 2)
    dynafed, dy, strategy, _ = run_inprocess(base_config(tmp_path / "b", tiny_data_dir, algorithm="dynafed", **common), 2)
    assert dy.rounds[1]["central-loss"] == fa.rounds[1]["central-loss"]
    assert dy.rounds[2]["central-loss"] != fa.rounds[2]["central-loss"]
    assert strategy.synthetic is not None and len(strategy.trajectory) == 3
    # D_syn never leaves the server: the traffic is FedAvg's
    assert dynafed["downlink-bytes"] == fedavg["downlink-bytes"] and dynafed["uplink-bytes"] == fedavg["uplink-bytes"]


# ----- small pure pieces ---------------------------------------------------------------


def test_cosine_feddyn_and_fedsmoo_server_hand_values():
    assert cosine([torch.tensor([1.0, 0.0])], [torch.tensor([1.0, 1.0])]) == pytest.approx(2 ** -0.5)
    assert cosine([torch.tensor([1.0]), torch.tensor([0.0])], [torch.tensor([0.0]), torch.tensor([2.0])]) == 0.0
    h = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    corrections = [{"w": np.array([2.0, 0.0], dtype=np.float32)}, {"w": np.array([0.0, 4.0], dtype=np.float32)}]
    np.testing.assert_allclose(feddyn_server_state(h, corrections, num_clients=4)["w"], [1.5, 3.0])
    duals = [{"w": np.array([3.0, 0.0], dtype=np.float32)}, {"w": np.array([3.0, 8.0], dtype=np.float32)}]
    np.testing.assert_allclose(smoo_global_perturbation(duals, rho=0.5)["w"], [0.3, 0.4], rtol=1e-6)


@pytest.mark.parametrize(("key", "value"), [
    ("compression", "zip"), ("bits", 1), ("levels", 65536), ("topk-ratio", 0.0), ("synsam-beta", 1.5),
    ("qsgd-scope", "layer"), ("qsgd-bucket", 0), ("synsam-mix", "mean"),
    ("distill-optimizer", "lbfgs"), ("trajectory-rounds", 0), ("dyn-alpha", 0.0),
])
def test_bad_fedsynsam_keys_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_run_config({key: value}, SERVER_STRATEGIES)


def _mofedsam_job(optimizer: str, alpha: float, update: dict | None = None) -> tuple[LocalJob, dict]:
    cfg = RunConfig(model="mlp", algorithm="mofedsam", local_optimizer=optimizer, mofedsam_alpha=alpha,
                    sam_rho=0.05, lr=0.01, weight_decay=0.0, local_steps=3, batch_size=8)
    model = make_model(cfg, seeded=True)
    rng = np.random.default_rng(5)
    update = update or {name: (rng.standard_normal(p.shape) * 0.02).astype(np.float32)
                        for name, p in model.named_parameters()}
    return _job(cfg, RecordDict({PREVIOUS_UPDATE: to_record(update)})), update


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mofedsam_with_alpha_zero_replays_the_previous_global_update(optimizer):
    """alpha = 0: K steps of pure global momentum move the model by exactly the previous global update,
    with SGD (gradient m = -update / (K lr)) and with Adam (whose normalisation must not rescale it)."""
    job, update = _mofedsam_job(optimizer, 0.0)
    start = {name: p.detach().numpy().copy() for name, p in job.model.named_parameters()}
    CLIENT_UPDATES["mofedsam"](job)
    for name, p in job.model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), start[name] + update[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mofedsam_with_alpha_one_is_fedsam(optimizer):
    job, update = _mofedsam_job(optimizer, 1.0)
    CLIENT_UPDATES["mofedsam"](job)
    reference, _ = _mofedsam_job(optimizer, 1.0, update)
    CLIENT_UPDATES["fedsam"](reference)
    for (name, p), q in zip(job.model.named_parameters(), reference.model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-6, err_msg=name)
