"""The ClientApp: a start-of-run handshake, local training and local evaluation.

Every message validates the run config and the node config first, so a bad
value stops the node with a message naming the key. In deployment each message
runs in a new process: the node reads only its cached partition, and anything
that must survive between rounds lives in `Context.state`.

A train message is read as a Flower developer's client reads it
(docs/library.md, "What each strategy sends and expects"): the round's learning
rate, the local training recipe (the step count, batch, momentum, weight decay,
clipping and optimizer: common/algorithms/local_training_settings.py), the uplink
codec and every setting of the algorithm's rule come from the message's
config, which the server fills (SPEC 3: "every setting a client needs ... sent
in the train message's ConfigRecord"). Before it trains, the node checks that
config against the run config's own schema and checks
(common/run/client_settings.py `check_train_settings`): a missing, mistyped,
NaN or infinite, or out-of-range value is refused naming the key, never
completed from the run config, and the error reply is the server's record of
that node's failure with its reason. What stays the node's: its data, device
and threads (node config), and from the run config the task (dataset, model,
seed, partitioning), which client rule runs (`algorithm`, `cog = true`), and where
FedCOG's image grid goes (`run-name`, `results-dir`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.decentralized import gossip_start_model, is_gossip_round
from client_app.diffusion import WARMUP_KEYS, diffusion_train, feature_sums_reply, is_warmup
from client_app.threads import torch_threads, usable_cores
from client_app.training import LocalJob
from client_app.registry import CLIENT_UPDATES, client_update
from client_app.train_reply import uplink_records
from common.algorithms.local_training_settings import LOCAL_STEPS_METRIC
from common.algorithms.plugins import algorithm_of
from common.imports import node_imports, site_imports
from common.run.client_settings import (
    RECIPE_KEYS, ROUND_KEYS, check_train_settings, client_keys, message_codec, own_message_keys, own_message_settings,
    require_settings,
)
from common.data.settings import NODE_PARTITION
from common.run.config import ConfigError, RunConfig, cog_enabled, parse_run_config
from common.data.datasets import run_dataset_info
from common.data.hf_datasets import is_hf
from common.models.diffusion import is_diffusion
from common.metrics.evaluation import as_tensors, evaluate_model, resolve_device
from common.data.partition import ClientData, PartitionSpec, load_client_data
from common.protocol import CLIENT_STAT_PREFIX, FID_STATS, NODE_STATE_PREFIX
from common.records import Weights, check_weights, from_record, load_weights, model_weights, module_parameter_names
from common.data.site_data import fill_path_template, load_site_data, site_key, site_spec
from common.run.task import check_task_model, make_model



def site_imports_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Handle every message with the import paths its run config names resolved as this node permits
    (common/imports.py: fedsynth's own packages, the run's Flower app, node config `allowed-imports` and the
    host's `FEDSYNTH_ALLOWED_IMPORTS`): a path outside them is refused, naming the node, before any import."""
    with site_imports(node_imports(context.node_id, context.node_config)):
        return call_next(msg, context)


app = ClientApp(mods=[site_imports_mod])


@dataclass(frozen=True)
class NodeSettings:
    """This node's part of the federation, from its node config."""

    partition_id: int  # with partition = node and no partition-id: a stable id from the node's name
    num_partitions: int  # 0: not known (partition = node without partition ids)
    data_dir: str
    cache_dir: str
    device: torch.device
    torch_threads: int  # see client_app/threads.py
    name: str = ""  # node config `name`, labels the node in logs and results
    dataset_path: str = ""  # partition = node: the node's own data


def _node_int(node_config: dict, key: str) -> int:
    if key not in node_config:
        raise ConfigError(f"node config key '{key}' is missing; start the SuperNode with "
                          f"--node-config \"partition-id=<i> num-partitions=<N>\" (or run with partition = "
                          f"\"node\" and --node-config \"dataset-path=<folder>\": the node's own data)")
    value = node_config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"node config key '{key}' = {value!r} must be an integer")
    return value


def _node_identity(node_config: dict, cfg: RunConfig) -> tuple[int, int, str, str]:
    """(partition id, partition count, name, dataset path) of this node.

    With partition = node, partition ids are optional: a node without one is known by its
    `name` (default: host and dataset path) and a stable id derived from it.
    """
    if cfg.partition != NODE_PARTITION:
        partition_id = _node_int(node_config, "partition-id")
        num_partitions = _node_int(node_config, "num-partitions")
        if num_partitions < 1 or not 0 <= partition_id < num_partitions:
            raise ConfigError(
                f"node config 'partition-id' = {partition_id} must be in 0..num-partitions-1 "
                f"(num-partitions = {num_partitions})"
            )
        return partition_id, num_partitions, str(node_config.get("name", f"partition-{partition_id}")), ""
    try:
        path = fill_path_template(str(node_config.get("dataset-path", cfg.dataset_path)), node_config)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    has_id = "partition-id" in node_config
    partition_id = _node_int(node_config, "partition-id") if has_id else None
    num_partitions = _node_int(node_config, "num-partitions") if "num-partitions" in node_config else 0
    default_name = f"partition-{partition_id}" if has_id else f"{socket.gethostname()}:{path}"
    name = str(node_config.get("name", default_name))
    return (partition_id if partition_id is not None else site_key(name)), num_partitions, name, path


