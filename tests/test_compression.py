"""Tests for the uplink codec (common/algorithms/codec_settings.py; common/uplink: quantizers, payloads, encoding): unbiasedness, hand examples, wire size and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.uplink.encoding import apply_error_feedback
from common.uplink.payloads import decode_update, encode_update, float32_nbytes, payload_nbytes
from common.uplink.quantizers import index_bits, pack_bits, packed_length, topk_count, unpack_bits
from common.algorithms.codec_settings import CodecSettings
from common.errors import ConfigError

QSGD4 = CodecSettings("qsgd", bits=4)
QSGD8 = CodecSettings("qsgd", bits=8)
TOPK10 = CodecSettings("topk", topk_ratio=0.1)
ALL_SPECS = [CodecSettings(), QSGD4, QSGD8, CodecSettings("qsgd", levels=5), TOPK10]

# Dtypes a Flower ArrayRecord round-trips (no uint16/32/64).
ARRAYRECORD_DTYPES = {
    np.dtype(t)
    for t in ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")
}

# Roughly the shape of a small CNN: ~1M floats with one dominant layer.
MODEL_SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.weight": (32, 1, 5, 5),
    "conv1.bias": (32,),
    "conv2.weight": (64, 32, 5, 5),
    "conv2.bias": (64,),
    "fc1.weight": (600, 1600),
    "fc1.bias": (600,),
    "fc2.weight": (10, 600),
    "fc2.bias": (10,),
}


def _random_update(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _round_trip(
    delta: dict[str, np.ndarray], spec: CodecSettings, seed: int = 0
) -> dict[str, np.ndarray]:
    payload = encode_update(delta, spec, np.random.default_rng(seed))
    return decode_update(payload, {k: v.shape for k, v in delta.items()}, spec)


# --------------------------------------------------------------------------- spec


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"compression": "zip"}, "compression"),
        ({"bits": 1}, "bits"),
        ({"bits": 10}, "bits"),
        ({"bits": 4.0}, "bits"),
        ({"bits": True}, "bits"),
        ({"levels": -1}, "levels"),
        ({"levels": 5.0}, "levels"),
        ({"levels": 65536}, "levels"),
        ({"qsgd_scope": "layer"}, "qsgd-scope"),
        ({"qsgd_bucket": 0}, "qsgd-bucket"),
        ({"topk_ratio": 0.0}, "topk-ratio"),
        ({"topk_ratio": 1.5}, "topk-ratio"),
        ({"topk_ratio": float("nan")}, "topk-ratio"),
    ],
)
def test_the_codec_refuses_bad_values_naming_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^run config key '{key}' = "):
        CodecSettings(**kwargs).check()


@pytest.mark.parametrize(
    ("bits", "levels", "s", "width"),
    [(2, 0, 1, 1), (4, 0, 7, 3), (8, 0, 127, 7), (9, 0, 255, 8), (4, 5, 5, 3), (8, 1, 1, 1)],
)
def test_the_codecs_levels_and_level_bits(bits: int, levels: int, s: int, width: int) -> None:
    spec = CodecSettings("qsgd", bits=bits, levels=levels)
    assert (spec.qsgd_levels, spec.level_bits) == (s, width)


# --------------------------------------------------------------------- bit packing


@pytest.mark.parametrize("width", [*range(1, 9), 12, 20, 33, 64])
@pytest.mark.parametrize("count", [0, 1, 13, 64])
def test_pack_bits_round_trip(width: int, count: int) -> None:
    rng = np.random.default_rng(width * 100 + count)
    values = rng.integers(0, 2**width, size=count, dtype=np.uint64)
    if count:
        values[0] = 2**width - 1  # the all-ones pattern must survive too
    packed = pack_bits(values, width)
    assert packed.dtype == np.uint8
    assert packed.size == packed_length(count, width) == width * math.ceil(count / 8)
    np.testing.assert_array_equal(unpack_bits(packed, width, count), values)


def test_pack_bits_hand_example() -> None:
    # Bit-planar, most significant plane first: values 5 = 101b, 3 = 011b.
    packed = pack_bits(np.array([5, 3]), 3)
    np.testing.assert_array_equal(packed, [0b10000000, 0b01000000, 0b11000000])


def test_pack_bits_rejects_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="values must lie"):
        pack_bits(np.array([8]), 3)
    with pytest.raises(ValueError, match="values must lie"):
        pack_bits(np.array([-1]), 3)
    with pytest.raises(ValueError, match="expected 3 for 8 values"):
        unpack_bits(np.zeros(2, dtype=np.uint8), 3, 8)


# ---------------------------------------------------------------------------- qsgd


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_qsgd_is_unbiased(bits: int) -> None:
    spec = CodecSettings("qsgd", bits=bits)
    s = spec.qsgd_levels
    v = np.array([0.9, -0.35, 0.0, 0.02, -1.2, 0.6, 0.0005, -0.07], dtype=np.float32)
    draws = 4000
    rng = np.random.default_rng(1234)
    decoded = np.stack(
        [decode_update(encode_update({"v": v}, spec, rng), {"v": v.shape}, spec)["v"] for _ in range(draws)]
    )
    mean = decoded.astype(np.float64).mean(axis=0)
    # Each coordinate takes norm·l/s or norm·(l+1)/s with up-probability p, so
    # its variance is (norm/s)²·p(1−p); allow 5 standard errors, plus float32
    # rounding for coordinates that are deterministic (p = 0).
    norm = float(np.linalg.norm(v.astype(np.float64)))
    r = s * np.abs(v.astype(np.float64)) / norm
    p = r - np.floor(r)
    stderr = (norm / s) * np.sqrt(p * (1 - p) / draws)
    np.testing.assert_array_less(np.abs(mean - v), 5 * stderr + 1e-6)


def test_qsgd_hand_example() -> None:
    # v = [3, -4, 0, 0]: ‖v‖ = 5. At 3 bits s = 3, so r = [1.8, 2.4, 0, 0]:
    # coordinate 0 decodes to 5·1/3 or 5·2/3, coordinate 1 to −5·2/3 or −5·3/3.
    spec = CodecSettings("qsgd", bits=3)
    assert spec.qsgd_levels == 3
    v = np.array([3.0, -4.0, 0.0, 0.0], dtype=np.float32)
    rng = np.random.default_rng(7)
    seen: list[set[float]] = [set(), set(), set(), set()]
    for _ in range(200):
        payload = encode_update({"v": v}, spec, rng)
        assert payload["v::norm"].tolist() == [5.0]
        np.testing.assert_array_equal(unpack_bits(payload["v::signs"], 1, 4), [0, 1, 0, 0])
        decoded = decode_update(payload, {"v": (4,)}, spec)["v"]
        for j, value in enumerate(decoded):
            seen[j].add(round(float(value), 5))
    assert seen[0] == {round(5 / 3, 5), round(10 / 3, 5)}
    assert seen[1] == {round(-10 / 3, 5), -5.0}
    assert seen[2] == seen[3] == {0.0}


def test_qsgd_levels_override_hits_exact_levels() -> None:
    # With s = 5, r = 5·|v|/‖v‖ = [3, 4, 0, 0] is integral, so nothing is random.
    spec = CodecSettings("qsgd", bits=8, levels=5)
    v = np.array([3.0, -4.0, 0.0, 0.0], dtype=np.float32)
    payload = encode_update({"v": v}, spec, np.random.default_rng(0))
    np.testing.assert_array_equal(unpack_bits(payload["v::levels"], 3, 4), [3, 4, 0, 0])
    assert payload["v::levels"].size == 3  # 3 level bits, one byte per plane
    np.testing.assert_array_equal(decode_update(payload, {"v": (4,)}, spec)["v"], v)


def test_qsgd_zero_tensor_encodes_norm_zero() -> None:
    v = np.zeros((3, 5), dtype=np.float32)
    payload = encode_update({"z": v}, QSGD4, np.random.default_rng(0))
    assert payload["z::norm"].tolist() == [0.0]
    decoded = decode_update(payload, {"z": (3, 5)}, QSGD4)["z"]
    assert decoded.dtype == np.float32 and decoded.shape == (3, 5) and not decoded.any()


def test_qsgd_extreme_magnitudes_stay_finite() -> None:
    # A float32 sum of squares would overflow (1e20²) or underflow (1e-30²).
    for scale in (1e20, 1e-30):
        v = (np.array([1.0, -2.0, 0.5], dtype=np.float64) * scale).astype(np.float32)
        decoded = _round_trip({"v": v}, QSGD8)["v"]
        assert np.isfinite(decoded).all() and np.all(np.sign(decoded) == np.sign(v))
        np.testing.assert_allclose(decoded, v, rtol=0.05)


# ---------------------------------------------------------------------------- topk


@pytest.mark.parametrize(
    ("n", "ratio", "k"), [(10, 0.3, 3), (10, 0.1, 1), (7, 0.1, 1), (1000, 0.25, 250), (3, 1.0, 3), (0, 0.5, 0)]
)
def test_topk_count_is_exact_ceiling(n: int, ratio: float, k: int) -> None:
    assert topk_count(n, ratio) == k


def test_topk_hand_example() -> None:
    spec = CodecSettings("topk", topk_ratio=0.5)
    v = np.array([0.1, -5.0, 3.0, 0.2, -3.5, 1.0], dtype=np.float32)
    payload = encode_update({"v": v}, spec, np.random.default_rng(0))
    np.testing.assert_array_equal(payload["v::values"], [-5.0, 3.0, -3.5])
    np.testing.assert_array_equal(unpack_bits(payload["v::indices"], index_bits(6), 3), [1, 2, 4])
    decoded = decode_update(payload, {"v": (6,)}, spec)["v"]
    np.testing.assert_array_equal(decoded, [0.0, -5.0, 3.0, 0.0, -3.5, 0.0])


def test_topk_ties_break_towards_low_indices() -> None:
    spec = CodecSettings("topk", topk_ratio=0.5)
    v = np.array([1.0, -2.0, 1.0, 1.0, -1.0, 0.0], dtype=np.float32)
    payload = encode_update({"v": v}, spec, np.random.default_rng(0))
    np.testing.assert_array_equal(unpack_bits(payload["v::indices"], index_bits(6), 3), [0, 1, 2])


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.25, 1.0])
def test_topk_keeps_largest_and_round_trips_bit_exactly(ratio: float) -> None:
    spec = CodecSettings("topk", topk_ratio=ratio)
    v = np.random.default_rng(3).standard_normal((37, 29)).astype(np.float32)
    decoded = _round_trip({"v": v}, spec)["v"]
    kept = decoded != 0
    assert kept.sum() == math.ceil(ratio * v.size)
    # Kept coordinates are copied bit for bit, everything else is exactly zero.
    np.testing.assert_array_equal(decoded[kept].view(np.uint32), v[kept].view(np.uint32))
    if not kept.all():
        assert np.abs(v[kept]).min() >= np.abs(v[~kept]).max()


# -------------------------------------------------------------- shapes and plumbing


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: f"{s.compression}-{s.bits}-{s.levels}")
def test_round_trip_keeps_names_shapes_and_dtype(spec: CodecSettings) -> None:
    delta = {
        "matrix": np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32),
        "scalar": np.array(0.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    decoded = _round_trip(delta, spec)
    assert list(decoded) == list(delta)
    for name, tensor in delta.items():
        assert decoded[name].shape == tensor.shape and decoded[name].dtype == np.float32


def test_none_is_lossless_and_does_not_alias_the_input() -> None:
    delta = _random_update({"w": (5, 4)})
    payload = encode_update(delta, CodecSettings(), np.random.default_rng(0))
    assert list(payload) == ["w"] and payload["w"] is not delta["w"]
    np.testing.assert_array_equal(decode_update(payload, {"w": (5, 4)}, CodecSettings())["w"], delta["w"])


def test_same_seed_gives_same_payload() -> None:
    delta = _random_update({"a": (100,), "b": (7, 7)})
    first = encode_update(delta, QSGD4, np.random.default_rng(42))
    second = encode_update(delta, QSGD4, np.random.default_rng(42))
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])


@pytest.mark.parametrize(
    ("spec", "max_fraction"), [(QSGD4, 1 / 7.5), (QSGD8, 1 / 3.9), (TOPK10, 1 / 6)]
)
def test_payload_bytes_on_a_1m_parameter_model(spec: CodecSettings, max_fraction: float) -> None:
    delta = _random_update(MODEL_SHAPES)
    assert 1_000_000 <= sum(v.size for v in delta.values()) <= 1_100_000
    payload = encode_update(delta, spec, np.random.default_rng(0))
    assert payload_nbytes(payload) <= max_fraction * float32_nbytes(MODEL_SHAPES)


def test_byte_counters() -> None:
    assert float32_nbytes({"a": (2, 3), "b": (), "c": (0,)}) == 28
    assert payload_nbytes({"x": np.zeros(3, np.uint8), "y": np.zeros(2, np.float32)}) == 11


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: f"{s.compression}-{s.bits}-{s.levels}")
def test_payload_survives_flower_arrayrecord(spec: CodecSettings) -> None:
    from flwr.app import Array, ArrayRecord

    delta = _random_update({"conv.weight": (8, 3, 3, 3), "fc.bias": (300,), "big": (70_000,)})
    shapes = {name: tensor.shape for name, tensor in delta.items()}
    payload = encode_update(delta, spec, np.random.default_rng(5))
    assert {array.dtype for array in payload.values()} <= ARRAYRECORD_DTYPES
    record = ArrayRecord({key: Array(array) for key, array in payload.items()})
    received = {key: record[key].numpy() for key in record}
    expected = decode_update(payload, shapes, spec)
    for name, tensor in decode_update(received, shapes, spec).items():
        np.testing.assert_array_equal(tensor, expected[name])


# ---------------------------------------------------------------------- validation


def _corrupt(payload: dict[str, np.ndarray], key: str, value: np.ndarray | None) -> dict[str, np.ndarray]:
    corrupted = dict(payload)
    if value is None:
        del corrupted[key]
    else:
        corrupted[key] = value
    return corrupted


def _qsgd_payload() -> dict[str, np.ndarray]:
    return encode_update(_random_update({"layer.w": (20,)}), QSGD4, np.random.default_rng(0))


def _topk_payload() -> dict[str, np.ndarray]:
    return encode_update(_random_update({"layer.w": (20,)}), TOPK10, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("make_payload", "spec", "key", "value", "message"),
    [
        (_qsgd_payload, QSGD4, "layer.w::levels", np.zeros(5, np.uint8), "levels has 5 elements"),
        (_qsgd_payload, QSGD4, "layer.w::signs", np.zeros(3, np.int8), "signs has dtype int8"),
        (_qsgd_payload, QSGD4, "layer.w::norm", np.array([np.nan], np.float32), "norm must be finite"),
        (_qsgd_payload, QSGD4, "layer.w::norm", np.array([-1.0], np.float32), "norm must be finite and >= 0"),
        (_qsgd_payload, QSGD4, "layer.w::norm", np.array([1.0], np.float64), "norm has dtype float64"),
        (_qsgd_payload, QSGD4, "layer.w::levels", None, "missing payload keys"),
        (_topk_payload, TOPK10, "layer.w::values", np.array([np.inf, 1.0], np.float32), "non-finite values"),
        (_topk_payload, TOPK10, "layer.w::values", np.ones(3, np.float32), "values has 3 elements"),
        # 5-bit indices of [3, 31] for a 20-vector: 31 is out of range.
        (_topk_payload, TOPK10, "layer.w::indices", pack_bits([3, 31], 5), "index 31 out of range"),
        (_topk_payload, TOPK10, "layer.w::indices", pack_bits([9, 4], 5), "strictly increasing"),
        (_topk_payload, TOPK10, "layer.w::indices", pack_bits([3, 4], 5).view(np.int8), "dtype int8"),
    ],
)
def test_decode_rejects_corrupt_payload_naming_the_tensor(
    make_payload, spec: CodecSettings, key: str, value: np.ndarray | None, message: str
) -> None:
    payload = _corrupt(make_payload(), key, value)
    with pytest.raises(ValueError, match=f"tensor 'layer.w': .*{message}"):
        decode_update(payload, {"layer.w": (20,)}, spec)


def test_decode_rejects_level_above_s() -> None:
    spec = CodecSettings("qsgd", levels=5)  # 3 level bits can encode 6 and 7
    payload = encode_update({"t": np.ones(4, np.float32)}, spec, np.random.default_rng(0))
    payload["t::levels"] = pack_bits([7, 0, 0, 0], 3)
    with pytest.raises(ValueError, match="tensor 't': level 7 exceeds the 5 qsgd levels"):
        decode_update(payload, {"t": (4,)}, spec)


def test_decode_rejects_bad_plain_tensor() -> None:
    spec = CodecSettings()
    with pytest.raises(ValueError, match="tensor 'b': values has 5 elements, expected 6"):
        decode_update({"b": np.zeros(5, np.float32)}, {"b": (2, 3)}, spec)
    with pytest.raises(ValueError, match="tensor 'b': non-finite values"):
        decode_update({"b": np.full(6, np.nan, np.float32)}, {"b": (2, 3)}, spec)


def test_decode_rejects_unexpected_keys() -> None:
    payload = _qsgd_payload()
    payload["other.w::norm"] = np.ones(1, np.float32)
    with pytest.raises(ValueError, match=r"unexpected payload keys \['other.w::norm'\]"):
        decode_update(payload, {"layer.w": (20,)}, QSGD4)


@pytest.mark.parametrize("spec", [CodecSettings(), QSGD4, TOPK10], ids=lambda s: s.compression)
def test_encode_rejects_non_finite_update(spec: CodecSettings) -> None:
    v = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    with pytest.raises(ValueError, match="tensor 'bad': non-finite values"):
        encode_update({"ok": np.ones(2, np.float32), "bad": v}, spec, np.random.default_rng(0))


# ------------------------------------------------------------------ error feedback


@pytest.mark.parametrize("spec", [QSGD4, TOPK10, CodecSettings()], ids=lambda s: s.compression)
def test_error_feedback_residual_accounts_for_everything(spec: CodecSettings) -> None:
    shapes = {"w": (30, 10), "b": (10,)}
    rng = np.random.default_rng(9)
    residual = None
    for round_num in range(3):
        delta = _random_update(shapes, seed=round_num)
        payload, new_residual = apply_error_feedback(delta, residual, spec, rng)
        decoded = decode_update(payload, shapes, spec)
        for name in shapes:
            carried = 0.0 if residual is None else residual[name]
            np.testing.assert_allclose(
                new_residual[name] + decoded[name], delta[name] + carried, rtol=0, atol=1e-5
            )
        residual = new_residual


def test_error_feedback_delivers_topk_mass_over_rounds() -> None:
    # Repeating the same delta, the sum of what top-k sent must track the sum of
    # deltas: the gap is exactly the (bounded) residual, not growing with rounds.
    delta = {"w": np.random.default_rng(0).standard_normal(200).astype(np.float32)}
    residual = None
    sent = np.zeros(200, dtype=np.float64)
    rounds = 50
    for _ in range(rounds):
        payload, residual = apply_error_feedback(delta, residual, TOPK10, np.random.default_rng(0))
        sent += decode_update(payload, {"w": (200,)}, TOPK10)["w"]
    np.testing.assert_allclose(sent + residual["w"], rounds * delta["w"].astype(np.float64), atol=1e-3)
    assert np.abs(residual["w"]).max() < 0.2 * rounds * np.abs(delta["w"]).max()


def test_error_feedback_rejects_mismatched_residual() -> None:
    delta = {"w": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match="tensor 'w': residual shape"):
        apply_error_feedback(delta, {"w": np.zeros(4, np.float32)}, QSGD4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="not in delta"):
        apply_error_feedback(delta, {"v": np.zeros(3, np.float32)}, QSGD4, np.random.default_rng(0))
