"""FedDDPM / FedDDPM+ and the DDPM baselines end to end in-process: warmup, auxiliary set, correction, privacy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from common.algorithm_table import ALGORITHMS
from common.run.config import ConfigError, RunConfig, parse_run_config
from common.models.diffusion import linear_schedule, optimizer_kind, seeded_generator, train_on_images
from common.records import load_weights, model_weights
from common.run.task import make_model
from server_app.influence import capped_counts
from server_app.registry import SERVER_STRATEGIES, build_strategy
from server_app.strategies.fedddpm import auxiliary_count
from server_app.strategies.fedddpm_plus import FedDDPMPlus, quicktest, quicktest_due
from tests.conftest import with_fid_classifier
from tests.diffusion_tiny import TINY_DIFFUSION
from fedsynth.inprocess import InProcessGrid
from tests.test_inprocess_runs import base_config, run_inprocess

torch.set_num_threads(1)


def diffusion_config(tmp_path, data_dir, **extra) -> dict:
    return base_config(tmp_path, data_dir, **{**TINY_DIFFUSION, **extra})


@pytest.fixture(autouse=True)
def trained_fid_classifier(tmp_path, fid_classifier) -> None:
    """Each test's `base_config` cache-dir (tmp_path / "cache") starts with the session's trained classifier
    (tests/conftest.py), as a second run on one cache-dir does: its training costs most of a tiny diffusion run."""
    with_fid_classifier(tmp_path / "cache", fid_classifier)


@pytest.fixture(scope="module")
def fedddpm_run(tmp_path_factory, tiny_data_dir, fid_classifier):
    tmp_path = tmp_path_factory.mktemp("fedddpm")
    with_fid_classifier(tmp_path / "cache", fid_classifier)
    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm", **{"checkpoint-every": 1})
    return run_inprocess(raw, num_nodes=3) + (raw,)


def test_auxiliary_count_and_quicktest_by_hand():
    assert [auxiliary_count(m, 0.1) for m in (0, 1, 4, 5, 15, 600)] == [0, 1, 1, 1, 2, 60]
    # first score only sets the average
    assert quicktest(None, 10.0, 0.4, 0.2) == (False, 10.0)
    # |10 - 9| > 0.2: EMA 0.4 * 9 + 0.6 * 10 = 9.6
    fired, average = quicktest(10.0, 9.0, 0.4, 0.2)
    assert not fired and average == pytest.approx(9.6)
    # |9.6 - 9.5| <= 0.2: stop, average unchanged
    assert quicktest(9.6, 9.5, 0.4, 0.2) == (True, 9.6)


def test_fedddpm_warms_up_builds_the_auxiliary_set_and_corrects_every_round(fedddpm_run):
    summary, results, strategy, grid, raw = fedddpm_run
    rounds = [json.loads(line) for line in (results.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    warmup = rounds[0]
    assert warmup["phase"] == "warmup" and warmup["answered"] == 3 and warmup["uplink-bytes"] > 0
    sizes = {node.partition_id: node.num_train_examples for node in strategy.node_table.nodes}
    # |A_i| from each node's count under the weight cap (max-weight-share: no node's count above 0.4 of the total)
    claims = dict(zip(sizes, capped_counts(list(sizes.values()), strategy.max_weight_share)))
    expected = {pid: auxiliary_count(int(claims[pid]), 0.05) for pid in sizes}
    assert strategy.aux_counts == expected
    assert warmup["aux-size"] == sum(expected.values()) == len(strategy.auxiliary)
    assert strategy.auxiliary.shape[1:] == (1, 8, 8)
    assert strategy.auxiliary.min() >= -1 and strategy.auxiliary.max() <= 1
    assert np.isfinite(warmup["aux-fid"])
    for r in rounds[1:]:
        assert r["answered"] == 3 and r["failed"] == 0 and r["correction-epochs"] == 1 and np.isfinite(r["correction-loss"])
    assert np.isfinite(summary["final-fid"]) and summary["final-fid-round"] == 2
    assert summary["fid-features"].startswith("classifier") and summary["sampler"] == "ddim-5-of-T20"
    assert summary["aux-size"] == len(strategy.auxiliary)
    assert summary["aux-sampler"] == "ddpm-ancestral-T20"  # the paper's sampler, whatever the evaluation uses
    assert np.isfinite(warmup["aux-kid"])
    for name in ("auxiliary.png", "samples-final.png", "samples-round-0002.png", "fid.png", "model.safetensors",
                 "config.json", "summary.json", "accuracy.png", "bytes.png"):  # + test_inprocess_runs.py's files
        assert (results.path / name).is_file(), name


def test_the_auxiliary_set_never_reaches_a_client(fedddpm_run):
    """No message sent to any node carries the auxiliary set or any one of its images."""
    _, _, strategy, grid, _ = fedddpm_run
    aux = np.ascontiguousarray(strategy.auxiliary, dtype=np.float32)
    image_bytes = [aux[i].tobytes() for i in range(len(aux))]
    warmup_sent = [m for m in grid.sent if m.content.config_records.get("config", {}).get("phase") == "warmup"]
    assert len(warmup_sent) == 3 and len(grid.sent) > 3
    for message in grid.sent:
        for record in message.content.array_records.values():
            for name in record.keys():
                payload = record[name].numpy().tobytes()
                assert not any(image in payload for image in image_bytes), f"aux image in record array {name}"
        for record in message.content.config_records.values():
            assert not any(isinstance(v, bytes) for v in record.values())


def test_correction_is_the_ddpm_loss_on_the_auxiliary_set(fedddpm_run, tiny_data_dir):
    _, _, strategy, _, raw = fedddpm_run
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    start = model_weights(make_model(cfg, seeded=True))
    strategy._round = 7
    corrected = strategy._correct(start, epochs=2, lr=cfg.correction_lr)

    model = make_model(cfg)
    load_weights(model, start)
    train_on_images(model, torch.from_numpy(strategy.auxiliary), linear_schedule(20), epochs=2,
                    batch_size=cfg.batch_size, lr=cfg.correction_lr, optimizer=optimizer_kind(cfg),
                    generator=seeded_generator(cfg.seed, 7, 0, 22))
    expected = model_weights(model)
    assert optimizer_kind(cfg) == "adam"
    assert any(not np.array_equal(corrected[k], start[k]) for k in start)
    for name in expected:
        np.testing.assert_allclose(corrected[name], expected[name], rtol=0, atol=1e-6)


def test_checkpoint_keeps_the_auxiliary_set_and_a_resumed_run_skips_the_warmup(fedddpm_run, tmp_path):
    import shutil

    _, results, strategy, _, raw = fedddpm_run
    restored = build_strategy(parse_run_config(raw, SERVER_STRATEGIES), strategy.node_table.nodes)
    restored.load_state_arrays(strategy.state_arrays())
    restored.load_state_meta(json.loads(json.dumps(strategy.state_meta())))
    np.testing.assert_array_equal(restored.auxiliary, strategy.auxiliary)
    assert restored.aux_counts == strategy.aux_counts

    # resume a copy of the run, so the other tests keep reading the original
    shutil.copytree(results.path, tmp_path / "results" / "run")
    resumed_raw = {**raw, "results-dir": str(tmp_path / "results"), "num-server-rounds": 3, "resume": True}
    grid = InProcessGrid(3, resumed_raw)
    summary, resumed_results, resumed, _ = run_inprocess(resumed_raw, 3, grid)
    assert not [m for m in grid.sent if m.content.config_records.get("config", {}).get("phase") == "warmup"]
    np.testing.assert_array_equal(resumed.auxiliary, strategy.auxiliary)
    assert [r["round"] for r in resumed_results.rounds] == [0, 1, 2, 3]


def test_fedddpm_plus_stops_after_quicktest_fires_and_corrects_once(tmp_path, tiny_data_dir):
    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm+", **{
        "num-server-rounds": 5, "quicktest-every": 1, "quicktest-threshold": 1e9, "oneshot-epochs": 2,
    })
    summary, results, strategy, grid = run_inprocess(raw, num_nodes=3)
    rounds = {r["round"]: r for r in results.rounds}
    assert sorted(rounds) == [0, 1, 2]  # round 1 sets the EMA, round 2 fires, then the run stops
    assert "correction-epochs" not in rounds[1] and np.isfinite(rounds[1]["quicktest-fid"])
    assert rounds[2]["correction-epochs"] == 2
    assert summary["stopped-at-round"] == 2 and summary["stop-reason"] == "quicktest"
    assert summary["final-fid-round"] == 2 and (results.path / "samples-final.png").is_file()


def test_resuming_a_stopped_fedddpm_plus_run_trains_no_further(tmp_path, tiny_data_dir):
    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm+", **{
        "num-server-rounds": 5, "quicktest-every": 1, "quicktest-threshold": 1e9, "oneshot-epochs": 2,
        "checkpoint-every": 1,
    })
    summary, results, _, _ = run_inprocess(raw, num_nodes=3)
    assert summary["stopped-at-round"] == 2
    from safetensors.numpy import load_file

    final = load_file(results.path / "model.safetensors")
    grid = InProcessGrid(3, {**raw, "resume": True})
    resumed_summary, resumed_results, _, _ = run_inprocess({**raw, "resume": True}, 3, grid)
    assert {m.metadata.message_type for m in grid.sent} == {"query.handshake"}  # no round, no warmup
    assert [r["round"] for r in resumed_results.rounds] == [0, 1, 2]
    assert resumed_summary["stopped-at-round"] == 2 and resumed_summary["stop-reason"] == "quicktest"
    resumed_final = load_file(resumed_results.path / "model.safetensors")
    for name in final:
        np.testing.assert_array_equal(resumed_final[name], final[name])


def test_fedddpm_plus_corrects_after_the_last_round_when_quicktest_never_fires(tmp_path, tiny_data_dir):
    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm+",
                           **{"quicktest-threshold": 0.0, "oneshot-epochs": 2})
    summary, results, _, _ = run_inprocess(raw, num_nodes=2)
    assert summary["stop-reason"] == "last-round" and summary["stopped-at-round"] == 2
    assert results.rounds[-1]["correction-epochs"] == 2


@pytest.mark.parametrize("algorithm", [name for name, row in ALGORITHMS.items() if row.trains_ddpm and not row.ddpm_only])
def test_baselines_train_ddpms_unchanged(tmp_path, tiny_data_dir, algorithm):
    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm=algorithm, **{"local-steps": 2})
    summary, results, _, _ = run_inprocess(raw, num_nodes=2)
    assert [r["round"] for r in results.rounds] == [1, 2]
    assert all(r["answered"] == 2 and np.isfinite(r["train-loss"]) for r in results.rounds)
    assert np.isfinite(summary["final-fid"]) and "final-local-test-accuracy" not in summary
    assert (results.path / "samples-final.png").is_file()


@pytest.mark.parametrize("extra, key", [
    ({"algorithm": "fedddpm", "model": "cnn"}, "'model'"),
    ({"model": "unet-small", "aux-sampler": "euler"}, "'aux-sampler'"),
    ({"model": "unet-small", "oneshot-lr": -1e-4}, "'oneshot-lr'"),
    ({"model": "unet-small", "final-fid-samples": 1}, "'final-fid-samples'"),
    ({"algorithm": "moon", "model": "unet-small"}, "'algorithm'"),
    ({"model": "unet-paper-mnist", "image-size": 30}, "'image-size'"),
    ({"model": "cnn", "image-size": 16}, "'image-size'"),
    ({"model": "unet-small", "cog": True}, "'cog'"),
    ({"model": "unet-small", "sampler": "ddim", "diffusion-timesteps": 10, "ddim-steps": 20}, "'ddim-steps'"),
    ({"fid-features": "clip"}, "'fid-features'"),
])
def test_bad_diffusion_configs_name_the_key(extra, key):
    with pytest.raises(ConfigError, match=key):
        parse_run_config(extra, SERVER_STRATEGIES)


def test_quicktest_reference_from_clients_feature_sums_is_the_pooled_gaussian(tmp_path, tiny_data_dir):
    """With quicktest-reference = clients the server pools the nodes' (sum f, sum f f^T, n): exact statistics of
    all nodes' images, and no image reaches the server."""
    from common.models.diffusion import to_diffusion_input
    from common.metrics.fid import gaussian_stats
    from common.data.partition import PartitionSpec, load_client_data
    from server_app.diffusion_eval import run_extractor

    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm+", **{
        "quicktest-reference": "clients", "quicktest-every": 1, "quicktest-threshold": 1e9, "num-server-rounds": 3,
    })
    summary, results, strategy, grid = run_inprocess(raw, num_nodes=3)
    assert summary["stopped-at-round"] == 2
    queries = [m for m in grid.sent if m.metadata.message_type == "query.fid_stats"]
    assert len(queries) == 3 and results.rounds[1]["fid-reference-nodes"] == 3
    assert results.rounds[1]["fid-reference-bytes"] > 0

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    spec = PartitionSpec(dataset=cfg.dataset, partition=cfg.partition, num_partitions=3, seed=cfg.seed,
                         alpha=cfg.alpha, classes_per_client=cfg.classes_per_client,
                         local_test_fraction=cfg.local_test_fraction)
    images = np.concatenate([to_diffusion_input(load_client_data(spec, pid, cfg.data_dir, cfg.cache_dir).x_train, 8)
                             for pid in range(3)])
    direct = gaussian_stats(run_extractor(cfg).features(images))
    pooled = strategy.feature_reference.stats
    assert pooled.count == direct.count == len(images)
    np.testing.assert_allclose(pooled.mean, direct.mean, rtol=0, atol=1e-8)
    np.testing.assert_allclose(pooled.cov, direct.cov, rtol=0, atol=1e-8)

    restored = build_strategy(cfg, strategy.node_table.nodes)
    state = strategy.state_dict()
    restored.load_state_dict({**state, "meta": json.loads(json.dumps(state["meta"]))})
    np.testing.assert_array_equal(restored.feature_reference.stats.cov, pooled.cov)
    assert restored.feature_reference.stats.count == pooled.count


