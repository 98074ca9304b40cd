"""Client side of the uplink: what a train reply carries, compressed when the run asks for it (SPEC 3.5).

Without compression the reply carries the local model (MODEL) and the update
rule's extra records unchanged. With `qsgd` or `topk` it carries the packed
payload of `Q(w_i - w)` (COMPRESSED_UPDATE) instead of the model, and every
extra record shaped like model tensors (control-variate deltas, dynamic
corrections) goes through the same codec (see common/run/uplink.py); under
whole-update qsgd an extra record also names its tensors in a bit mask.

With `error-feedback`, what the codec dropped is kept in the node's
`Context.state` (one residual per record) and added to the next update this
node sends (Seide et al., 2014; Karimireddy et al., 2019). A node that misses
rounds keeps its residual until it takes part again. Stochastic rounding is
seeded by (seed, round, partition, record), so replies are reproducible.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from common.algorithms.compression import CompressionSpec, apply_error_feedback, encode_update
from common.run.config import RunConfig
from common.protocol import COMPRESSED_UPDATE, MODEL
from common.records import Weights, from_record, to_record
from common.run.uplink import MODEL_BUFFERS, TENSOR_MASK, compressed_name, compression_spec, encoding_rng, is_compressible, tensor_mask

# Context.state key prefix of the error-feedback residual of one uplink record.
STATE_RESIDUAL_PREFIX = "uplink-residual:"


@dataclass
class EncodedUpdate:
    """A codec payload (put it in a reply as `ArrayRecord`) and, with error feedback, the new residual."""

    payload: Weights
    residual: Weights | None = None


def encode_delta(
    delta: Mapping[str, np.ndarray], codec: CompressionSpec, rng: np.random.Generator,
    residual: Mapping[str, np.ndarray] | None = None, error_feedback: bool = False,
) -> EncodedUpdate:
    """The codec payload of `delta` (`w_i - w` by name); with error feedback, of `delta + residual`.

    The server decodes the payload with `common.algorithms.compression.decode_update`
    (fedsynth's strategies do so for the COMPRESSED_UPDATE record). Tensors are
    encoded in sorted name order: the codec draws its random numbers tensor by
    tensor, and a model restored from a checkpoint may list its tensors in
    another order than a freshly built one. With `error_feedback`, keep the
    returned residual (in `Context.state`) and pass it in next time.
    """
    values = dict(sorted(delta.items()))
    if not error_feedback:
        return EncodedUpdate(encode_update(values, codec, rng))
    payload, new_residual = apply_error_feedback(values, residual, codec, rng)
    return EncodedUpdate(payload, new_residual)


def encode_with_state(
    values: Mapping[str, np.ndarray], spec: CompressionSpec, rng: np.random.Generator,
    state: RecordDict, record_name: str, error_feedback: bool,
) -> Weights:
    """`encode_delta` with the error-feedback residual of record `record_name` kept in node state."""
    key = STATE_RESIDUAL_PREFIX + record_name
    stored = state.array_records.get(key) if error_feedback else None
    encoded = encode_delta(values, spec, rng, from_record(stored) if stored is not None else None, error_feedback)
    if encoded.residual is not None:
        state[key] = to_record(encoded.residual)
    return encoded.payload


def uplink_records(
    cfg: RunConfig,
    state: RecordDict,
    global_weights: Mapping[str, np.ndarray],
    local_weights: Mapping[str, np.ndarray],
    outgoing: Mapping[str, ArrayRecord],
    server_round: int,
    partition_id: int,
    parameters: Collection[str] | None = None,
) -> dict[str, ArrayRecord]:
    """The array records of a train reply: the model (or its compressed update) and the extra records.

    `parameters` names the model's trainable arrays (`module_parameter_names`;
    None: every array). Compressed, only they form the update `Q(w_i - w)`;
    the other arrays, the buffers, travel uncompressed in MODEL_BUFFERS.
    """
    spec = compression_spec(cfg)
    if spec.method == "none":
        return {MODEL: to_record(local_weights), **outgoing}
    trainable = set(global_weights) if parameters is None else set(parameters)
    delta = {name: (local_weights[name] - global_weights[name]).astype(np.float32)
             for name in global_weights if name in trainable}
    buffers = {name: local_weights[name] for name in global_weights if name not in trainable}
    records = {
        COMPRESSED_UPDATE: to_record(encode_with_state(
            delta, spec, encoding_rng(cfg.seed, server_round, partition_id, 0), state, MODEL, cfg.error_feedback,
        )),
    }
    if buffers:
        records[MODEL_BUFFERS] = to_record(buffers)
    for stream, (name, record) in enumerate(outgoing.items(), start=1):
        values = from_record(record)
        if not is_compressible(values, global_weights):
            records[name] = record
            continue
        rng = encoding_rng(cfg.seed, server_round, partition_id, stream)
        payload = encode_with_state(values, spec, rng, state, name, cfg.error_feedback)
        if spec.whole_vector:  # the keys of a whole-update payload do not name its tensors
            payload[TENSOR_MASK] = tensor_mask(values, global_weights)
        records[compressed_name(name)] = to_record(payload)
    return records
