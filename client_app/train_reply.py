"""The array records of a node's train reply: its model, or its compressed update, and its extra records (SPEC 3.5).

Without compression the reply carries the local model (MODEL) and the update
rule's extra records unchanged. With `qsgd` or `topk` it carries the packed
payload of `Q(w_i - w)` (COMPRESSED_UPDATE) instead of the model, and every
extra record shaped like model tensors (control-variate deltas, dynamic
corrections) goes through the same codec (see common/uplink/wire.py); under
whole-update qsgd an extra record also names its tensors in a bit mask.

With `error-feedback`, what the codec dropped is kept in the node's
`Context.state` (common/uplink/encoding.py). Stochastic rounding is seeded by
(seed, round, partition, record), so replies are reproducible.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from common.protocol import COMPRESSED_UPDATE, MODEL
from common.records import from_record, to_record
from common.run.client_settings import compression_spec
from common.run.config import RunConfig
from common.uplink.encoding import encode_with_state
from common.uplink.wire import MODEL_BUFFERS, TENSOR_MASK, compressed_name, encoding_rng, is_compressible, tensor_mask


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
