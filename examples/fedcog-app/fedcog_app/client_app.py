"""fedcog-app's ClientApp: FedCOG's local round from `fedsynth.client`, on this app's own model and data.

Each train message: load the global model, run `train_fedcog` (generate inputs
for the classes this node lacks, then SGD on the real batches plus the
distillation of the global model's predictions on the generated ones), keep
the final model in `Context.state` for the next round's disagreement term, and
reply with the model and the metrics the strategy weighs by. The generated
inputs never leave the node.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedcog_app.task import INPUT_SHAPE, NUM_CLASSES, Net, load_data, loader_tensors
from fedsynth.client import CogSettings, LocalOptimizer, evaluate_model, train_fedcog

app = ClientApp()

PREVIOUS_MODEL = "fedcog-previous-model"  # Context.state key: the model this node ended its last round with


def _node_data(context: Context):
    config = context.run_config
    partition_id = int(context.node_config["partition-id"])
    trainloader, testloader = load_data(
        partition_id, int(context.node_config["num-partitions"]), str(config["data-dir"]),
        int(config["examples-per-node"]), float(config["dirichlet-alpha"]), int(config["seed"]),
        int(config["batch-size"]),
    )
    return partition_id, trainloader, testloader


def _received_model(msg: Message) -> Net:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return net


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One FedCOG round on this node's data."""
    partition_id, trainloader, _ = _node_data(context)
    net = _received_model(msg)
    config, run_config = msg.content["config"], context.run_config
    labels = loader_tensors(trainloader)[1].numpy()
    previous = context.state.array_records.get(PREVIOUS_MODEL)
    result = train_fedcog(
        net, trainloader,
        label_counts=np.bincount(labels, minlength=NUM_CLASSES),
        previous_model={name: array.numpy() for name, array in previous.items()} if previous is not None else None,
        input_shape=INPUT_SHAPE,
        settings=CogSettings(gen_budget=int(run_config["gen-budget"]), gen_steps=int(run_config["gen-steps"])),
        batch_size=int(run_config["batch-size"]),
        seed=int(run_config["seed"]) * 100_000 + int(config["server-round"]) * 100 + partition_id,
        optimizer=LocalOptimizer(lr=float(config["lr"]), momentum=float(run_config["momentum"])),
    )
    context.state[PREVIOUS_MODEL] = ArrayRecord(net.state_dict())
    metrics = MetricRecord({
        "num-examples": len(labels),
        "train-loss": result.train_loss,
        "partition-id": partition_id,
    })
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received model's loss and accuracy on this node's local test examples."""
    _, _, testloader = _node_data(context)
    x, y = loader_tensors(testloader)
    with torch.no_grad():
        loss, accuracy = evaluate_model(_received_model(msg), x, y)
    metrics = MetricRecord({"num-examples": len(y), "local-test-accuracy": accuracy, "local-test-loss": loss})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
