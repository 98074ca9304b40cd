"""Decentralized FL: gossip math against hand values, node rules against plain torch loops,
and whole federations in-process (equivalences, faults, resume, lost node state)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from client_app import decentralized
from client_app.decentralized import keep_own_model
from client_app.training import LocalJob, batch_indices
from client_app.registry import CLIENT_UPDATES
from common.algorithm_table import ALGORITHMS
from common.run.config import ConfigError, parse_run_config
from common.algorithms.gossip import (
    DECENTRALIZED_ALGORITHMS,
    average_model,
    consensus_distance,
    dropout_mixing,
    mix_with_own,
    neighbour_sum,
    ole_start,
    parse_targets,
    rounds_to_targets,
)
from common.protocol import GOSSIP, GOSSIP_MIXED, GOSSIP_MODEL_PREFIX, STATE_OWN_MODEL
from common.records import from_record, load_weights, model_weights
from common.run.task import make_model
from common.algorithms.mixing_spectrum import spectral_psi
from common.algorithms.topology import mixing_matrix
from server_app.strategies.relay import DecentralizedRelay, traffic
from server_app.decentralized_report import warn_if_ole_diverges
from server_app.registry import SERVER_STRATEGIES, build_strategy, train_config_of
from server_app.strategies.node_table import NodeInfo
from fedsynth.inprocess import InProcessGrid
from tests.test_inprocess_runs import base_config, run_inprocess


def _w(*values: float) -> dict[str, np.ndarray]:
    return {"a": np.array(values, dtype=np.float32)}


# ----- gossip math against hand-computed values ---------------------------------------------


def test_dropout_mixing_renormalizes_over_present_nodes_and_keeps_the_absent_one_mixing() -> None:
    w = mixing_matrix("ring", 4)  # 1/3 to itself and to each of its two ring neighbours
    out = dropout_mixing(w, np.array([True, False, True, True]))
    third = 1 / 3
    expected = np.array([
        [0.5, 0.0, 0.0, 0.5],            # node 0 lost neighbour 1: its 1/3 + 1/3 over 2/3
        [third, third, third, 0.0],      # node 1 (absent) still averages its own and its neighbours' models
        [0.0, 0.0, 0.5, 0.5],
        [third, 0.0, third, third],      # node 3 never mixed with node 1
    ])
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(dropout_mixing(w, np.ones(4, dtype=bool)), w)


def test_neighbour_sum_mix_with_own_and_ole_by_hand() -> None:
    partial = neighbour_sum([_w(2.0, 4.0), _w(8.0, 0.0)], [0.25, 0.25])
    np.testing.assert_array_equal(partial["a"], [2.5, 1.0])
    np.testing.assert_array_equal(mix_with_own(_w(1.0, 1.0), 0.5, partial)["a"], [3.0, 1.5])
    np.testing.assert_array_equal(mix_with_own(_w(1.0, 3.0), 1.0, None)["a"], [1.0, 3.0])
    assert neighbour_sum([], []) is None
    # Ole: x + beta (x - z) = [1, 2] + 0.5 * ([1, 2] - [0, 4])
    np.testing.assert_array_equal(ole_start(_w(1.0, 2.0), _w(0.0, 4.0), 0.5)["a"], [1.5, 1.0])
    x = {"a": np.random.default_rng(0).standard_normal(100).astype(np.float32)}
    z = {"a": np.random.default_rng(1).standard_normal(100).astype(np.float32)}
    assert ole_start(x, z, 0.0)["a"].tobytes() == x["a"].tobytes()


def test_average_consensus_and_rounds_to_target_by_hand() -> None:
    models = [_w(0.0, 0.0), _w(2.0, 0.0), _w(1.0, 3.0)]
    mean = average_model(models)
    np.testing.assert_allclose(mean["a"], [1.0, 1.0])
    # ||(-1,-1)||^2 + ||(1,-1)||^2 + ||(0,2)||^2 = 2 + 2 + 4, over 3 nodes
    assert consensus_distance(models, mean) == pytest.approx(8 / 3)
    history = [(0, 0.1), (1, 0.5), (2, 0.72), (3, 0.7), (4, 0.81)]
    assert rounds_to_targets(history, parse_targets("0.7, 0.8,0.9")) == {"0.7": 2, "0.8": 4, "0.9": None}


def test_traffic_of_both_relay_modes_by_hand() -> None:
    # ring of 4: 8 directed neighbour links, 4 nodes with neighbours
    assert traffic(mixing_matrix("ring", 4), 100) == {
        "downlink-bytes-neighbour-models": 800, "downlink-bytes-relay-mixing": 400,
    }
    assert traffic(np.eye(3), 100) == {"downlink-bytes-neighbour-models": 0, "downlink-bytes-relay-mixing": 0}


@pytest.mark.parametrize("num_nodes", [20, 100])
def test_psi_orders_ring_grid_exponential_full(num_nodes: int) -> None:
    psi = {kind: spectral_psi(mixing_matrix(kind, num_nodes)) for kind in ("ring", "grid", "exponential", "full")}
    assert psi["ring"] > psi["grid"] > psi["exponential"] > psi["full"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("key", "value"), [
    ("ole-beta", 1.0), ("ole-beta", -0.1), ("topology", "star"), ("peers", 0), ("mixing", "lazy"),
    ("clip-grad-norm", -1.0), ("dfedavgm-momentum", 1.0),
    ("target-accuracies", "0.7,high"), ("target-accuracies", "1.5"),
])
def test_bad_decentralized_config_names_the_key(key: str, value) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_run_config({"algorithm": "oledfl-sgd", key: value}, SERVER_STRATEGIES)


def test_compression_is_refused_for_decentralized_runs() -> None:
    with pytest.raises(ConfigError, match="'compression'"):
        parse_run_config({"algorithm": "dfedavg", "compression": "qsgd"}, SERVER_STRATEGIES)


def test_the_decentralized_rows_are_registered_on_both_sides() -> None:
    assert set(DECENTRALIZED_ALGORITHMS) == {name for name, row in ALGORITHMS.items() if row.decentralized}
    assert {"dpsgd", "dfedavg", "dfedavgm", "dfedsam", "oledfl-sgd", "oledfl-sam"} <= set(DECENTRALIZED_ALGORITHMS)
    for name in DECENTRALIZED_ALGORITHMS:
        assert issubclass(SERVER_STRATEGIES[name], DecentralizedRelay)
        assert CLIENT_UPDATES[name] is getattr(decentralized, CLIENT_UPDATES[name].__name__)


# ----- node rules against plain torch loops ----------------------------------------------------


def _job(algorithm: str, state: RecordDict, **extra) -> LocalJob:
    cfg = parse_run_config({"algorithm": algorithm, "local-steps": 4, "batch-size": 8, "lr": 0.05,
                            "weight-decay": 1e-3, **extra}, SERVER_STRATEGIES)
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 1, 28, 28, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    model = make_model(cfg, seeded=True)
    return LocalJob(cfg=cfg, server_round=2, partition_id=1, model=model, x=x, y=y, device=torch.device("cpu"),
                    incoming=RecordDict({"config": ConfigRecord(train_config_of(cfg, 2))}), state=state)


def _plain_sgd(job: LocalJob, start: dict, steps: int, momentum: float, clip: float = 0.0) -> dict:
    model = make_model(job.cfg)
    load_weights(model, start)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum, weight_decay=1e-3)
    for idx in batch_indices(len(job.y), dataclasses.replace(job.cfg, local_steps=steps), 2, 1):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(job.x[idx]), job.y[idx]).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    return model_weights(model)


@pytest.mark.parametrize(("algorithm", "steps", "momentum"), [("dpsgd", 1, 0.0), ("dfedavg", 4, 0.0), ("dfedavgm", 4, 0.9)])
def test_node_rules_equal_plain_sgd_and_keep_the_model_in_state(algorithm: str, steps: int, momentum: float) -> None:
    state = RecordDict()
    job = _job(algorithm, state)
    start = model_weights(job.model)
    result = CLIENT_UPDATES[algorithm](job)
    assert result.num_steps == steps
    expected = _plain_sgd(job, start, steps, momentum)
    kept = from_record(state.array_records[STATE_OWN_MODEL])
    for name, value in expected.items():
        np.testing.assert_allclose(model_weights(job.model)[name], value, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(kept[name], model_weights(job.model)[name])


@pytest.mark.parametrize("algorithm", ["dfedavg", "oledfl-sgd", "fedavg"])
def test_clip_grad_norm_clips_every_local_step_as_torch_does(algorithm: str) -> None:
    """clip-grad-norm in local training = torch.nn.utils.clip_grad_norm_ before each SGD step."""
    job = _job(algorithm, RecordDict(), **{"clip-grad-norm": 0.05, "model": "cnn-gn"})
    start = model_weights(job.model)
    CLIENT_UPDATES[algorithm](job)  # first round: the Ole restart from z^{-1} = x^0 is x itself
    expected = _plain_sgd(job, start, 4, 0.0, clip=0.05)
    unclipped = _plain_sgd(job, start, 4, 0.0)
    for name, value in expected.items():
        np.testing.assert_allclose(model_weights(job.model)[name], value, rtol=0, atol=1e-6)
    assert any(np.abs(expected[k] - unclipped[k]).max() > 1e-4 for k in expected)  # the bound was active


def test_cnn_gn_is_the_simple_cnn_with_groupnorm_and_normalises_each_sample_alone() -> None:
    from common.data.datasets import dataset_info
    from common.models.classifiers import build_model

    for dataset in ("fashion-mnist", "cifar10"):
        info = dataset_info(dataset)
        gn, plain = build_model("cnn-gn", info), build_model("cnn", info)
        norms = [m for m in gn.modules() if isinstance(m, torch.nn.GroupNorm)]
        assert [(m.num_groups, m.num_channels) for m in norms] == [(2, 6), (2, 16)]
        # the same layers plus the two GroupNorms' affine parameters
        assert sum(p.numel() for p in gn.parameters()) == sum(p.numel() for p in plain.parameters()) + 2 * (6 + 16)
        x = torch.randn(5, info.channels, info.height, info.width, generator=torch.Generator().manual_seed(0))
        out = gn(x)
        assert out.shape == (5, info.num_classes)
        # no batch statistics: a sample's logits do not depend on the rest of its batch
        torch.testing.assert_close(gn(x[:1]), out[:1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="'cnn-gn' needs images of at least 16x16"):
        build_model("cnn-gn", dataclasses.replace(dataset_info("mnist"), height=12, width=12))


def test_dfedsam_takes_fedsams_sam_steps() -> None:
    dfedsam, fedsam = _job("dfedsam", RecordDict()), _job("fedsam", RecordDict())
    CLIENT_UPDATES["dfedsam"](dfedsam)
    CLIENT_UPDATES["fedsam"](fedsam)
    for name, value in model_weights(fedsam.model).items():
        assert model_weights(dfedsam.model)[name].tobytes() == value.tobytes()


def test_oledfl_sgd_restarts_from_the_opposite_lookahead_point() -> None:
    state = RecordDict()
    job = _job("oledfl-sgd", state, **{"ole-beta": 0.8})
    mixed = model_weights(job.model)
    previous = {k: v + np.float32(0.01) for k, v in mixed.items()}  # z_i^{t-1}, kept from round 1
    keep_own_model(state, previous, 1)
    result = CLIENT_UPDATES["oledfl-sgd"](job)
    start = {k: (mixed[k] + 0.8 * (mixed[k] - previous[k])).astype(np.float32) for k in mixed}
    expected = _plain_sgd(job, start, 4, 0.0)
    for name, value in expected.items():
        np.testing.assert_allclose(model_weights(job.model)[name], value, rtol=0, atol=1e-6)
    assert result.metrics["own-model-round"] == 1 and result.metrics["ole-direction-norm"] > 0


# ----- whole federations in-process ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One partition cache for every run here (partitions are keyed by spec and data source)."""
    return str(tmp_path_factory.mktemp("partitions"))