def test_bad_feature_sums_are_refused():
    from flwr.app import Error, Message, MetricRecord, RecordDict

    from common.records import to_record
    from server_app.fid_reference import check_feature_sums

    InProcessGrid(1, {})  # messages take their run id from the task identity the grid sets

    def reply(sum_f, sum_ff, n=5):
        query = Message(RecordDict(), dst_node_id=1, message_type="query.fid_stats")
        return Message(RecordDict({"fid-sums": to_record({"sum-f": sum_f, "sum-ff": sum_ff}),
                                   "metrics": MetricRecord({"num-examples": n})}), reply_to=query)

    good = reply(np.ones(3), np.eye(3))
    assert check_feature_sums(good, 3)[0] is None and check_feature_sums(good, 3)[2] == 5
    assert "shapes" in check_feature_sums(reply(np.ones(3), np.eye(2)), None)[0]
    assert "shapes" in check_feature_sums(good, 4)[0]
    assert "non-finite" in check_feature_sums(reply(np.array([1.0, np.nan, 0.0]), np.eye(3)), 3)[0]
    assert "malformed" in check_feature_sums(reply(np.ones(3), np.eye(3), n=-1), 3)[0]
    failed = Message(Error(code=2, reason="boom"), reply_to=Message(RecordDict(), dst_node_id=1, message_type="query.x"))
    assert "boom" in check_feature_sums(failed, 3)[0]


