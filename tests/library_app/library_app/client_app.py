# tests/library_app/library_app/client_app.py: each strategy's node, its reply built by fedsynth.client
import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsynth.client import (
    CogSettings, LocalOptimizer, config_value, evaluate_model, scaffold_reply, train_fedcog,
    train_fedlesam, train_fedlesam_d, train_fedsam, train_fedsmoo, train_fedsynsam, train_mofedsam, train_reply,
    train_scaffold, train_sgd,
)
from library_app.task import load_data, make_net

app = ClientApp()


def weights(record: ArrayRecord | None) -> dict[str, np.ndarray] | None:
    return None if record is None else {name: array.numpy() for name, array in record.items()}


def record(values: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(value) for name, value in values.items()})


@app.train()
def train(msg: Message, context: Context) -> Message:
    config, incoming, state = msg.content["config"], msg.content.array_records, context.state
    net = make_net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader = load_data(int(context.node_config["partition-id"]))
    batches = loader  # one pass over the node's data; epochs(loader, count=E) for E passes
    optimizer = LocalOptimizer(lr=float(config["lr"]), momentum=0.9)
    strategy = str(context.run_config["strategy"])  # which server this app runs with (its run config)
    n = len(loader.dataset)
    if strategy == "scaffold":  # c_i stays on the node; c_i+ - c_i goes back as "scaffold-delta-c"
        result = train_scaffold(net, batches, c_global=weights(incoming["scaffold-c"]),
                                c_local=weights(state.array_records.get("c_i")), optimizer=optimizer)
        state["c_i"] = record(result.control)
        return scaffold_reply(msg, net, result, num_examples=n)
    rho = float(config_value(config, "sam-rho")) if "sam-rho" in config else 0.0
    previous = weights(incoming.get("previous-update"))  # MoFedSAM, FedLESAM(-D): none in round 1
    if strategy == "fedsam":
        result = train_fedsam(net, batches, rho=rho, optimizer=optimizer)
    elif strategy == "mofedsam":
        result = train_mofedsam(net, loader, rho=rho, alpha=float(config_value(config, "mofedsam-alpha")),
                                previous_update=previous, optimizer=optimizer)  # K = len(loader) steps
    elif strategy == "fedlesam":
        result = train_fedlesam(net, batches, rho=rho, previous_update=previous, optimizer=optimizer)
    elif strategy == "fedlesam-d":  # g_i stays on the node; the reply adds "dynamic-correction"
        result = train_fedlesam_d(net, batches, rho=rho, alpha=float(config_value(config, "dyn-alpha")),
                                  previous_update=previous, dyn_gradient=weights(state.array_records.get("g_i")),
                                  optimizer=optimizer)
        state["g_i"] = record(result.dyn_gradient)
    elif strategy == "fedsmoo":  # mu_i and g_i stay on the node; the reply adds "perturbation-dual"
        result = train_fedsmoo(net, batches, rho=rho, alpha=float(config_value(config, "dyn-alpha")),
                               global_perturbation=weights(incoming.get("global-perturbation")),
                               mu=weights(state.array_records.get("mu_i")),
                               dyn_gradient=weights(state.array_records.get("g_i")), optimizer=optimizer)
        state["mu_i"], state["g_i"] = record(result.mu), record(result.dyn_gradient)
    elif strategy == "fedsynsam":  # FedSAM until D_syn arrives (kept), then the mixed ascent
        if "synthetic-data" in incoming:
            state["synthetic-data"] = incoming["synthetic-data"]
        synthetic = weights(state.array_records.get("synthetic-data"))
        if synthetic is None:
            result = train_fedsam(net, batches, rho=rho, optimizer=optimizer)
        else:
            result = train_fedsynsam(net, batches, synthetic_x=torch.from_numpy(synthetic["x"]),
                                     synthetic_y=torch.from_numpy(synthetic["y"]), rho=rho,
                                     beta=float(config_value(config, "synsam-beta")), optimizer=optimizer)
        held = 0 if synthetic is None else len(synthetic["y"])
        # compression is on: train_reply sends the parameters' update through the strategy's codec
        return train_reply(msg, net, result, num_examples=n, metrics={"synthetic-examples": held}, state=state)
    elif strategy == "fedcog" and int(config["server-round"]) >= int(config_value(config, "cog-start-round")):
        labels = np.concatenate([y.numpy() for _, y in loader])
        result = train_fedcog(net, batches, label_counts=np.bincount(labels, minlength=10),
                              previous_model=weights(state.array_records.get("previous-model")),
                              input_shape=(1, 28, 28), settings=CogSettings(gen_budget=8, gen_steps=2), batch_size=8,
                              optimizer=optimizer)
        state["previous-model"] = record(result.previous_model)
    else:  # FedAvg, FedAvgM, DynaFed, FedCOG before its start round
        result = train_sgd(net, batches, optimizer=optimizer)
    return train_reply(msg, net, result, num_examples=n, state=state)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    net = make_net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = next(iter(load_data(int(context.node_config["partition-id"]), batch_size=32)))
    loss, accuracy = evaluate_model(net, x, y)
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(y), "eval_loss": loss,
                                                        "eval_acc": accuracy})}), reply_to=msg)