def _config(folder, data_dir, cache: str, **extra) -> dict:
    return {**base_config(folder, data_dir, **extra), "cache-dir": cache}


def _rounds(results) -> list[dict]:
    return [json.loads(line) for line in (results.path / "metrics.jsonl").read_text().splitlines()]


def _same_numbers(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    for ra, rb in zip(a, b, strict=True):
        for key in keys:
            assert ra.get(key) == rb.get(key), (ra["round"], key)


def test_oledfl_sgd_with_beta_zero_is_dfedavg_exactly(tmp_path, tiny_data_dir, cache_dir) -> None:
    # Ole itself is checked against a hand-made restart in test_oledfl_sgd_restarts_from_the_opposite_lookahead_point
    common = {"num-server-rounds": 2, "topology": "random", "peers": 1, "lr": 0.1}
    runs = {}
    for name, extra in {"dfedavg": {"algorithm": "dfedavg"},
                        "ole0": {"algorithm": "oledfl-sgd", "ole-beta": 0.0}}.items():
        _, results, relay, _ = run_inprocess(_config(tmp_path / name, tiny_data_dir, cache_dir, **common, **extra), 4)
        runs[name] = (relay, _rounds(results))
    keys = ("central-loss", "central-accuracy", "consensus-distance", "train-loss", "local-test-accuracy")
    _same_numbers(runs["dfedavg"][1], runs["ole0"][1], keys)
    for za, zb in zip(runs["dfedavg"][0].models, runs["ole0"][0].models, strict=True):
        for name in za:
            assert za[name].tobytes() == zb[name].tobytes()
    # the Ole code path ran, with a non-zero x_i - z_i^{t-1} that beta = 0 cancelled
    assert runs["ole0"][1][2]["ole-direction-norm"] > 0


def test_relay_mixing_gives_the_same_numbers_with_less_downlink(tmp_path, tiny_data_dir, cache_dir) -> None:
    common = {"algorithm": "oledfl-sam", "num-server-rounds": 2, "topology": "random", "peers": 2, "lr": 0.1}
    runs = {}
    for mode in (False, True):
        summary, results, relay, grid = run_inprocess(
            _config(tmp_path / str(mode), tiny_data_dir, cache_dir, **common, **{"relay-mixing": mode}), 4)
        runs[mode] = (summary, _rounds(results), relay, grid)
    _same_numbers(runs[False][1], runs[True][1], ("central-loss", "consensus-distance", "train-loss"))
    for za, zb in zip(runs[False][2].models, runs[True][2].models, strict=True):
        for name in za:
            assert za[name].tobytes() == zb[name].tobytes()
    # the measured downlink is each mode's predicted traffic, and relay mixing sends less
    for mode, key in ((False, "downlink-bytes-neighbour-models"), (True, "downlink-bytes-relay-mixing")):
        for record in runs[mode][1][1:]:
            assert record["downlink-bytes"] == record[key]
    assert runs[True][0]["downlink-bytes"] < runs[False][0]["downlink-bytes"]
    sent_true = [m for m in runs[True][3].sent if GOSSIP in m.content.config_records]
    assert all(not any(n.startswith(GOSSIP_MODEL_PREFIX) for n in m.content.array_records) for m in sent_true)
    assert all(GOSSIP_MIXED in m.content.array_records for m in sent_true)


def test_full_topology_dfedavg_is_uniform_fedavg_round_for_round(tmp_path, tiny_data_dir, cache_dir) -> None:
    common = {"num-server-rounds": 2, "lr": 0.1}
    _, fed_results, fedavg, _ = run_inprocess(_config(
        tmp_path / "fedavg", tiny_data_dir, cache_dir, algorithm="fedavg", aggregation="uniform", **common), 3)
    _, dec_results, relay, _ = run_inprocess(_config(
        tmp_path / "dfedavg", tiny_data_dir, cache_dir, algorithm="dfedavg", topology="full", **common), 3)
    fed, dec = _rounds(fed_results), _rounds(dec_results)
    assert [r["round"] for r in fed] == [r["round"] for r in dec] == [0, 1, 2]
    for rf, rd in zip(fed, dec):
        assert rd["central-loss"] == pytest.approx(rf["central-loss"], rel=1e-5, abs=1e-6)
        assert rd["central-accuracy"] == pytest.approx(rf["central-accuracy"], abs=1e-9)
        if rf["round"] > 0:
            assert rd["local-test-accuracy"] == pytest.approx(rf["local-test-accuracy"], abs=1e-9)
            assert rd["train-loss"] == pytest.approx(rf["train-loss"], rel=1e-5)
    mean = average_model(relay.models)
    for name, value in fedavg.current.items():
        np.testing.assert_allclose(mean[name], value, rtol=0, atol=2e-6)


def test_failed_and_timed_out_nodes_are_dropped_from_the_next_mixing(tmp_path, tiny_data_dir, cache_dir) -> None:
    raw = _config(tmp_path, tiny_data_dir, cache_dir, **{
        "algorithm": "oledfl-sgd", "num-server-rounds": 3, "topology": "random", "peers": 2, "min-nodes": 2})
    grid = InProcessGrid(4, raw)
    grid.faults[(1, 2, "train")] = "raise"
    grid.faults[(3, 2, "train")] = "timeout"
    summary, results, relay, _ = run_inprocess(raw, 4, grid)
    rounds = {r["round"]: r for r in _rounds(results)}
    assert rounds[2]["answered"] == 2 and rounds[2]["failed"] == 2
    assert {f["partition"] for f in rounds[2]["failures"]} == {1, 3}
    assert rounds[3]["answered"] == 4 and rounds[3]["state-lost"] == 0 and summary["rounds"] == 3
    present = np.array([True, False, True, False])
    expected = dropout_mixing(mixing_matrix("random", 4, peers=2, seed=0, round_num=3), present)
    third_round = [m for m in grid.sent if GOSSIP in m.content.config_records
                   and m.content.config_records["config"]["server-round"] == 3]
    assert len(third_round) == 4
    for message in third_round:
        gossip = message.content.config_records[GOSSIP]
        i = message.metadata.dst_node_id - 1000
        neighbours = list(gossip["neighbours"])
        assert 1 not in neighbours and 3 not in neighbours
        assert gossip["self-weight"] == pytest.approx(expected[i, i], abs=1e-15)
        np.testing.assert_allclose(gossip["weights"], expected[i, neighbours], rtol=0, atol=1e-15)
        assert gossip["self-weight"] + sum(gossip["weights"]) == pytest.approx(1.0, abs=1e-12)
        assert not any(name in message.content.array_records for name in
                       (f"{GOSSIP_MODEL_PREFIX}1", f"{GOSSIP_MODEL_PREFIX}3"))


def test_lost_node_state_is_detected(tmp_path, tiny_data_dir, cache_dir) -> None:
    raw = _config(tmp_path, tiny_data_dir, cache_dir, **{"algorithm": "dfedavg", "num-server-rounds": 2,
                                                          "topology": "ring"})

    class ForgetfulGrid(InProcessGrid):
        """Node 0 loses its Context.state before round 2 (a broken deployment)."""

        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            if any(self._round_of(m) == 2 for m in messages):
                self.contexts[1000].state = RecordDict()
            return super().send_and_receive(messages, timeout=timeout)

    _, results, _, _ = run_inprocess(raw, 3, ForgetfulGrid(3, raw))
    rounds = _rounds(results)
    assert rounds[1]["state-lost"] == 0 and rounds[2]["state-lost"] == 1


def test_resume_from_checkpoint_restores_nodes_and_their_state(tmp_path, tiny_data_dir, cache_dir) -> None:
    common = {"algorithm": "oledfl-sgd", "topology": "random", "peers": 2, "lr": 0.1, "checkpoint-every": 2}
    _, straight, relay_straight, _ = run_inprocess(
        _config(tmp_path / "straight", tiny_data_dir, cache_dir, **common, **{"num-server-rounds": 3}), 3)
    first = _config(tmp_path / "resumed", tiny_data_dir, cache_dir, **common, **{"num-server-rounds": 2})
    run_inprocess(first, 3)
    # a resumed simulation starts with empty Context.state on every node: a fresh grid
    _, resumed, relay_resumed, _ = run_inprocess({**first, "num-server-rounds": 3, "resume": True}, 3)
    rounds = _rounds(resumed)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert rounds[3]["state-lost"] == 0
    _same_numbers(_rounds(straight), rounds, ("central-loss", "consensus-distance", "train-loss"))
    for za, zb in zip(relay_straight.models, relay_resumed.models, strict=True):
        for name in za:
            assert za[name].tobytes() == zb[name].tobytes()


@pytest.mark.parametrize(("topology", "beta", "warned"), [
    ("ring", 0.99, True), ("ring", 0.5, False), ("grid", 0.5, True), ("random-draws", 0.99, False),
    ("random", 0.99, False), ("random", 0.5, False), ("random-pull", 0.99, False), ("full", 0.99, False)])
def test_relay_warns_when_ole_beta_makes_the_nodes_drift_apart(monkeypatch, topology: str, beta: float,
                                                             warned: bool) -> None:
    """ring: lambda_min -1/3 caps beta at 1/2; grid (4x5 torus): lambda_min -0.52, cap 0.31. A fresh random
    W each round contracts in mean square for every beta < 1 (the 4-regular graph: 0.983 per round at 0.99,
    trace/(n-1) of the expected operator; issue 35 corrected an upward-biased estimate that warned here)."""
    import server_app.decentralized_report as report_module

    warnings = []
    monkeypatch.setattr(report_module, "log", lambda level, msg, *args: warnings.append(msg % args)
                        if level == report_module.WARNING else None)
    raw = {"algorithm": "oledfl-sgd", "topology": topology, "peers": 4, "ole-beta": beta, "num-server-rounds": 30,
           "mixing": "uniform" if topology == "random-pull" else "metropolis"}
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    nodes = [NodeInfo(node_id=100 + i, partition_id=i, num_train_examples=10, num_test_examples=2) for i in range(20)]
    warn_if_ole_diverges(cfg, len(nodes))  # what the ServerApp does before start() (server_app/app.py)
    assert bool(warnings) == warned, warnings
    if warned:
        assert f"ole-beta {beta:g} on topology {topology}" in warnings[0]
        bound = {"ring": "beta <= 0.50", "grid": "beta <= 0.31"}[topology]
        assert bound in warnings[0]


@pytest.mark.parametrize(("raw", "match"), [
    ({"topology": "random", "peers": 3, "num": 5}, "odd"),         # no 3-regular graph on 5 nodes
    ({"topology": "random-draws", "peers": 2, "mixing": "uniform"}, "random-draws"),
    ({"topology": "random-pull", "peers": 2}, "directed"),           # Metropolis-Hastings needs an undirected graph
])
def test_relay_refuses_a_topology_the_nodes_cannot_form(raw: dict, match: str) -> None:
    raw = {"algorithm": "dfedavg", **raw}
    count = raw.pop("num", 6)
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    nodes = [NodeInfo(node_id=100 + i, partition_id=i, num_train_examples=10, num_test_examples=2)
             for i in range(count)]
    with pytest.raises(ConfigError, match=match) as info:
        build_strategy(cfg, nodes)
    assert "peers" in str(info.value) and f"{count} nodes" in str(info.value)


def test_random_pull_sends_each_node_its_pull_row_and_logs_the_directed_psi(tmp_path, tiny_data_dir, cache_dir) -> None:
    """DisPFL's pull graph end to end: node i mixes itself and its k draws, 1/(k+1) each, as mixing_matrix says."""
    from common.algorithms.mixing_spectrum import disagreement_factor

    raw = _config(tmp_path, tiny_data_dir, cache_dir, algorithm="dfedavg", topology="random-pull", peers=1,
                  mixing="uniform", **{"num-server-rounds": 2})
    _, results, relay, grid = run_inprocess(raw, 4)
    by_node = {node.node_id: i for i, node in enumerate(relay.node_table.nodes)}
    partition = [node.partition_id for node in relay.node_table.nodes]
    rounds = _rounds(results)
    for t in (1, 2):
        w = mixing_matrix("random-pull", 4, peers=1, seed=relay.seed, round_num=t, mixing="uniform")
        assert rounds[t]["psi"] == pytest.approx(disagreement_factor(w))
        sent = [m for m in grid.sent if GOSSIP in m.content.config_records
                and m.content.config_records["config"]["server-round"] == t]
        assert len(sent) == 4
        for message in sent:
            i = by_node[message.metadata.dst_node_id]
            gossip = message.content.config_records[GOSSIP]
            assert gossip["self-weight"] == pytest.approx(w[i, i]) == pytest.approx(0.5)
            expected = [j for j in range(4) if j != i and w[i, j] > 0]
            assert list(gossip["neighbours"]) == [partition[j] for j in expected]
            assert list(gossip["weights"]) == pytest.approx([w[i, j] for j in expected])