def test_the_final_model_is_scored_with_final_fid_samples_fid_kid_and_class_histogram(fedddpm_run):
    summary, results, _, _, _ = fedddpm_run
    last = results.rounds[-1]
    assert last["final-fid-samples"] == summary["final-fid-samples"] == 48  # TINY_DIFFUSION's
    assert np.isfinite(last["fid"]) and np.isfinite(last["kid"])  # the round-sized (32) scores stay in the curve
    for key in ("final-fid", "final-kid", "final-kid-std"):
        assert np.isfinite(summary[key]) and summary[key] == last[key], key
    histogram = summary["final-class-histogram"]
    assert len(histogram) == 10 and sum(histogram) == pytest.approx(1.0, abs=1e-3)
    assert 0 <= summary["final-classes-covered"] <= 10 and 0 <= summary["final-class-entropy"] <= 1
    assert 0 < summary["fid-classifier-test-accuracy"] <= 1


def test_quicktest_counts_t_from_zero_as_algorithm_3():
    """t mod 10 = 0 with t = round - 1: rounds 1, 11, 21, so QuickTest can fire (at 11 or 21) in 30 rounds."""
    assert [r for r in range(1, 31) if quicktest_due(r, 10)] == [1, 11, 21]
    assert [r for r in range(1, 6) if quicktest_due(r, 1)] == [1, 2, 3, 4, 5]
    assert not any(quicktest_due(r, 0) for r in range(1, 31))


