"""`fedsynth.client`'s reply builders, per strategy family, from docs/library.md's words alone.

A ClientApp built on `train_reply` (plain and compressed), `scaffold_reply` and the rules' results runs with
each family's strategy on a BatchNorm model, with no reply dropped; the buffers travel as they are when the
update is compressed; and torchvision's resnet18 runs FedSynSAM at 4 bits (issue 53).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from torch import nn

from fedsynth import strategies
from fedsynth.client import (
    COMPRESSED_UPDATE,
    MODEL_BUFFERS,
    LocalOptimizer,
    config_value,
    message_codec,
    scaffold_reply,
    tensor_batches,
    train_fedlesam_d,
    train_fedsam,
    train_fedsmoo,
    train_fedsynsam,
    train_reply,
    train_scaffold,
    train_sgd,
)
from tests.library_grid import ClientAppGrid

torch.set_num_threads(1)


def bn_net() -> nn.Module:
    """A tiny CNN with BatchNorm (float running statistics and the 0-d int64 `num_batches_tracked`)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))


def node_data(context: Context, count: int = 16, shape: tuple[int, ...] = (1, 4, 4), classes: int = 3):
    pid = int(context.node_config["partition-id"])
    generator = torch.Generator().manual_seed(pid)
    return torch.randn(count, *shape, generator=generator), torch.randint(0, classes, (count,), generator=generator)


def numpy_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def received(msg: Message, make=bn_net) -> nn.Module:
    net = make()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return net


def initial(make=bn_net) -> ArrayRecord:
    return ArrayRecord(make().state_dict())


def plain_train(msg: Message, context: Context) -> Message:
    """FedAvg's and FedSAM's node: the rule the config asks for, then `train_reply` (plain or compressed)."""
    net = received(msg)
    x, y = node_data(context)
    config = msg.content["config"]
    optimizer = LocalOptimizer(lr=float(config["lr"]), momentum=0.9)
    batches = tensor_batches(x, y, batch_size=8, num_steps=2)
    result = (train_fedsam(net, batches, rho=float(config["sam-rho"]), optimizer=optimizer) if "sam-rho" in config
              else train_sgd(net, batches, optimizer=optimizer))
    return train_reply(msg, net, result, num_examples=len(y), state=context.state)


def run(strategy, train, rounds: int = 2, nodes: int = 2, make=bn_net):
    grid = ClientAppGrid(nodes, train)
    result = strategy.start(grid, initial(make), num_rounds=rounds, timeout=30,
                            train_config=ConfigRecord({"lr": 0.05}))
    return grid, result


def no_reply_dropped(strategy) -> None:
    assert strategy.round_log.latest.failures == () and not strategy.round_log.latest.failures


@pytest.mark.parametrize(("strategy", "batch_norm_passes"), [
    (lambda: strategies.FedAvg(fraction_evaluate=0.0), 4),  # two rounds of two steps
    (lambda: strategies.FedSAM(sam_rho=0.05, fraction_evaluate=0.0), 4),  # SAM's pass at w+e moves no statistics
])
def test_the_plain_reply_carries_the_model_and_the_metrics(strategy, batch_norm_passes):
    built = strategy()
    grid, result = run(built, plain_train)
    no_reply_dropped(built)
    reply = plain_train(grid.sent[-1], grid.contexts[900])
    assert set(reply.content.array_records) == {"arrays"}
    assert reply.content["metrics"]["num-examples"] == 16 and reply.content["metrics"]["train-loss"] > 0
    final = numpy_of(result.arrays)
    assert final["1.num_batches_tracked"].dtype == np.int64 and final["1.num_batches_tracked"].shape == ()
    assert int(final["1.num_batches_tracked"]) == batch_norm_passes  # the nodes' buffers came back as they were
    assert result.train_metrics_clientapp[2]["train_loss"] == result.train_metrics_clientapp[2]["train-loss"]


