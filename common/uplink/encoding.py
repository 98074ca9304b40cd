"""The client's side of the uplink codec with error feedback (SPEC 3.5): encode an update, keep what was dropped.

With error feedback (the codec's `error_feedback`), what the codec dropped is kept in the node's
`Context.state` (one residual per record) and added to the next update this
node sends (Seide et al., 2014; Karimireddy et al., 2019). A node that misses
rounds keeps its residual until it takes part again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import RecordDict

from common.records import Weights, from_record, to_record
from common.uplink.payloads import decode_update, encode_update
from common.algorithms.codec_settings import CodecSettings

# Context.state key prefix of the error feedback residual of one uplink record.
STATE_RESIDUAL_PREFIX = "uplink-residual:"


def apply_error_feedback(
    delta: Mapping[str, np.ndarray],
    residual: Mapping[str, np.ndarray] | None,
    codec: CodecSettings,
    rng: np.random.Generator,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Compress ``delta + residual`` and return ``(payload, new_residual)``.

    Error feedback re-injects what compression dropped last round, so biased
    compressors such as top-k still deliver every coordinate eventually.
    ``new_residual = (delta + residual) − decode(payload)``, in float32. A
    ``None`` residual or a missing tensor counts as zero (the first round).
    """
    residual = residual or {}
    extra = sorted(set(residual) - set(delta))
    if extra:
        raise ValueError(f"residual has tensors not in delta: {extra}")
    corrected: dict[str, np.ndarray] = {}
    for name, tensor in delta.items():
        value = np.asarray(tensor, dtype=np.float32)
        if name in residual:
            carried = np.asarray(residual[name], dtype=np.float32)
            if carried.shape != value.shape:
                raise ValueError(
                    f"tensor {name!r}: residual shape {carried.shape} != delta shape {value.shape}"
                )
            value = value + carried
        corrected[name] = value
    payload = encode_update(corrected, codec, rng)
    decoded = decode_update(payload, {k: v.shape for k, v in corrected.items()}, codec)
    new_residual = {name: corrected[name] - decoded[name] for name in corrected}
    return payload, new_residual


@dataclass
class EncodedUpdate:
    """A codec payload (put it in a reply as `ArrayRecord`) and, with error feedback, the new residual."""

    payload: Weights
    residual: Weights | None = None


def encode_delta(
    delta: Mapping[str, np.ndarray], codec: CodecSettings, rng: np.random.Generator,
    residual: Mapping[str, np.ndarray] | None = None,
) -> EncodedUpdate:
    """The codec payload of `delta` (`w_i - w` by name); with error feedback, of `delta + residual`.

    The server decodes the payload with `common.uplink.payloads.decode_update`
    (fedsynth's strategies do so for the COMPRESSED_UPDATE record). Tensors are
    encoded in sorted name order: the codec draws its random numbers tensor by
    tensor, and a model restored from a checkpoint may list its tensors in
    another order than a freshly built one. With the codec's `error_feedback`,
    keep the returned residual (in `Context.state`) and pass it in next time.
    """
    values = dict(sorted(delta.items()))
    if not codec.error_feedback:
        return EncodedUpdate(encode_update(values, codec, rng))
    payload, new_residual = apply_error_feedback(values, residual, codec, rng)
    return EncodedUpdate(payload, new_residual)


def encode_with_state(
    values: Mapping[str, np.ndarray], codec: CodecSettings, rng: np.random.Generator,
    state: RecordDict, record_name: str,
) -> Weights:
    """`encode_delta` with the error feedback residual of record `record_name` kept in node state."""
    key = STATE_RESIDUAL_PREFIX + record_name
    stored = state.array_records.get(key) if codec.error_feedback else None
    encoded = encode_delta(values, codec, rng, from_record(stored) if stored is not None else None)
    if encoded.residual is not None:
        state[key] = to_record(encoded.residual)
    return encoded.payload
