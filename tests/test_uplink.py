"""The compressed uplink end to end: client records, measured bytes, server decoding, bad payloads, error feedback."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from common.uplink.encoding import STATE_RESIDUAL_PREFIX
from common.algorithms.codec_settings import CodecSettings
from common.run.config import RunConfig
from common.protocol import COMPRESSED_UPDATE, MODEL, SCAFFOLD_CONTROL_DELTA
from common.records import from_record, message_array_bytes, to_record
from common.uplink.wire import compressed_name, decode_reply, float32_equivalent_bytes
from fedsynth.inprocess import InProcessGrid
from tests.run_codec import run_codec, run_uplink_records
from tests.test_inprocess_runs import base_config, run_inprocess

# ~1M float32 parameters with one dominant layer, like a small CNN.
SHAPES_1M = {
    "conv1.weight": (32, 1, 5, 5), "conv1.bias": (32,), "conv2.weight": (64, 32, 5, 5), "conv2.bias": (64,),
    "fc1.weight": (600, 1600), "fc1.bias": (600,), "fc2.weight": (10, 600), "fc2.bias": (10,),
}


def _weights(shapes, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _reply(records: dict[str, ArrayRecord]) -> Message:
    """A train reply as the ClientApp builds it (the arrays records plus a metrics record)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    request = Message(RecordDict(), dst_node_id=7, message_type="train")
    content = RecordDict({"metrics": MetricRecord({"num-examples": 1})})
    for name, record in records.items():
        content[name] = record
    return Message(content, reply_to=request)


def test_the_codec_of_a_run_config_reaches_the_node_through_the_train_message():
    assert run_codec(RunConfig()) == CodecSettings()
    # error feedback only with a codec, a field only with the method that reads it
    assert run_codec(RunConfig(error_feedback=True, bits=8)) == CodecSettings()
    assert run_codec(RunConfig(compression="topk", topk_ratio=0.25, error_feedback=True, bits=8)) == (
        CodecSettings("topk", topk_ratio=0.25, error_feedback=True))
    spec = run_codec(RunConfig(compression="qsgd", bits=8, levels=5, topk_ratio=0.5))
    assert spec == CodecSettings("qsgd", bits=8, levels=5) and spec.qsgd_levels == 5


@pytest.mark.parametrize(("overrides", "max_fraction"), [
    ({"compression": "qsgd", "bits": 4}, 1 / 7.5),
    ({"compression": "qsgd", "bits": 8}, 1 / 3.9),
    ({"compression": "topk", "topk-ratio": 0.1}, 1 / 6),
])
def test_measured_uplink_bytes_of_a_1m_parameter_model(overrides, max_fraction):
    """Bytes counted on the reply actually built (ArrayRecord serialisation included) against float32."""
    cfg = RunConfig(**{k.replace("-", "_"): v for k, v in overrides.items()})
    global_w, local_w = _weights(SHAPES_1M, 0), _weights(SHAPES_1M, 1)
    assert sum(w.size for w in global_w.values()) > 1_000_000
    compressed = _reply(run_uplink_records(cfg, RecordDict(), global_w, local_w, {}, 1, 0))
    plain = _reply(run_uplink_records(RunConfig(), RecordDict(), global_w, local_w, {}, 1, 0))
    assert set(compressed.content.array_records) == {COMPRESSED_UPDATE}
    assert set(plain.content.array_records) == {MODEL}
    measured, baseline = message_array_bytes(compressed), message_array_bytes(plain)
    assert measured <= max_fraction * baseline, (measured, baseline)
    # the float32 size written next to it is what the uncompressed reply weighs
    assert float32_equivalent_bytes(compressed, to_record(global_w).count_bytes()) == baseline
    # only packed integers and per-tensor float32 scales/values travel
    payload = from_record(compressed.content.array_records[COMPRESSED_UPDATE])
    assert {a.dtype for a in payload.values()} <= {np.dtype(np.uint8), np.dtype(np.float32)}