def test_fedddpm_plus_quicktests_at_rounds_1_and_3_with_every_2(tmp_path, tiny_data_dir):
    raw = diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm+", **{
        "num-server-rounds": 5, "quicktest-every": 2, "quicktest-threshold": 1e9, "oneshot-epochs": 1,
    })
    summary, results, _, _ = run_inprocess(raw, num_nodes=2)
    tested = [r["round"] for r in results.rounds if "quicktest-fid" in r]
    assert tested == [1, 3] and summary["stopped-at-round"] == 3 and summary["stop-reason"] == "quicktest"


def _plus_strategy(tmp_path, tiny_data_dir, **extra) -> tuple[FedDDPMPlus, RunConfig]:
    cfg = parse_run_config(diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm+", **{
        "num-server-rounds": 2, "quicktest-every": 0, "oneshot-epochs": 1, **extra}), SERVER_STRATEGIES)
    strategy = build_strategy(cfg, [])
    strategy.num_rounds = cfg.num_server_rounds  # as start() sets it
    strategy.auxiliary = np.random.default_rng(0).uniform(-1, 1, size=(8, 1, 8, 8)).astype(np.float32)
    return strategy, cfg


@pytest.mark.parametrize("extra, expected", [({}, 1e-3), ({"oneshot-lr": 3e-4}, 3e-4)])
def test_the_one_shot_correction_runs_at_the_clients_learning_rate(tmp_path, tiny_data_dir, monkeypatch, extra,
                                                                   expected):
    """Algorithm 2 trains the one-shot correction at zeta, the clients' rate (TINY_DIFFUSION's lr = 1e-3),
    not at FedDDPM's correction-lr eta; oneshot-lr overrides it."""
    import common.models.diffusion

    rates = []
    real = common.models.diffusion.make_optimizer

    def recording(params, kind, lr, **kwargs):
        rates.append(lr)
        return real(params, kind, lr, **kwargs)

    monkeypatch.setattr(common.models.diffusion, "make_optimizer", recording)
    strategy, cfg = _plus_strategy(tmp_path, tiny_data_dir, **extra)
    assert cfg.correction_lr != expected
    start = model_weights(make_model(cfg, seeded=True))
    strategy._round = 2  # the last round: QuickTest never fired, so the one-shot correction runs now
    corrected = strategy.after_aggregation(start)
    assert rates == [expected] and strategy._round_metrics["correction-lr"] == expected
    assert strategy.stop_reason == "last-round" and any(not np.array_equal(corrected[k], start[k]) for k in start)