def node_settings(context: Context, cfg: RunConfig) -> NodeSettings:
    """Read and check the node config; node values override the run config's."""
    node_config = dict(context.node_config)
    partition_id, num_partitions, name, dataset_path = _node_identity(node_config, cfg)
    device_name = str(node_config.get("device", cfg.device))
    try:
        device = resolve_device(device_name)
    except ValueError as err:
        raise ConfigError(f"node config key 'device': {err}") from None
    try:
        threads = torch_threads(node_config, os.environ, usable_cores())
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return NodeSettings(
        partition_id=partition_id,
        num_partitions=num_partitions,
        data_dir=str(node_config.get("data-dir", cfg.data_dir)),
        cache_dir=str(node_config.get("cache-dir", cfg.cache_dir)),
        device=device,
        torch_threads=threads,
        name=name,
        dataset_path=dataset_path,
    )


def _setup(context: Context) -> tuple[RunConfig, NodeSettings, ClientData]:
    cfg = parse_run_config(context.run_config, CLIENT_UPDATES)
    node = node_settings(context, cfg)
    if torch.get_num_threads() != node.torch_threads:  # every message: each may run in a new process
        torch.set_num_threads(node.torch_threads)
    if cfg.partition == NODE_PARTITION:  # the site's own data, never partitioned (common/data/site_data.py)
        return cfg, node, load_site_data(site_spec(cfg, node.dataset_path), node.name, node.cache_dir)
    spec = PartitionSpec(
        dataset=cfg.dataset, partition=cfg.partition, num_partitions=node.num_partitions,
        seed=cfg.seed, alpha=cfg.alpha, classes_per_client=cfg.classes_per_client,
        local_test_fraction=cfg.local_test_fraction,
        image_column=cfg.hf_image_column, label_column=cfg.hf_label_column,
    )
    data = load_client_data(spec, node.partition_id, node.data_dir, node.cache_dir)
    if is_hf(cfg.dataset) and cfg.image_channels:  # shape facts given in the run config must be the data's
        _check_shape_keys(cfg, data)
    return cfg, node, data


def _check_shape_keys(cfg: RunConfig, data: ClientData) -> None:
    info = run_dataset_info(cfg)
    shape = tuple(int(v) for v in data.x_train.shape[1:])
    if shape != (info.height, info.width, info.channels) or (len(data.y_train) and data.y_train.max() >= info.num_classes):
        raise ConfigError(
            f"run config keys 'image-size' = {cfg.image_size}, 'image-channels' = {cfg.image_channels} and "
            f"'num-classes' = {info.num_classes} do not describe dataset {cfg.dataset!r}: its images are "
            f"{shape[0]}x{shape[1]} with {shape[2]} channel(s) and its labels reach {int(data.y_train.max())}"
        )


@app.query("handshake")
def handshake(msg: Message, context: Context) -> Message:
    """Tell the server who this node is (partition id, name) and how many train and test examples it holds.

    No label histogram: no server-side algorithm uses one (FedCOG reads its own on the node), and
    a node sends the server nothing its algorithm does not need (docs/own-data.md has the table).
    """
    cfg, node, data = _setup(context)
    check_task_model(cfg)  # this host's build of a user's model must fit the task too (issue 47)
    metrics = {
        "partition-id": node.partition_id,
        "num-train-examples": int(len(data.y_train)),
        "num-test-examples": int(len(data.y_test)),
    }
    if node.num_partitions:
        metrics["num-partitions"] = node.num_partitions
    content = RecordDict({"metrics": MetricRecord(metrics), "node": ConfigRecord({"name": node.name})})
    return Message(content, reply_to=msg)


def restore_node_state(content: RecordDict, state: RecordDict) -> None:
    """Write the node state the server re-sends after a resume into Context.state."""
    for name, record in content.array_records.items():
        if name.startswith(NODE_STATE_PREFIX):
            state[name[len(NODE_STATE_PREFIX):]] = record


