"""Any PyTorch model (issue 44): arrays keep dtype and shape end to end, buffers are averaged, not stepped or compressed.

BatchNorm puts float running statistics and a 0-d int64 `num_batches_tracked` in a state dict.
Unit tests on hand numbers (records, the buffer rule, the compressed uplink, SCAFFOLD's control
variates), then `fedsynth run --engine inprocess` with a site's BatchNorm CNN and torchvision's
resnet18 through every algorithm family.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from common.run.config import RunConfig, parse_run_config
from common.protocol import COMPRESSED_UPDATE, MODEL, SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA
from common.records import (check_weights, from_record, load_weights, model_weights, module_parameter_names,
                            parameter_names, to_record)
from common.uplink.wire import MODEL_BUFFERS, decode_reply, reply_buffers
from server_app.registry import SERVER_STRATEGIES, build_strategy
from server_app.strategies.fedavg import aggregate_buffers
from server_app.strategies.node_table import NodeInfo
from tests.run_codec import run_codec, run_uplink_records
from tests.bn_models import bn_cnn, bn_cnn_with_own_buffer, resnet18


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def count(value: int) -> np.ndarray:
    return np.array(value, dtype=np.int64)  # 0-d, as BatchNorm's num_batches_tracked


# A BatchNorm layer's state dict in miniature: two parameters, two float statistics, a 0-d int64 counter.
BN = {"bn.weight": f32(1, 1), "bn.bias": f32(0, 0), "bn.running_mean": f32(0, 0), "bn.running_var": f32(1, 1),
      "bn.num_batches_tracked": count(0)}


# ----- records ------------------------------------------------------------------------------


@pytest.mark.parametrize("array", [
    count(7), np.array(3, dtype=np.int32), np.arange(6, dtype=np.int32).reshape(2, 3), np.array([1, 0], dtype=np.uint8),
    np.array(True), np.linspace(0, 1, 6, dtype=np.float16).reshape(3, 2), np.array(2.5, dtype=np.float64),
    np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],  # not contiguous
], ids=["0d-int64", "0d-int32", "int32", "uint8", "0d-bool", "float16", "0d-float64", "strided-float32"])
def test_record_round_trip_keeps_dtype_shape_and_values(array: np.ndarray) -> None:
    back = from_record(to_record({"a": array}))["a"]
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_a_batchnorm_models_state_survives_records_and_loads_back() -> None:
    model = bn_cnn(num_classes=10, channels=1, image_size=28)
    model.train()
    model(torch.randn(4, 1, 28, 28))  # moves the statistics and the counter off their initial values
    weights = model_weights(model)
    assert weights["1.num_batches_tracked"].shape == () and weights["1.num_batches_tracked"].dtype == np.int64
    back = from_record(to_record(weights))
    assert check_weights(back, weights, "model") is None
    fresh = bn_cnn(num_classes=10, channels=1, image_size=28)
    load_weights(fresh, back)  # strict: a (1,)-shaped counter would raise here
    assert int(fresh[1].num_batches_tracked) == 1


def test_check_weights_names_a_changed_shape_or_dtype_of_a_0d_array() -> None:
    assert "shape (1,), expected ()" in check_weights({"c": np.array([0], dtype=np.int64)}, {"c": count(0)}, "model")
    assert "dtype float32, expected int64" in check_weights({"c": np.array(0, dtype=np.float32)}, {"c": count(0)}, "m")


@pytest.mark.parametrize("factory", [bn_cnn, resnet18])
def test_parameter_names_by_convention_are_the_modules_parameters(factory) -> None:
    model = factory(num_classes=10, channels=1, image_size=28)
    assert parameter_names(model_weights(model)) == module_parameter_names(model)


# ----- the buffer rule, on hand numbers -------------------------------------------------------


def test_aggregate_buffers_averages_floats_and_takes_the_max_of_integers() -> None:
    replies = [{"m": f32(1, 2), "v": f32(4, 0), "n": count(3), "h": np.array([1, 9], dtype=np.int32)},
               {"m": f32(5, 6), "v": f32(0, 8), "n": count(5), "h": np.array([4, 2], dtype=np.int32)}]
    out = aggregate_buffers(replies, [1.0, 3.0])
    np.testing.assert_allclose(out["m"], [(1 + 3 * 5) / 4, (2 + 3 * 6) / 4])  # [4, 5]
    np.testing.assert_allclose(out["v"], [1.0, 6.0])
    assert out["m"].dtype == np.float32
    assert out["n"].dtype == np.int64 and out["n"].shape == () and int(out["n"]) == 5
    np.testing.assert_array_equal(out["h"], [4, 9])
    assert out["h"].dtype == np.int32


def cfg_of(**overrides) -> RunConfig:
    return parse_run_config({k.replace("_", "-"): v for k, v in overrides.items()}, SERVER_STRATEGIES)


def nodes(n: int) -> list[NodeInfo]:
    return [NodeInfo(node_id=1000 + pid, partition_id=pid, num_train_examples=100, num_test_examples=2)
            for pid in range(n)]


def reply_to(message: Message, records: dict[str, ArrayRecord], num_examples: int, partition_id: int) -> Message:
    content = RecordDict({"metrics": MetricRecord({"num-examples": num_examples, "partition-id": partition_id,
                                                   "train-loss": 1.0})})
    for name, record in records.items():
        content[name] = record
    return Message(content, reply_to=message)


def local_models() -> list[dict[str, np.ndarray]]:
    return [
        {"bn.weight": f32(3, 1), "bn.bias": f32(2, 0), "bn.running_mean": f32(1, 2), "bn.running_var": f32(4, 0.5),
         "bn.num_batches_tracked": count(3)},
        {"bn.weight": f32(1, 5), "bn.bias": f32(-2, 4), "bn.running_mean": f32(5, 6), "bn.running_var": f32(0.5, 8),
         "bn.num_batches_tracked": count(7)},
    ]


def test_fedavg_steps_the_parameters_and_averages_the_buffers() -> None:
    """server-lr 0.5 moves the parameters half way; the statistics are the weighted mean, the counter the max
    (bounded influence off: the plain weighted mean of two nodes)."""
    strategy = build_strategy(cfg_of(server_lr=0.5, max_update_norm_ratio=0.0, max_weight_share=1.0), nodes(2))
    messages = list(strategy.configure_train(1, to_record(BN), ConfigRecord({}), None))
    replies = [reply_to(m, {MODEL: to_record(w)}, n, pid) for pid, (m, w, n) in
               enumerate(zip(messages, local_models(), (10, 30)))]
    assert all(strategy.reply_gate.check_reply(r) is None for r in replies)
    record, _ = strategy.aggregate_train(1, replies)
    new = from_record(record)
    # parameters: w + 0.5 * (10 * d0 + 30 * d1) / 40, d_i = w_i - w
    np.testing.assert_allclose(new["bn.weight"], [1 + 0.5 * (10 * 2 + 30 * 0) / 40, 1 + 0.5 * (0 + 30 * 4) / 40])
    np.testing.assert_allclose(new["bn.bias"], [0.5 * (10 * 2 - 30 * 2) / 40, 0.5 * (0 + 30 * 4) / 40])
    # buffers: the weighted mean of the values, not half a step
    np.testing.assert_allclose(new["bn.running_mean"], [(10 * 1 + 30 * 5) / 40, (10 * 2 + 30 * 6) / 40])
    np.testing.assert_allclose(new["bn.running_var"], [(10 * 4 + 30 * 0.5) / 40, (10 * 0.5 + 30 * 8) / 40])
    assert new["bn.num_batches_tracked"].shape == () and new["bn.num_batches_tracked"].dtype == np.int64
    assert int(new["bn.num_batches_tracked"]) == 7
    # the next round's replies check against a model whose counter is still 0-d int64
    nxt = list(strategy.configure_train(2, record, ConfigRecord({}), None))
    assert strategy.reply_gate.check_reply(reply_to(nxt[0], {MODEL: to_record(local_models()[0])}, 10, 0)) is None


# ----- the compressed uplink: parameters through the codec, buffers as they are ------------------


@pytest.mark.parametrize("scope", ["tensor", "bucket"])
def test_qsgd_compresses_the_parameters_only_and_the_buffers_arrive_exactly(scope: str) -> None:
    cfg = cfg_of(compression="qsgd", bits=4, qsgd_scope=scope, qsgd_bucket=2)
    local = local_models()[0]
    records = run_uplink_records(cfg, RecordDict(), BN, local, {}, 1, 0, parameters=["bn.weight", "bn.bias"])
    assert set(records) == {COMPRESSED_UPDATE, MODEL_BUFFERS}
    payload_tensors = {key.split("::")[0] for key in records[COMPRESSED_UPDATE].keys()}
    assert payload_tensors <= {"bn.weight", "bn.bias", ""}  # "" : the whole-update payload's keys
    buffers = from_record(records[MODEL_BUFFERS])
    assert set(buffers) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    for name, value in buffers.items():
        assert value.dtype == local[name].dtype and value.shape == local[name].shape
        np.testing.assert_array_equal(value, local[name])
    content = RecordDict(dict(records))
    spec = run_codec(cfg)
    update = decode_reply(content, BN, spec, ["bn.weight", "bn.bias"])
    assert set(update) == set(BN)
    assert not update["bn.running_var"].any() and not update["bn.num_batches_tracked"].any()  # not an update
    assert update["bn.weight"].any()
    assert int(reply_buffers(content, BN, spec, ["bn.weight", "bn.bias"])["bn.num_batches_tracked"]) == 3


def test_a_compressed_reply_without_its_buffers_is_refused_naming_the_record() -> None:
    cfg = cfg_of(compression="qsgd", bits=4)
    records = run_uplink_records(cfg, RecordDict(), BN, local_models()[0], {}, 1, 0,
                                 parameters=["bn.weight", "bn.bias"])
    del records[MODEL_BUFFERS]
    with pytest.raises(ValueError, match=MODEL_BUFFERS):
        decode_reply(RecordDict(dict(records)), BN, run_codec(cfg), ["bn.weight", "bn.bias"])


def test_a_model_without_buffers_sends_the_same_records_as_before() -> None:
    """Every array a parameter: no MODEL_BUFFERS record, the payload over every tensor (bitwise as before)."""
    cfg = cfg_of(compression="qsgd", bits=4)
    weights = {"w": f32(1, 2, 3), "b": f32(0.5)}
    local = {"w": f32(2, 0, 3), "b": f32(1)}
    with_names = run_uplink_records(cfg, RecordDict(), weights, local, {}, 1, 0, parameters=["w", "b"])
    without = run_uplink_records(cfg, RecordDict(), weights, local, {}, 1, 0)
    assert set(with_names) == set(without) == {COMPRESSED_UPDATE}
    for key in without[COMPRESSED_UPDATE].keys():
        np.testing.assert_array_equal(with_names[COMPRESSED_UPDATE][key].numpy(), without[COMPRESSED_UPDATE][key].numpy())


# ----- SCAFFOLD: control variates over the trainable parameters --------------------------------


def test_scaffold_control_variates_cover_the_parameters_only() -> None:
    strategy = build_strategy(cfg_of(algorithm="scaffold"), nodes(2))
    messages = list(strategy.configure_train(1, to_record(BN), ConfigRecord({}), None))
    assert set(from_record(messages[0].content.array_records[SCAFFOLD_CONTROL])) == {"bn.weight", "bn.bias"}
    delta = {"bn.weight": f32(2, 0), "bn.bias": f32(4, -4)}
    replies = [reply_to(m, {MODEL: to_record(w), SCAFFOLD_CONTROL_DELTA: to_record(delta)}, 10, pid)
               for pid, (m, w) in enumerate(zip(messages, local_models()))]
    assert all(strategy.reply_gate.check_reply(r) is None for r in replies)
    strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(strategy.control["bn.weight"], [2.0, 0.0])  # c += (1/2) * (d + d)
    assert set(strategy.control) == {"bn.weight", "bn.bias"}


# ----- `fedsynth run --engine inprocess` with a site's BatchNorm models --------------------------


ALGORITHMS = {
    "fedavg": {},
    "scaffold": {},
    "fedsam": {},
    "fedsynsam": {"compression": "qsgd", "bits": 4, "trajectory-rounds": 1, "distill-iterations": 3,
                  "synthetic-ipc": 1},
    "fedcog": {"gen-steps": 2, "gen-budget": 8, "cog-start-round": 2},
    "dfedavg": {},
}
# resnet18 costs ~10x the BatchNorm CNN on a CPU: FedAvg with the 4-bit qsgd uplink (its 20 BatchNorm layers'
# statistics beside the compressed update) is its check; FedSynSAM's distillation through resnet18 would triple it
ALGORITHMS["fedavg-qsgd"] = {"algorithm": "fedavg", "compression": "qsgd", "bits": 4}
RUNS = [("tests.bn_models:bn_cnn", name) for name in ALGORITHMS if name != "fedavg-qsgd"] + [
    ("tests.bn_models:resnet18", "fedavg-qsgd")]


@pytest.mark.parametrize("model,algorithm", RUNS, ids=[f"{m.split(':')[1]}-{a}" for m, a in RUNS])
def test_fedsynth_run_trains_a_batchnorm_model(tmp_path, tiny_data_dir, model: str, algorithm: str) -> None:
    """3 rounds on 2 nodes, every reply aggregated, central accuracy above round 0's, a finite 0-d int64 counter."""
    from safetensors.numpy import load_file

    from fedsynth.simulation import find_app_dir, run_simulation

    overrides = {
        "model": model, "algorithm": algorithm, "data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "c"),
        "results-dir": str(tmp_path / "r"), "run-name": "run", "num-server-rounds": 3, "local-steps": 3,
        "batch-size": 16, "lr": 0.05, "local-test-fraction": 0.0, **ALGORITHMS[algorithm],  # central accuracy only
    }
    folder = run_simulation(find_app_dir(), overrides, num_supernodes=2, cpus_per_client=1.0, engine="inprocess")
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r.get("failed", 0) == 0 for r in rounds[1:]), [r.get("failures") for r in rounds]
    assert rounds[-1]["central-accuracy"] > rounds[0]["central-accuracy"]
    final = load_file(str(folder / "model.safetensors"))
    counters = [v for k, v in final.items() if k.endswith("num_batches_tracked")]
    assert counters and all(c.shape == () and c.dtype == np.int64 and int(c) > 0 for c in counters)
    assert all(np.isfinite(v).all() for v in final.values())


