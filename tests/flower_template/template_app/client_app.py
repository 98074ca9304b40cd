"""template-app: the ClientApp of `flwr new`'s PyTorch template; its replies (`train_loss`, `eval_loss`,
`eval_acc`, `num-examples`) are the template's.

For a method with a client rule, the only change is the train function (`TRAIN_FUNCTIONS`, picked by the
run config's `strategy`): it calls the rule from `fedsynth.client` with the settings the server's strategy
sent in the message's config (`config_value`, `message_codec`), and adds the rule's extra record.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsynth.client import (
    COMPRESSED_UPDATE,
    CogSettings,
    LocalOptimizer,
    config_value,
    encode_update,
    gossip_mix,
    message_codec,
    ole_restart,
    train_fedcog,
    train_fedsam,
    train_fedsynsam,
    train_scaffold,
    train_sgd,
)
from template_app.task import Net, initial_net, load_data
from template_app.task import test as test_fn
from template_app.task import train as train_fn

app = ClientApp()


def _data(context: Context):
    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                     str(context.run_config["data-dir"]), int(context.run_config["examples-per-node"]),
                     int(context.run_config["batch-size"]))


def _numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.array(value)) for name, value in arrays.items()})  # 0-d stays 0-d


def _reply(msg: Message, model: ArrayRecord, loss: float, count: int, **records: ArrayRecord) -> Message:
    content = RecordDict({"arrays": model, "metrics": MetricRecord({"train_loss": loss, "num-examples": count})})
    for name, record in records.items():
        content[name] = record
    return Message(content=content, reply_to=msg)


def _batch_norm(context: Context) -> bool:
    return bool(context.run_config.get("batch-norm", True))


def _received(msg: Message, context: Context) -> Net:
    model = Net(batch_norm=_batch_norm(context))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


def template_train(msg: Message, context: Context) -> Message:
    """The template's train function, unchanged."""
    model = _received(msg, context)
    trainloader, _ = _data(context)
    train_loss = train_fn(model, trainloader, int(context.run_config["local-epochs"]),
                          float(msg.content["config"]["lr"]), "cpu")
    return _reply(msg, ArrayRecord(model.state_dict()), train_loss, len(trainloader.dataset))


def _optimizer(msg: Message) -> LocalOptimizer:
    return LocalOptimizer(lr=float(msg.content["config"]["lr"]), momentum=0.9)


def sam_train(msg: Message, context: Context) -> Message:
    """FedSAM: SAM steps with the rho the strategy sent."""
    model = _received(msg, context)
    trainloader, _ = _data(context)
    result = train_fedsam(model, trainloader, rho=float(config_value(msg.content["config"], "sam-rho")),
                          optimizer=_optimizer(msg))
    return _reply(msg, ArrayRecord(model.state_dict()), result.train_loss, len(trainloader.dataset))


def scaffold_train(msg: Message, context: Context) -> Message:
    """SCAFFOLD: the corrected steps; c_i stays in Context.state, c_i+ - c_i goes back as `scaffold-delta-c`."""
    model = _received(msg, context)
    trainloader, _ = _data(context)
    c_local = context.state.array_records.get("scaffold-c-i")
    result = train_scaffold(model, trainloader, c_global=_numpy(msg.content["scaffold-c"]),
                            c_local=_numpy(c_local) if c_local is not None else None, optimizer=_optimizer(msg))
    context.state["scaffold-c-i"] = _record(result.control)
    return _reply(msg, ArrayRecord(model.state_dict()), result.train_loss, len(trainloader.dataset),
                  **{"scaffold-delta-c": _record(result.control_delta)})