def _received_model(msg: Message, cfg: RunConfig, device: torch.device) -> tuple[torch.nn.Module, Weights]:
    """The model the server sent, checked (names, shapes, dtypes, finite) before use, and its arrays (read from the
    record once: the train reply's update is taken against them)."""
    model = make_model(cfg)
    record = msg.content.array_records.get("arrays")
    if record is None:
        raise ValueError("the server's message has no 'arrays' record (the model)")
    received = from_record(record)
    problem = check_weights(received, model_weights(model), "model from the server")
    if problem:
        raise ValueError(problem)
    load_weights(model, received)
    return model.to(device), received


@app.query(FID_STATS)
def fid_stats(msg: Message, context: Context) -> Message:
    """FedDDPM+'s QuickTest reference: feature sums of this node's images (client_app/diffusion.py)."""
    cfg, node, data = _setup(context)
    return feature_sums_reply(msg, cfg, node.partition_id, data, node.device)


def required_settings(cfg: RunConfig) -> tuple[str, ...]:
    """The keys a train message of this run must carry in its config: the round, its learning rate, the local
    training recipe, and what the algorithm's rule reads (the codec, the rule's settings, FedCOG's, a plugin's own:
    common/run/client_settings.py)."""
    return ROUND_KEYS + RECIPE_KEYS + client_keys(cfg.algorithm, algorithm_of(cfg.algorithm).decentralized,
                                                  cog_enabled(cfg)) + own_message_keys(cfg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Evaluate the received global model locally, then run the algorithm's local update."""
    cfg, node, data = _setup(context)
    config = msg.content.config_records.get("config")
    if config is None:
        raise ValueError("the train message has no 'config' record (the round's settings)")
    # every value checked as the run config checks its key; FedDDPM's warm-up carries its own settings
    check_train_settings(config, WARMUP_KEYS + RECIPE_KEYS if is_warmup(config) else required_settings(cfg))
    if not is_warmup(config):
        own_message_settings(config, cfg)  # a plugin's own settings, by its group's check (`LocalJob.own_settings`)
    server_round = int(config["server-round"])
    restore_node_state(msg.content, context.state)
    received: Weights | None = None
    if is_gossip_round(msg.content):  # decentralized FL: start from the mix of the neighbours' models
        model = gossip_start_model(msg.content, context.state, cfg, node.device)
    else:
        model, received = _received_model(msg, cfg, node.device)
    if is_diffusion(cfg):  # the diffusion task: its data, DDPM loss and FedDDPM's warmup (client_app/diffusion.py)
        return diffusion_train(msg, context, cfg, node.partition_id, data, model, node.device)
    x_test, y_test = as_tensors(data.x_test, data.y_test, cfg.dataset, node.device)
    test_loss, test_acc = evaluate_model(model, x_test, y_test)
    x, y = as_tensors(data.x_train, data.y_train, cfg.dataset, node.device)
    job = LocalJob(
        cfg=cfg, server_round=server_round, partition_id=node.partition_id, model=model,
        x=x, y=y, device=node.device, incoming=msg.content, state=context.state,
    )
    result = client_update(cfg)(job)  # `cog = true` runs X+cog; a plugin's rule runs here too
    metrics = {
        "num-examples": int(len(y)),
        "partition-id": node.partition_id,
        "train-loss": result.train_loss,
        LOCAL_STEPS_METRIC: result.num_steps,
        f"{CLIENT_STAT_PREFIX}torch-threads": torch.get_num_threads(),  # client_app/threads.py
        **result.metrics,
    }
    if len(y_test) > 0:
        metrics.update({"local-test-loss": test_loss, "local-test-accuracy": test_acc,
                        "num-test-examples": int(len(y_test))})
    content = RecordDict({"metrics": MetricRecord(metrics)})
    # the model (or, with compression, the encoded update) and the rule's extra records
    # (a decentralized round carries no global model; its config refuses compression)
    if received is None:
        received = from_record(msg.content.array_records["arrays"]) if "arrays" in msg.content.array_records else {}
    for name, record in uplink_records(message_codec(config), cfg.seed, context.state, received, model_weights(model),
                                       result.outgoing, server_round, node.partition_id,
                                       module_parameter_names(model)).items():
        content[name] = record
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received model on this node's local test split."""
    cfg, node, data = _setup(context)
    model, _ = _received_model(msg, cfg, node.device)
    x_test, y_test = as_tensors(data.x_test, data.y_test, cfg.dataset, node.device)
    loss, accuracy = evaluate_model(model, x_test, y_test)
    metrics = MetricRecord({
        "num-examples": int(len(y_test)), "partition-id": node.partition_id,
        "local-test-loss": loss if len(y_test) else 0.0,
        "local-test-accuracy": accuracy if len(y_test) else 0.0,
    })
    return Message(RecordDict({"metrics": metrics, "config": ConfigRecord({})}), reply_to=msg)