def test_the_server_reads_the_parameters_off_the_runs_own_model_without_touching_the_rng() -> None:
    """A site's model (`pkg:factory`) names its parameters exactly, its own buffers too; building it draws no
    global random numbers."""
    from server_app.registry import run_parameter_names

    model = bn_cnn_with_own_buffer(num_classes=10, channels=1, image_size=28)
    weights = model_weights(model)
    torch.manual_seed(5)
    expected_draw = torch.rand(3)
    torch.manual_seed(5)
    names = run_parameter_names(cfg_of(model="tests.bn_models:bn_cnn_with_own_buffer"))
    assert torch.equal(torch.rand(3), expected_draw)
    assert names == module_parameter_names(model)
    assert "input_scale" not in names and "input_scale" in parameter_names(weights)  # naming alone cannot tell


def test_server_momentum_and_the_previous_update_leave_the_buffers_out() -> None:
    """FedAvgM's velocity moves the parameters only; MoFedSAM's previous update covers the parameters only."""
    from common.protocol import PREVIOUS_UPDATE

    momentum = build_strategy(cfg_of(algorithm="fedavgm", server_momentum=0.9), nodes(2))
    model = dict(BN)
    for server_round in (1, 2):  # the same local models twice: momentum would carry the statistics past them
        messages = list(momentum.configure_train(server_round, to_record(model), ConfigRecord({}), None))
        replies = [reply_to(m, {MODEL: to_record(w)}, 10, pid) for pid, (m, w) in enumerate(zip(messages, local_models()))]
        record, _ = momentum.aggregate_train(server_round, replies)
        model = from_record(record)
    np.testing.assert_allclose(model["bn.running_mean"], [3.0, 4.0])  # (1 + 5) / 2, (2 + 6) / 2
    assert int(model["bn.num_batches_tracked"]) == 7 and set(momentum.velocity) == set(BN)
    assert not momentum.velocity["bn.running_mean"].any()

    strategy = build_strategy(cfg_of(algorithm="mofedsam"), nodes(2))
    messages = list(strategy.configure_train(1, to_record(BN), ConfigRecord({}), None))
    replies = [reply_to(m, {MODEL: to_record(w)}, 10, pid) for pid, (m, w) in enumerate(zip(messages, local_models()))]
    record, _ = strategy.aggregate_train(1, replies)
    nxt = list(strategy.configure_train(2, record, ConfigRecord({}), None))
    assert set(from_record(nxt[0].content.array_records[PREVIOUS_UPDATE])) == {"bn.weight", "bn.bias"}
