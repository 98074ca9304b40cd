"""qsgd scopes (SPEC 3.5): the FedSynSAM paper's whole-update quantiser (eq. 3), buckets, level counts, wire sizes.

The model-scope quantiser must be unbiased with the variance stochastic rounding
gives (within QSGD's bound), each scope's payload must weigh exactly the
hand-computed bits, and a payload of one scope must never decode under another.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, RecordDict

from common.uplink.payloads import decode_update, encode_update, expected_payload_nbytes, payload_nbytes
from common.uplink.quantizers import qsgd_quantize_buckets, qsgd_variance_bound
from common.algorithms.codec_settings import CodecSettings, paper_levels
from common.run.config import RunConfig
from common.protocol import COMPRESSED_UPDATE, SCAFFOLD_CONTROL_DELTA
from common.records import from_record, to_record
from common.uplink.wire import TENSOR_MASK, compressed_name, decode_reply
from tests.run_codec import run_codec, run_uplink_records

SHAPES = {"b": (5,), "a": (3, 4)}  # 17 coordinates, listed out of sorted order on purpose
PAPER4 = CodecSettings("qsgd", levels=paper_levels(4), qsgd_scope="model")   # 17 levels
PAPER8 = CodecSettings("qsgd", levels=paper_levels(8), qsgd_scope="model")   # 257 levels
BUCKET8 = CodecSettings("qsgd", levels=17, qsgd_scope="bucket", qsgd_bucket=8)
TENSOR17 = CodecSettings("qsgd", levels=17, qsgd_scope="tensor")


def _update(shapes=SHAPES, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_paper_levels_and_the_bits_they_need_on_the_wire():
    assert paper_levels(4) == 17 and paper_levels(8) == 257
    assert (PAPER4.level_bits, PAPER4.coordinate_bits) == (5, 6)    # "4-bit" is 6 bits per coordinate
    assert (PAPER8.level_bits, PAPER8.coordinate_bits) == (9, 10)   # "8-bit" is 10
    assert PAPER4.describe() == "qsgd, model scope, 17 levels (6 bits per coordinate: 1 sign + 5 level)"
    assert "bucket scope (8)" in BUCKET8.describe()


def test_model_scope_is_unbiased_and_has_the_stochastic_rounding_variance():
    """Mean over many draws -> v; E||Q(v) - v||^2 = sum (||v||/s)^2 p(1-p), within QSGD's bound."""
    v = np.array([3.0, -1.0, 0.5, 0.0, -2.25, 1.5, 0.125, -0.75], dtype=np.float32)
    s, draws = 17, 40_000
    rng = np.random.default_rng(0)
    total = np.zeros(v.size)
    squared_error = 0.0
    for _ in range(draws):
        payload = encode_update({"v": v}, PAPER4, rng)
        q = decode_update(payload, {"v": v.shape}, PAPER4)["v"].astype(np.float64)
        total += q
        squared_error += float(np.sum((q - v) ** 2))
    norm = float(np.linalg.norm(v.astype(np.float64)))
    r = s * np.abs(v.astype(np.float64)) / norm
    p = r - np.floor(r)
    exact_variance = float(np.sum((norm / s) ** 2 * p * (1 - p)))
    per_coordinate_sd = np.sqrt((norm / s) ** 2 * p * (1 - p) / draws)
    assert np.all(np.abs(total / draws - v) <= 5 * per_coordinate_sd + 1e-6)
    assert squared_error / draws == pytest.approx(exact_variance, rel=0.05)
    assert exact_variance <= qsgd_variance_bound(v.size, s) * norm**2