def fedsynsam_train(msg: Message, context: Context) -> Message:
    """FedSynSAM: FedSAM until the server's synthetic set arrives (kept in Context.state), then the mixed
    ascent; the update goes back compressed with the codec the strategy sent."""
    config = msg.content["config"]
    model = _received(msg, context)
    global_weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    trainloader, _ = _data(context)
    if "synthetic-data" in msg.content.array_records:
        context.state["synthetic"] = msg.content["synthetic-data"]
    synthetic = context.state.array_records.get("synthetic")
    rho = float(config_value(config, "sam-rho"))
    if synthetic is None:
        result = train_fedsam(model, trainloader, rho=rho, optimizer=_optimizer(msg))
    else:
        data = _numpy(synthetic)
        result = train_fedsynsam(model, trainloader, synthetic_x=torch.from_numpy(data["x"]),
                                 synthetic_y=torch.from_numpy(data["y"]),
                                 rho=rho, beta=float(config_value(config, "synsam-beta")), optimizer=_optimizer(msg))
    local = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    trainable = {name for name, _ in model.named_parameters()}
    # the trainable parameters' update is compressed; buffers (BatchNorm's statistics) travel as they are
    delta = {k: (local[k] - global_weights[k]).astype(np.float32) for k in local if k in trainable}
    rng = np.random.default_rng([int(config["server-round"]), int(context.node_config["partition-id"])])
    payload = encode_update(delta, message_codec(config), rng).payload
    content = RecordDict({COMPRESSED_UPDATE: _record(payload), "metrics": MetricRecord({
        "train_loss": result.train_loss, "num-examples": len(trainloader.dataset),
        "synthetic-examples": 0 if synthetic is None else len(_numpy(synthetic)["y"])})})
    buffers = {k: v for k, v in local.items() if k not in trainable}
    if buffers:
        content["model-buffers"] = _record(buffers)
    return Message(content=content, reply_to=msg)


def fedcog_train(msg: Message, context: Context) -> Message:
    """FedCOG: plain SGD before the strategy's `cog-start-round`, then generation and distillation."""
    config = msg.content["config"]
    model = _received(msg, context)
    trainloader, _ = _data(context)
    if int(config["server-round"]) < int(config_value(config, "cog-start-round")):
        result = train_sgd(model, trainloader, optimizer=_optimizer(msg))
    else:
        labels = trainloader.dataset.tensors[1].numpy()
        previous = context.state.array_records.get("previous-model")
        result = train_fedcog(model, trainloader, label_counts=np.bincount(labels, minlength=10),
                              previous_model=_numpy(previous) if previous is not None else None,
                              input_shape=(1, 28, 28), settings=CogSettings(gen_budget=16, gen_steps=2), batch_size=16,
                              seed=int(config["server-round"]), optimizer=_optimizer(msg))
    context.state["previous-model"] = ArrayRecord(model.state_dict())
    return _reply(msg, ArrayRecord(model.state_dict()), result.train_loss, len(trainloader.dataset))


def gossip_train(msg: Message, context: Context) -> Message:
    """DFedAvg / OledFL: mix the neighbours' models (the `gossip` record) with the node's own last one, OledFL's
    restart when the config carries `ole-beta`, local SGD; the new model is kept and sent."""
    gossip, config = msg.content["gossip"], msg.content["config"]
    restored = msg.content.array_records.get("node-state:decentralized-own-model")  # a node that joined late
    if restored is not None:
        context.state["own-model"] = restored
    own_record = context.state.array_records.get("own-model")
    own = _numpy(own_record) if own_record is not None else {
        k: v.detach().numpy().copy() for k, v in initial_net(_batch_norm(context)).state_dict().items()}
    neighbours = [_numpy(msg.content[f"gossip-model-{pid}"]) for pid in gossip["neighbours"]]
    mixed = gossip_mix(own, float(gossip["self-weight"]), neighbours, list(gossip["weights"]))
    model = Net(batch_norm=_batch_norm(context))
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in mixed.items()})
    if "ole-beta" in config:
        ole_restart(model, own, float(config["ole-beta"]))
    trainloader, _ = _data(context)
    result = train_sgd(model, trainloader, optimizer=_optimizer(msg))
    context.state["own-model"] = ArrayRecord(model.state_dict())
    return _reply(msg, ArrayRecord(model.state_dict()), result.train_loss, len(trainloader.dataset))


TRAIN_FUNCTIONS: dict[str, Callable[[Message, Context], Message]] = {
    "fedavg": template_train, "flower-fedavg": template_train, "fedsam": sam_train, "scaffold": scaffold_train,
    "fedsynsam": fedsynsam_train, "fedcog": fedcog_train, "dfedavg": gossip_train, "oledfl": gossip_train,
}


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    return TRAIN_FUNCTIONS[str(context.run_config["strategy"])](msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data (the template's function, unchanged)."""
    model = _received(msg, context)
    _, valloader = _data(context)
    eval_loss, eval_acc = test_fn(model, valloader, "cpu")
    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