def test_fedddpm_corrects_at_the_correction_rate(tmp_path, tiny_data_dir, monkeypatch):
    import common.models.diffusion

    rates = []
    real = common.models.diffusion.make_optimizer
    monkeypatch.setattr(common.models.diffusion, "make_optimizer",
                        lambda params, kind, lr, **kw: rates.append(lr) or real(params, kind, lr, **kw))
    cfg = parse_run_config(diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm"), SERVER_STRATEGIES)
    strategy = build_strategy(cfg, [])
    strategy.auxiliary = np.zeros((4, 1, 8, 8), dtype=np.float32)
    strategy.after_aggregation(model_weights(make_model(cfg, seeded=True)))
    assert rates == [cfg.correction_lr] == [5e-5]


def test_the_diffusion_algorithms_default_to_the_papers_u_net():
    """`--run-config "algorithm='fedddpm'"` alone: model = "auto" is FedDDPM's MNIST U-Net."""
    from common.run.config import RunConfig, parse_overrides

    for algorithm in ("fedddpm", "fedddpm+"):
        assert parse_run_config(parse_overrides(f"algorithm='{algorithm}'"), SERVER_STRATEGIES).model == "unet-paper-mnist"
    assert parse_run_config({"algorithm": "fedavg"}, SERVER_STRATEGIES).model == "cnn"
    assert parse_run_config({"algorithm": "fedddpm", "model": "unet-small"}, SERVER_STRATEGIES).model == "unet-small"
    assert RunConfig().model == "cnn" and RunConfig(algorithm="fedddpm+").model == "unet-paper-mnist"


def test_aux_sampler_ddim_is_an_option(tmp_path, tiny_data_dir):
    from common.models.diffusion import aux_sampler_spec

    cfg = parse_run_config(diffusion_config(tmp_path, tiny_data_dir, algorithm="fedddpm", **{"aux-sampler": "ddim"}),
                           SERVER_STRATEGIES)
    assert aux_sampler_spec(cfg).label == "ddim-5-of-T20"
    assert aux_sampler_spec(parse_run_config({"model": "unet-small"}, SERVER_STRATEGIES)).label == "ddpm-ancestral-T500"