def test_one_norm_per_bucket():
    flat = np.array([3, 4, 0, 0, 0, 5, 12], dtype=np.float32)
    norms, negative, level = qsgd_quantize_buckets(flat, 5, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(norms, [5.0, 5.0, 12.0])      # buckets (3,4,0), (0,0,5), (12,)
    np.testing.assert_array_equal(level, [3, 4, 0, 0, 0, 5, 5])  # 5*|v|/norm: 3, 4, 0 | 0, 0, 5 | 5
    assert not negative.any()


def test_more_than_255_levels_round_trip():
    spec = CodecSettings("qsgd", levels=1000, qsgd_scope="model")
    delta = _update()
    decoded = decode_update(encode_update(delta, spec, np.random.default_rng(1)), {k: v.shape for k, v in delta.items()}, spec)
    norm = np.sqrt(sum(float(np.sum(t.astype(np.float64) ** 2)) for t in delta.values()))
    for name in delta:
        assert np.abs(decoded[name] - delta[name]).max() <= norm / 1000 + 1e-5


# Payload data bytes, by hand, for SHAPES (a: 12 coordinates, b: 5; 17 in all):
#   norm 4 B each; signs ceil(n/8) B; levels level_bits * ceil(n/8) B (bit planes).
HAND_BYTES = [
    (TENSOR17, (4 + 2 + 5 * 2) + (4 + 1 + 5 * 1)),                   # per tensor: 16 + 10 = 26
    (PAPER4, 4 + 3 + 5 * 3),                                          # one vector of 17: 22
    (PAPER8, 4 + 3 + 9 * 3),                                          # 257 levels, 9 level bits: 34
    (BUCKET8, 3 * 4 + 3 + 5 * 3),                                     # 3 buckets of <= 8: 30
    (CodecSettings("qsgd", bits=4, qsgd_scope="model"), 4 + 3 + 3 * 3),  # 7 levels, 3 level bits: 16
    (CodecSettings("none"), 4 * 17),
    (CodecSettings("topk", topk_ratio=0.25), (4 * 3 + 1 * 4) + (4 * 2 + 1 * 3)),  # k=3 of 12 (4-bit idx), 2 of 5
]


@pytest.mark.parametrize(("spec", "nbytes"), HAND_BYTES, ids=lambda x: x.describe() if isinstance(x, CodecSettings) else str(x))
def test_payload_bytes_equal_the_hand_computed_bits(spec: CodecSettings, nbytes: int):
    payload = encode_update(_update(), spec, np.random.default_rng(0))
    assert payload_nbytes(payload) == nbytes
    assert expected_payload_nbytes({k: int(np.prod(s)) for k, s in SHAPES.items()}, spec) == nbytes


def test_wire_bytes_with_metadata_of_the_model_scope_payload():
    """What Flower counts on the wire: the .npy bytes (128 B header each here) plus the key names."""
    payload = encode_update(_update(), PAPER4, np.random.default_rng(0))
    keys = sorted(payload)
    assert keys == ["::model::levels", "::model::norm", "::model::signs"]
    wire = ArrayRecord({k: v for k, v in to_record(payload).items()}).count_bytes()
    assert wire == 22 + 3 * 128 + sum(len(k) for k in keys)


def test_model_scope_on_the_default_cnn_comes_close_to_32_over_the_coordinate_bits():
    """The default CNN (44,426 parameters) in one payload: metadata costs ~1 %, not the per-tensor 0.76 bits/parameter.

    The paper's 4-bit form (17 levels) needs 6 bits per coordinate: at most 32/6 = 5.33x smaller than float32;
    4 bits on the wire (7 levels) at most 8x.
    """
    from common.run.task import make_model

    shapes = {name: tuple(p.shape) for name, p in make_model(RunConfig(model="cnn")).state_dict().items()}
    n = sum(int(np.prod(s)) for s in shapes.values())
    for spec, bits, ratio in ((PAPER4, 6, 5.25), (CodecSettings("qsgd", bits=4, qsgd_scope="model"), 4, 7.8)):
        payload = encode_update(_update(shapes), spec, np.random.default_rng(0))
        wire = to_record(payload).count_bytes()
        assert payload_nbytes(payload) == 4 + bits * -(-n // 8)
        assert 32 / bits > 4 * n / wire > ratio


@pytest.mark.parametrize(("sent", "configured"), [
    (PAPER4, TENSOR17), (TENSOR17, PAPER4), (PAPER4, BUCKET8), (BUCKET8, PAPER4),
    (BUCKET8, CodecSettings("qsgd", levels=17, qsgd_scope="bucket", qsgd_bucket=4)),
])
def test_a_payload_of_one_scope_is_refused_under_another(sent: CodecSettings, configured: CodecSettings):
    delta = _update()
    payload = encode_update(delta, sent, np.random.default_rng(0))
    with pytest.raises(ValueError, match="payload keys"):
        decode_update(payload, {k: v.shape for k, v in delta.items()}, configured)


def _reply_content(records: dict[str, ArrayRecord]) -> RecordDict:
    content = RecordDict()
    for name, record in records.items():
        content[name] = record
    return content


def test_the_server_refuses_a_reply_of_another_scope():
    global_w, local_w = _update(seed=1), _update(seed=2)
    client = RunConfig(compression="qsgd", levels=17, qsgd_scope="model")
    server = RunConfig(compression="qsgd", levels=17, qsgd_scope="tensor")
    content = _reply_content(run_uplink_records(client, RecordDict(), global_w, local_w, {}, 1, 0))
    with pytest.raises(ValueError, match=COMPRESSED_UPDATE):
        decode_reply(content, global_w, run_codec(server))
    content = _reply_content(run_uplink_records(client, RecordDict(), global_w, local_w, {}, 1, 0))
    update = decode_reply(content, global_w, run_codec(client))
    assert set(update) == set(global_w)


def test_whole_update_extras_carry_their_tensor_mask():
    """A control variate over a subset of the model tensors decodes back to that subset."""
    shapes = {"w": (64,), "b": (8,), "running_mean": (4,)}
    global_w, local_w = _update(shapes, 3), _update(shapes, 4)
    control = {k: v for k, v in _update(shapes, 5).items() if k != "running_mean"}
    cfg = RunConfig(compression="qsgd", levels=257, qsgd_scope="model")
    records = run_uplink_records(cfg, RecordDict(), global_w, local_w, {SCAFFOLD_CONTROL_DELTA: to_record(control)},
                                 1, 0)
    assert TENSOR_MASK in records[compressed_name(SCAFFOLD_CONTROL_DELTA)]
    content = _reply_content(records)
    decode_reply(content, global_w, run_codec(cfg))
    decoded = from_record(content.array_records[SCAFFOLD_CONTROL_DELTA])
    assert set(decoded) == {"w", "b"}
    norm = np.sqrt(sum(float(np.sum(t.astype(np.float64) ** 2)) for t in control.values()))
    for name in control:
        assert np.abs(decoded[name] - control[name]).max() <= norm / 257 + 1e-5


def test_bucket_scope_is_unbiased_with_a_bucket_length_that_does_not_divide_the_update():
    """Buckets of 3 over 8 coordinates (3, 3, 2): mean over draws -> v; the error is stochastic rounding's,
    summed per bucket with each bucket's own norm, and within QSGD's bound per bucket."""
    v = np.array([3.0, -1.0, 0.5, 0.0, -2.25, 1.5, 0.125, -0.75], dtype=np.float32)
    spec = CodecSettings("qsgd", levels=17, qsgd_scope="bucket", qsgd_bucket=3)
    s, draws = 17, 8_000
    rng = np.random.default_rng(1)
    total = np.zeros(v.size)
    squared_error = 0.0
    for _ in range(draws):
        q = decode_update(encode_update({"v": v}, spec, rng), {"v": v.shape}, spec)["v"].astype(np.float64)
        total += q
        squared_error += float(np.sum((q - v) ** 2))
    exact_variance, per_coordinate_var, bound = 0.0, np.zeros(v.size), 0.0
    for start in range(0, v.size, 3):
        b = v[start:start + 3].astype(np.float64)
        norm = float(np.linalg.norm(b))
        r = s * np.abs(b) / norm
        p = r - np.floor(r)
        per_coordinate_var[start:start + 3] = (norm / s) ** 2 * p * (1 - p)
        exact_variance += float(np.sum(per_coordinate_var[start:start + 3]))
        bound += qsgd_variance_bound(b.size, s) * norm**2
    assert np.all(np.abs(total / draws - v) <= 5 * np.sqrt(per_coordinate_var / draws) + 1e-6)
    assert squared_error / draws == pytest.approx(exact_variance, rel=0.1)
    assert exact_variance <= bound


def test_bucket_512_wire_size_at_the_mlps_size():
    """159,010 coordinates (the 784-200-10 MLP) in buckets of 512: 311 norms (the last bucket 290 long),
    1 sign bit and 5 level bits per coordinate (17 levels), by hand: 311 * 4 + 6 * 19,877 = 120,506 bytes."""
    spec = CodecSettings("qsgd", levels=17, qsgd_scope="bucket", qsgd_bucket=512)
    shapes = {"w": (159_010,)}
    payload = encode_update(_update(shapes), spec, np.random.default_rng(0))
    assert payload_nbytes(payload) == 311 * 4 + 6 * 19_877
    assert expected_payload_nbytes({"w": 159_010}, spec) == 311 * 4 + 6 * 19_877
    assert payload["::bucket-512::norm"].shape == (311,)