def test_server_decodes_what_the_client_encoded_and_topk_is_bit_exact():
    shapes = {"w": (40, 30), "b": (30,)}
    global_w, local_w = _weights(shapes, 2), _weights(shapes, 3)
    delta = {k: local_w[k] - global_w[k] for k in shapes}
    spec = CodecSettings("topk", topk_ratio=0.1)
    cfg = RunConfig(compression="topk", topk_ratio=0.1)
    reply = _reply(run_uplink_records(cfg, RecordDict(), global_w, local_w, {}, 3, 1))
    decoded = decode_reply(reply.content, global_w, spec)
    for name, d in delta.items():
        kept = decoded[name] != 0
        assert kept.sum() == int(np.ceil(0.1 * d.size))
        np.testing.assert_array_equal(decoded[name][kept], d[kept])  # bit-exact values
        assert np.abs(d[~kept]).max() <= np.abs(d[kept]).min()       # the largest magnitudes were kept


def test_qsgd_through_client_and_server_is_unbiased():
    shapes = {"w": (50,), "b": (7,)}
    global_w, local_w = _weights(shapes, 4), _weights(shapes, 5)
    cfg = RunConfig(compression="qsgd", bits=3)
    spec = run_codec(cfg)
    draws = [decode_reply(_reply(run_uplink_records(cfg, RecordDict(), global_w, local_w, {}, r, 0)).content,
                          global_w, spec)
             for r in range(1000)]
    for name in shapes:
        delta = local_w[name] - global_w[name]
        mean = np.mean([d[name] for d in draws], axis=0)
        # s = 3 levels: per-coordinate std <= ||v|| / (2 s); 1000 draws put the mean within 5 sigma
        bound = 5 * np.linalg.norm(delta) / (2 * 3) / np.sqrt(1000)
        assert np.abs(mean - delta).max() < bound


def test_error_feedback_keeps_the_residual_in_node_state():
    """Sum over rounds of what the server decodes + the residual left in state = sum of the true updates."""
    shapes = {"w": (200,)}
    cfg = RunConfig(compression="topk", topk_ratio=0.05, error_feedback=True)
    spec = run_codec(cfg)
    state, sent, true = RecordDict(), np.zeros(200), np.zeros(200)
    for r in range(1, 6):
        global_w, local_w = _weights(shapes, 10 + r), _weights(shapes, 20 + r)
        reply = _reply(run_uplink_records(cfg, state, global_w, local_w, {}, r, 0))
        sent += decode_reply(reply.content, global_w, spec)["w"]
        true += local_w["w"] - global_w["w"]
    residual = from_record(state.array_records[STATE_RESIDUAL_PREFIX + MODEL])["w"]
    np.testing.assert_allclose(sent + residual, true, atol=1e-4)
    assert np.abs(residual).sum() > 0


def test_model_shaped_extra_records_are_compressed_and_decoded_back():
    shapes = {"w": (64,), "b": (8,)}
    global_w, local_w, control = _weights(shapes, 30), _weights(shapes, 31), _weights(shapes, 32)
    cfg = RunConfig(compression="qsgd", bits=8)
    other = ArrayRecord({"counts": Array(np.arange(3))})  # not model-shaped: travels as it is
    records = run_uplink_records(cfg, RecordDict(), global_w, local_w,
                             {SCAFFOLD_CONTROL_DELTA: to_record(control), "other": other}, 1, 0)
    assert set(records) == {COMPRESSED_UPDATE, compressed_name(SCAFFOLD_CONTROL_DELTA), "other"}
    reply = _reply(records)
    decode_reply(reply.content, global_w, run_codec(cfg))
    decoded = from_record(reply.content.array_records[SCAFFOLD_CONTROL_DELTA])
    for name in shapes:  # 8-bit qsgd: within one level of ||v|| / 127
        assert np.abs(decoded[name] - control[name]).max() <= np.linalg.norm(control[name]) / 127 + 1e-6
    assert compressed_name(SCAFFOLD_CONTROL_DELTA) not in reply.content.array_records