@pytest.mark.parametrize("error_feedback", [False, True])
def test_the_compressed_reply_sends_the_parameters_through_the_codec_and_the_buffers_as_they_are(error_feedback):
    built = strategies.FedAvg(codec=strategies.QSGD(bits=4, error_feedback=error_feedback), fraction_evaluate=0.0)
    grid, result = run(built, plain_train)
    no_reply_dropped(built)
    assert built.round_log.latest.answered == 2
    reply = plain_train(grid.sent[-1], grid.contexts[900])
    assert set(reply.content.array_records) == {COMPRESSED_UPDATE, MODEL_BUFFERS}
    assert set(reply.content[MODEL_BUFFERS].keys()) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    payload_tensors = {key.split("::")[0] for key in reply.content[COMPRESSED_UPDATE].keys()}
    assert payload_tensors == {"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}
    assert ("fedsynth-uplink-residual" in grid.contexts[900].state.array_records) == error_feedback
    final = numpy_of(result.arrays)
    assert int(final["1.num_batches_tracked"]) == 4 and np.all(final["1.running_var"] > 0)


def test_error_feedback_needs_the_nodes_state():
    built = strategies.FedAvg(codec=strategies.QSGD(bits=4, error_feedback=True))
    message = list(built.configure_train(1, initial(), ConfigRecord({"lr": 0.1}), ClientAppGrid(1, plain_train)))[0]
    with pytest.raises(ValueError, match="Context.state"):
        train_reply(message, received(message), num_examples=3, train_loss=0.5)


def scaffold_train(msg: Message, context: Context) -> Message:
    net = received(msg)
    x, y = node_data(context)
    kept = context.state.array_records.get("c_i")
    result = train_scaffold(net, tensor_batches(x, y, 8, 2), c_global=numpy_of(msg.content["scaffold-c"]),
                            c_local=numpy_of(kept) if kept is not None else None,
                            optimizer=LocalOptimizer(lr=float(msg.content["config"]["lr"])))
    context.state["c_i"] = ArrayRecord({name: Array(value) for name, value in result.control.items()})
    return scaffold_reply(msg, net, result, num_examples=len(y))


def test_the_scaffold_reply_carries_the_control_delta():
    built = strategies.Scaffold(fraction_evaluate=0.0)
    grid, _ = run(built, scaffold_train)
    no_reply_dropped(built)
    assert any(np.any(value != 0) for value in built.control.values())  # c moved by the nodes' deltas
    reply = scaffold_train(grid.sent[-1], grid.contexts[900])
    assert set(reply.content.array_records) == {"arrays", "scaffold-delta-c"}


def dynamic_train(msg: Message, context: Context) -> Message:
    """FedLESAM-D's and FedSMOO's node: the rule's result goes to `train_reply`, which adds its record."""
    net = received(msg)
    x, y = node_data(context)
    config = msg.content["config"]
    optimizer = LocalOptimizer(lr=float(config["lr"]))
    previous = msg.content.array_records.get("previous-update")
    if context.run_config["rule"] == "fedsmoo":
        perturbation = msg.content.array_records.get("global-perturbation")
        result = train_fedsmoo(net, tensor_batches(x, y, 8, 2), rho=float(config_value(config, "sam-rho")),
                               alpha=float(config_value(config, "dyn-alpha")),
                               global_perturbation=numpy_of(perturbation) if perturbation is not None else None,
                               optimizer=optimizer)
    else:
        result = train_fedlesam_d(net, tensor_batches(x, y, 8, 2), rho=float(config_value(config, "sam-rho")),
                                  alpha=float(config_value(config, "dyn-alpha")),
                                  previous_update=numpy_of(previous) if previous is not None else None,
                                  optimizer=optimizer)
    return train_reply(msg, net, result, num_examples=len(y))


@pytest.mark.parametrize(("public", "rule", "record"), [(strategies.FedLESAMD, "fedlesam-d", "dynamic-correction"),
                                                        (strategies.FedSMOO, "fedsmoo", "perturbation-dual")])
def test_the_dynamic_rules_replies_carry_their_record(public, rule, record):
    built = public(fraction_evaluate=0.0)
    grid = ClientAppGrid(2, dynamic_train)
    for context in grid.contexts.values():
        context.run_config["rule"] = rule
    built.start(grid, initial(), num_rounds=2, timeout=30, train_config=ConfigRecord({"lr": 0.05}))
    no_reply_dropped(built)
    reply = dynamic_train(grid.sent[-1], grid.contexts[900])
    assert record in reply.content.array_records


def resnet18_fedsynsam_train(msg: Message, context: Context) -> Message:
    """FedSynSAM's node, as library.md writes it: FedSAM until D_syn arrives (kept), then the mixed ascent; the
    reply through `train_reply`, which compresses the parameters with the codec the strategy sent."""
    from tests.bn_models import resnet18

    config = msg.content["config"]
    net = received(msg, lambda: resnet18(num_classes=10, channels=3, image_size=32))
    x, y = node_data(context, count=4, shape=(3, 32, 32), classes=10)
    if "synthetic-data" in msg.content.array_records:
        context.state["synthetic-data"] = msg.content["synthetic-data"]
    synthetic = context.state.array_records.get("synthetic-data")
    optimizer = LocalOptimizer(lr=float(config["lr"]), momentum=0.9)
    rho = float(config_value(config, "sam-rho"))
    if synthetic is None:
        result = train_fedsam(net, tensor_batches(x, y, 4, 1), rho=rho, optimizer=optimizer)
    else:
        data = numpy_of(synthetic)
        result = train_fedsynsam(net, tensor_batches(x, y, 4, 1), synthetic_x=torch.from_numpy(data["x"]),
                                 synthetic_y=torch.from_numpy(data["y"]), rho=rho,
                                 beta=float(config_value(config, "synsam-beta")), optimizer=optimizer)
    held = 0 if synthetic is None else len(synthetic["y"].numpy())
    assert message_codec(config).compression == "qsgd"
    return train_reply(msg, net, result, num_examples=len(y), metrics={"synthetic-examples": held})


def test_torchvisions_resnet18_runs_fedsynsam_at_4_bits_through_train_reply():
    """Issue 53's check: resnet18 (BatchNorm everywhere, 11M parameters), 2 nodes of 4 32x32 images, one round
    (the distillation starts after `trajectory_rounds` = 2: this test is about the nodes' compressed replies)."""
    from tests.bn_models import resnet18

    built = strategies.FedSynSAM(distillation=strategies.DistillationSettings(
        task=strategies.ServerTask(model="tests.bn_models:resnet18", dataset="cifar10"), trajectory_rounds=2,
        synthetic_ipc=1, distill_iterations=1, distill_inner_steps=1), codec=strategies.QSGD(bits=4), fraction_evaluate=0.0)
    grid, result = run(built, resnet18_fedsynsam_train, rounds=1, make=lambda: resnet18(num_classes=10, channels=3,
                                                                                 image_size=32))
    no_reply_dropped(built)
    assert built.round_log.latest.answered == 2
    first = numpy_of(initial(lambda: resnet18(num_classes=10, channels=3, image_size=32)))
    final = numpy_of(result.arrays)
    assert int(final["bn1.num_batches_tracked"]) > 0 and not np.array_equal(final["bn1.running_mean"],
                                                                               first["bn1.running_mean"])
    assert not np.array_equal(final["fc.weight"], first["fc.weight"])
