"""The array records of a node's train reply: its model, or its compressed update, and its extra records (SPEC 3.5).

Without compression the reply carries the local model (MODEL) and the update
rule's extra records unchanged. With `qsgd` or `topk` it carries the packed
payload of `Q(w_i - w)` (COMPRESSED_UPDATE) instead of the model, and every
extra record shaped like model tensors (control-variate deltas, dynamic
corrections) goes through the same codec (see common/uplink/wire.py); under
whole-update qsgd an extra record also names its tensors in a bit mask.

With the codec's error feedback, what the codec dropped is kept in the node's
`Context.state` (common/uplink/encoding.py). Stochastic rounding is seeded by
(seed, round, partition, record), so replies are reproducible.

The codec is the server's: the ClientApp reads it from the train message's
config (common/run/client_settings.py `message_codec`), never from its run
config, so the node encodes with the codec the server decodes with.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from common.protocol import COMPRESSED_UPDATE, MODEL
from common.records import from_record, to_record
from common.algorithms.codec_settings import CodecSettings
from common.uplink.encoding import encode_with_state
from common.uplink.wire import MODEL_BUFFERS, TENSOR_MASK, compressed_name, encoding_rng, is_compressible, tensor_mask


def uplink_records(
    codec: CodecSettings,
    seed: int,
    state: RecordDict,
    global_weights: Mapping[str, np.ndarray],
    local_weights: Mapping[str, np.ndarray],
    outgoing: Mapping[str, ArrayRecord],
    server_round: int,
    partition_id: int,
    parameters: Collection[str] | None = None,
) -> dict[str, ArrayRecord]:
    """The array records of a train reply: the model (or its compressed update) and the extra records.

    `codec` is the server's (`message_codec` of the train message); `seed` is the run's, which with the
    round, the partition and the record seeds the codec's stochastic rounding. `parameters` names the model's
    trainable arrays (`module_parameter_names`; None: every array). Compressed, only they form the update
    `Q(w_i - w)`; the other arrays, the buffers, travel uncompressed in MODEL_BUFFERS.
    """
    if codec.compression == "none":
        return {MODEL: to_record(local_weights), **outgoing}
    trainable = set(global_weights) if parameters is None else set(parameters)
    delta = {name: (local_weights[name] - global_weights[name]).astype(np.float32)
             for name in global_weights if name in trainable}
    buffers = {name: local_weights[name] for name in global_weights if name not in trainable}
    records = {
        COMPRESSED_UPDATE: to_record(encode_with_state(
            delta, codec, encoding_rng(seed, server_round, partition_id, 0), state, MODEL,
        )),
    }
    if buffers:
        records[MODEL_BUFFERS] = to_record(buffers)
    for stream, (name, record) in enumerate(outgoing.items(), start=1):
        values = from_record(record)
        if not is_compressible(values, global_weights):
            records[name] = record
            continue
        rng = encoding_rng(seed, server_round, partition_id, stream)
        payload = encode_with_state(values, codec, rng, state, name)
        if codec.whole_vector:  # the keys of a whole-update payload do not name its tensors
            payload[TENSOR_MASK] = tensor_mask(values, global_weights)
        records[compressed_name(name)] = to_record(payload)
    return records