def _corrupt(kind: str):
    """A fault that damages node 0's compressed payload in one way."""

    def fault(reply: Message) -> Message:
        record = reply.content.array_records[COMPRESSED_UPDATE]
        part = "::norm" if kind == "nan" else "::levels"
        key = next(k for k in record.keys() if k.endswith(part))
        arr = record[key].numpy().copy()
        if kind == "length":
            arr = arr[:-1]
        elif kind == "dtype":
            arr = arr.astype(np.int16)
        else:
            arr = np.full_like(arr, np.nan)
        record[key] = Array(arr)
        return reply

    return fault


@pytest.fixture(scope="module")
def model_without_node_0(tmp_path_factory, tiny_data_dir):
    """The global model after one compressed round in which node 0 stayed silent."""
    raw = base_config(tmp_path_factory.mktemp("silent"), tiny_data_dir,
                      **{"num-server-rounds": 1, "compression": "qsgd", "central-eval": False})
    grid = InProcessGrid(3, raw)
    grid.faults[(0, 1, "train")] = "timeout"
    return run_inprocess(raw, 3, grid)[2].current


@pytest.mark.parametrize(("kind", "reason"), [("length", "elements"), ("dtype", "dtype"), ("nan", "norm must be finite")])
def test_bad_payload_is_rejected_logged_and_never_averaged_in(tmp_path, tiny_data_dir, model_without_node_0, kind, reason):
    raw = base_config(tmp_path, tiny_data_dir, **{"num-server-rounds": 1, "compression": "qsgd", "central-eval": False})
    grid = InProcessGrid(3, raw)
    grid.faults[(0, 1, "train")] = _corrupt(kind)
    _, results, strategy, _ = run_inprocess(raw, 3, grid)
    (round_1,) = [r for r in results.rounds if r["round"] == 1]  # no round 0: central-eval is off
    failure = round_1["failures"][0]
    assert failure["partition"] == 0 and reason in failure["reason"] and COMPRESSED_UPDATE in failure["reason"]
    # identical to the round in which node 0 was silent: nothing of the bad reply got in
    for name, value in model_without_node_0.items():
        np.testing.assert_array_equal(strategy.current[name], value)


def test_missing_compressed_record_is_rejected(tmp_path, tiny_data_dir):
    raw = base_config(tmp_path, tiny_data_dir, **{"num-server-rounds": 1, "compression": "topk"})
    grid = InProcessGrid(2, raw)

    def drop(reply: Message) -> Message:
        del reply.content[COMPRESSED_UPDATE]
        return reply

    grid.faults[(1, 1, "train")] = drop
    _, results, _, _ = run_inprocess(raw, 2, grid)
    assert "lacks the 'compressed-update' record" in results.rounds[1]["failures"][0]["reason"]


def test_compressed_runs_record_bytes_next_to_float32_and_work_with_scaffold(tmp_path, tiny_data_dir):
    plain, _, _, _ = run_inprocess(base_config(tmp_path / "a", tiny_data_dir), 2)
    quant, results, _, _ = run_inprocess(base_config(tmp_path / "b", tiny_data_dir, compression="qsgd"), 2)
    assert quant["uplink-float32-bytes"] == plain["uplink-bytes"] == plain["uplink-float32-bytes"]
    # the tiny CNN has 10 small tensors, so per-array headers weigh more than on a 1M model
    assert quant["uplink-bytes"] < plain["uplink-bytes"] / 6
    assert all(r["uplink-float32-bytes"] > r["uplink-bytes"] for r in results.rounds[1:])
    # SCAFFOLD's control-variate delta goes through the same codec: 2x the compressed uplink
    scaffold, _, strategy, _ = run_inprocess(
        base_config(tmp_path / "c", tiny_data_dir, algorithm="scaffold", compression="qsgd"), 2)
    assert scaffold["uplink-bytes"] == pytest.approx(2 * quant["uplink-bytes"], rel=0.01)
    assert any(np.abs(c).sum() > 0 for c in strategy.control.values())
    metrics = json.loads((results.path / "summary.json").read_text())
    assert metrics["uplink-float32-bytes"] == quant["uplink-float32-bytes"]
