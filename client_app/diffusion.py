"""Client side of the diffusion task: DDPM training under any client rule, and FedDDPM's warmup.

The ClientApp's `train` hands diffusion runs (a `unet*` model) to
`diffusion_train`. It differs from classification in three places only:
- the data: the node's images scaled to [-1, 1] at the task's image size
  (labels are kept for the step count but never used);
- the loss: `LocalJob.loss_fn` is the DDPM epsilon loss with noise and
  timesteps drawn from a generator seeded by (seed, round, partition), so the
  registered client rules (FedAvg, FedProx, SCAFFOLD, FedSAM, MoFedSAM, ...)
  train DDPMs unchanged;
- no local classifier evaluation of the received model.

A message whose config has `phase = "warmup"` is FedDDPM's warmup: the node
trains its own DDPM from the received initial model for the warm-up's epochs over
its local data (or its steps: `WarmupSettings`) at the message's learning rate, with the
message's local training recipe otherwise, and uploads it once, uncompressed, with its
sample count m_i. They come from the message, as a round's rate and codec do
(client_app/app.py); a warm-up without them is refused.

The `fid_stats` query returns the sums (sum f, sum f f^T, n) of the features
of the node's training images under the extractor the server names (and, for
the classifier and random extractors, sends): enough for the server to fit the
pooled Gaussian of all nodes' features without seeing an image. The server asks
once per run: for FID when it holds no images (`partition = "node"`), and for
FedDDPM+'s QuickTest with `quicktest-reference = "clients"`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict

from client_app.training import LocalJob, plain_rule, run_local_steps
from client_app.registry import client_update
from client_app.train_reply import uplink_records
from common.keys import node_keys, require_settings
from common.algorithms.local_training_settings import LOCAL_STEPS_METRIC, ROUND_LR_KEY, LocalTrainingSettings
from common.run.client_settings import message_codec, rule_settings
from common.run.config import RunConfig
from common.data.datasets import run_dataset_info
from common.models.diffusion import image_side, loss_for, seeded_generator, to_diffusion_input
from common.models.diffusion_settings import WarmupSettings
from common.metrics.fid import feature_sums
from common.metrics.fid_features import FeatureExtractor, extractor_from_weights, inception_extractor
from common.data.partition import ClientData
from common.protocol import DIFFUSION_PHASE, FID_EXTRACTOR, FID_SUMS, MODEL, WARMUP_PHASE
from common.records import from_record, model_weights, module_parameter_names, to_record

# Fourth seed component of the loss generator, so warmup and round noise never coincide.
_ROUND_STREAM, _WARMUP_STREAM = 1, 2


def diffusion_tensors(cfg: RunConfig, data: ClientData, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The node's training images in [-1, 1] at the task's size, and its labels (unused by the loss)."""
    x = torch.from_numpy(to_diffusion_input(data.x_train, image_side(cfg))).to(device)
    y = torch.from_numpy(data.y_train.astype("int64")).to(device)
    return x, y


# what a warm-up message's config carries (server_app/strategies/fedddpm_warmup.py sends them): the round, its
# rate and the warm-up's length
WARMUP_KEYS = ("server-round", ROUND_LR_KEY, *node_keys(WarmupSettings))


def is_warmup(config: Mapping[str, Any]) -> bool:
    """Whether a train message's config is FedDDPM's warm-up (`phase = "warmup"`)."""
    return str(config.get(DIFFUSION_PHASE, "")) == WARMUP_PHASE


def warmup_recipe(config: Mapping[str, Any]) -> LocalTrainingSettings:
    """The local training recipe of the warmup: the message's, its rate included (the job's: `LocalJob.lr`), for
    the warm-up's steps or epochs (`WarmupSettings`); ValueError names a key the message lacks, ConfigError a bad
    value."""
    require_settings(config, WARMUP_KEYS)
    warmup = rule_settings(config, WarmupSettings)
    return dataclasses.replace(rule_settings(config, LocalTrainingSettings), local_epochs=warmup.warmup_epochs,
                               local_steps=warmup.warmup_steps)


def diffusion_train(msg: Message, context: Context, cfg: RunConfig, partition_id: int, data: ClientData,
                    model: torch.nn.Module, device: torch.device) -> Message:
    """One train message of a diffusion run: a round of the algorithm's client rule, or the warmup."""
    config = msg.content.config_records["config"]
    server_round = int(config["server-round"])
    warmup = is_warmup(config)
    x, y = diffusion_tensors(cfg, data, device)
    job = LocalJob(
        cfg=cfg, server_round=server_round, partition_id=partition_id, model=model, x=x, y=y, device=device,
        incoming=msg.content, state=context.state, recipe=warmup_recipe(config) if warmup else None,
        loss_fn=loss_for(cfg, seeded_generator(cfg.seed, server_round, partition_id,
                                               _WARMUP_STREAM if warmup else _ROUND_STREAM)),
    )
    result = run_local_steps(job, plain_rule(job)) if warmup else client_update(cfg)(job)
    metrics = {
        "num-examples": int(len(y)),
        "partition-id": partition_id,
        "train-loss": result.train_loss,
        LOCAL_STEPS_METRIC: result.num_steps,
        **result.metrics,
    }
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if warmup:
        content[MODEL] = to_record(model_weights(model))
        return Message(content, reply_to=msg)
    received = from_record(msg.content.array_records[MODEL])
    for name, record in uplink_records(message_codec(config), cfg.seed, context.state, received, model_weights(model),
                                       result.outgoing, server_round, partition_id,
                                       module_parameter_names(model)).items():
        content[name] = record
    return Message(content, reply_to=msg)


def received_extractor(msg: Message, cfg: RunConfig, device: torch.device) -> FeatureExtractor:
    """The extractor of a `fid_stats` query: the network the server sent (classifier or random), or Inception
    from this node's own weights file."""
    if cfg.fid_features == "inception":
        return inception_extractor(cfg.cache_dir, device)
    record = msg.content.array_records.get(FID_EXTRACTOR)
    if record is None:
        raise ValueError(f"the fid_stats query lacks the '{FID_EXTRACTOR}' record (the {cfg.fid_features} "
                         "extractor's weights)")
    return extractor_from_weights(cfg.fid_features, from_record(record), run_dataset_info(cfg).channels, device)


def feature_sums_reply(msg: Message, cfg: RunConfig, partition_id: int, data: ClientData, device: torch.device) -> Message:
    """(sum f, sum f f^T) of this node's training images as FID_SUMS, n as `num-examples`."""
    extractor = received_extractor(msg, cfg, device)
    sum_f, sum_ff, count = feature_sums(extractor.features(to_diffusion_input(data.x_train, image_side(cfg))))
    content = RecordDict({
        FID_SUMS: to_record({"sum-f": sum_f, "sum-ff": sum_ff}),
        "metrics": MetricRecord({"num-examples": int(count), "partition-id": partition_id}),
    })
    return Message(content, reply_to=msg)
