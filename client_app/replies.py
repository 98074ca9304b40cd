"""The train replies a Flower developer's ClientApp sends to fedsynth's strategies, built from a trained model.

A fedsynth strategy reads a train reply as docs/library.md's reply contract
says: the local model as `arrays` (or, with an uplink codec on, the codec's
payload of the parameters' update as `compressed-update` and the model's
buffers as they are in `model-buffers`), the `metrics` with `num-examples`
and the training loss, and the algorithm's extra record (SCAFFOLD's
`scaffold-delta-c`, FedLESAM-D's `dynamic-correction`, FedSMOO's
`perturbation-dual`). `train_reply` builds all of it from the message the
node answers and the model it trained, so a ClientApp never assembles the
records by hand and cannot get the split between parameters and buffers
wrong:

    result = train_fedsam(net, trainloader, rho=rule_settings(config, SAMSettings).sam_rho, optimizer=...)
    return train_reply(msg, net, result, num_examples=len(trainloader.dataset), state=context.state)

The codec is the one the strategy sent in the message's config
(`message_codec`), so the node never repeats the server's settings.
Only the trainable parameters (`named_parameters`) go through the codec:
BatchNorm's running statistics are not an update, and its integer
`num_batches_tracked` cannot be quantised (common/uplink/wire.py says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from torch import nn

from client_app.rules import DynamicResult, ScaffoldResult, SmooResult
from client_app.training import TrainResult
from common.protocol import (
    COMPRESSED_UPDATE,
    DYNAMIC_CORRECTION,
    MODEL,
    PERTURBATION_DUAL,
    SCAFFOLD_CONTROL_DELTA,
)
from common.records import Weights, from_record, model_weights, module_parameter_names, to_record
from common.algorithms.codec_settings import CodecSettings
from common.run.client_settings import message_codec
from common.uplink.encoding import encode_delta
from common.uplink.wire import MODEL_BUFFERS

# Key of the error feedback residual in the node's Context.state (kept between rounds by `train_reply`).
RESIDUAL_STATE_KEY = "fedsynth-uplink-residual"

Arrays = ArrayRecord | Mapping[str, np.ndarray]


@dataclass
class CompressedUpdate:
    """The records of a compressed train reply and the error feedback residual to keep (None without it)."""

    records: dict[str, ArrayRecord] = field(default_factory=dict)
    residual: Weights | None = None


def compressed_update_records(model: nn.Module, received: Arrays, codec: CodecSettings,
                              rng: np.random.Generator,
                              residual: Mapping[str, np.ndarray] | None = None) -> CompressedUpdate:
    """`compressed-update` (the codec's payload of `w_i - w` over `model`'s trainable parameters) and
    `model-buffers` (its buffers, BatchNorm's statistics, as they are; absent for a model without buffers).

    `received` is the global model of the train message (`msg.content["arrays"]`); `codec` the strategy's
    (`message_codec(msg.content["config"])`); with its error feedback, `residual` is the one kept last time (None on
    the first round). A strategy decodes the payload with the same codec (`decode_update(payload, shapes,
    codec)`).
    """
    if codec.compression == "none":
        raise ValueError("the codec is 'none': send the model as 'arrays' (train_reply does so)")
    global_weights = from_record(received) if isinstance(received, ArrayRecord) else dict(received)
    local = model_weights(model)
    trainable = set(module_parameter_names(model))
    missing = sorted(trainable - set(global_weights))
    if missing:
        raise ValueError(f"the received model lacks the parameters {missing[:3]} of the trained one")
    delta = {name: (local[name] - global_weights[name]).astype(np.float32) for name in local if name in trainable}
    encoded = encode_delta(delta, codec, rng, residual)
    records = {COMPRESSED_UPDATE: to_record(encoded.payload)}
    buffers = {name: value for name, value in local.items() if name not in trainable}
    if buffers:
        records[MODEL_BUFFERS] = to_record(buffers)
    return CompressedUpdate(records, encoded.residual)


def result_records(result: TrainResult) -> dict[str, Weights]:
    """The extra record a rule's result must send: SCAFFOLD's (and FedLESAM-S's, FedGAMMA's) `scaffold-delta-c`,
    FedSMOO's `perturbation-dual`, FedLESAM-D's `dynamic-correction`; none for a plain `TrainResult`."""
    if isinstance(result, ScaffoldResult):
        return {SCAFFOLD_CONTROL_DELTA: result.control_delta}
    if isinstance(result, SmooResult):  # before DynamicResult: FedSMOO's result is one too, but sends its dual
        return {PERTURBATION_DUAL: result.perturbation_dual}
    if isinstance(result, DynamicResult):
        return {DYNAMIC_CORRECTION: result.correction}
    return {}


def _as_record(value: Arrays) -> ArrayRecord:
    return value if isinstance(value, ArrayRecord) else to_record(value)


def _encoding_rng(msg: Message, seed: int) -> np.random.Generator:
    server_round = int(msg.content["config"].get("server-round", 0)) if "config" in msg.content.config_records else 0
    return np.random.default_rng([seed, server_round, msg.metadata.dst_node_id])


def train_reply(msg: Message, model: nn.Module, result: TrainResult | None = None, *, num_examples: int,
                train_loss: float | None = None, metrics: Mapping[str, int | float] | None = None,
                records: Mapping[str, Arrays] | None = None, state: RecordDict | None = None,
                seed: int = 0) -> Message:
    """The reply to a train message of any centralized fedsynth strategy, from the model the node trained.

    - `arrays`: `model`'s state dict when the message's codec is `none`; else `compressed-update` and
      `model-buffers` (`compressed_update_records`), the stochastic rounding seeded by `(seed, round,
      node id)`, and with the codec's error feedback on the residual kept in `state` (the node's `Context.state`).
    - `metrics`: `num-examples` (int > 0, the reply's weight), `train-loss` (`train_loss`, else
      `result.train_loss`), `result.metrics` and your own `metrics` (finite numbers).
    - the extra record `result` carries (`result_records`), and your own `records` (ArrayRecords or dicts of
      numpy arrays), e.g. FedSynSAM's metric is a `metrics` entry: `{"synthetic-examples": n}`.
    """
    if not isinstance(num_examples, int) or isinstance(num_examples, bool) or num_examples <= 0:
        raise ValueError(f"num_examples must be an int > 0 (the reply's weight), got {num_examples!r}")
    loss = train_loss if train_loss is not None else (result.train_loss if result is not None else None)
    if loss is None:
        raise ValueError("give train_loss, or the rule's result whose train_loss the reply reports")
    config = msg.content["config"] if "config" in msg.content.config_records else None
    codec = message_codec(config) if config is not None else CodecSettings()
    content = RecordDict()
    if codec.compression == "none":
        content[MODEL] = ArrayRecord(model.state_dict())
    else:
        if codec.error_feedback and state is None:
            raise ValueError("the strategy's codec uses error feedback: pass the node's Context.state as `state`, "
                             "where the residual is kept between rounds")
        kept = state.array_records.get(RESIDUAL_STATE_KEY) if codec.error_feedback else None
        compressed = compressed_update_records(model, msg.content[MODEL], codec, _encoding_rng(msg, seed),
                                               from_record(kept) if kept is not None else None)
        for name, record in compressed.records.items():
            content[name] = record
        if compressed.residual is not None:
            state[RESIDUAL_STATE_KEY] = to_record(compressed.residual)
    reply_metrics: dict[str, int | float] = {"num-examples": num_examples, "train-loss": float(loss)}
    if result is not None:
        reply_metrics.update(result.metrics)
    reply_metrics.update(metrics or {})
    content["metrics"] = MetricRecord(reply_metrics)
    extra = {**(result_records(result) if result is not None else {}), **(records or {})}
    for name, value in extra.items():
        content[name] = _as_record(value)
    return Message(content, reply_to=msg)


def scaffold_reply(msg: Message, model: nn.Module, result: ScaffoldResult, *, num_examples: int,
                   state: RecordDict | None = None, seed: int = 0) -> Message:
    """SCAFFOLD's (and FedLESAM-S's, FedGAMMA's) reply: `train_reply` with `result.control_delta` as
    `scaffold-delta-c`. Keep `result.control` (c_i) in `Context.state` yourself for the next round."""
    if not isinstance(result, ScaffoldResult):
        raise TypeError(f"scaffold_reply takes the ScaffoldResult of train_scaffold, got {type(result).__name__}")
    return train_reply(msg, model, result, num_examples=num_examples, state=state, seed=seed)
