"""FedDDPM's phases outside the rounds, as docs/library.md ("FedDDPM's phases outside the rounds") describes them.

- from the outside: a Flower developer's own ClientApp functions (no fedsynth client code) answer the warm-up's
  train message; `start()` runs the warm-up once, before round 1, through one `grid.send_and_receive` with
  `warmup_timeout`, and the auxiliary set comes from their warm models; so does a wrapper's `start()`;
- `warmup_phase.configure`'s messages carry what the docs say (the initial model, `server-round` 0, `phase` "warmup");
- `warmup_phase.aggregate` reads Flower's template metric names, drops an error reply, a reply without the model, a mis-shaped model and a node that did not
  answer, each with its reason, and raises WarmupFailed below `min_nodes`;
- the `fid_stats` phase: `configure_fid_stats`' messages and `aggregate_fid_stats`' pooling and dropping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from uuid import uuid4

import numpy as np
import pytest
import torch
from flwr.app import Error, Message, MessageType, MetricRecord, RecordDict

from common.metrics.fid import gaussian_stats
from common.models.diffusion import image_shape
from common.records import from_record, model_weights, to_record
from common.run.config import parse_run_config
from common.run.task import make_model
from fedsynth import strategies
from server_app.fid_reference import ClientFeatureReference, NoFeatureSums
from server_app.diffusion_eval import run_extractor
from server_app.registry import SERVER_STRATEGIES
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.fedddpm import WarmupFailed, auxiliary_count
from common.run.task import ServerTask
from server_app.strategies.server_training import CorrectionSettings, DiffusionTraining
from tests.diffusion_tiny import TINY_DIFFUSION

torch.set_num_threads(1)

# the server side of a tiny FedDDPM: the DDPM it samples the auxiliary set from and corrects on A
TINY = {"model": "unet-small", "image_size": 8, "diffusion_timesteps": 20, "aux_sampler": "ddim", "ddim_steps": 5,
        "aux_fraction": 0.05, "correction_epochs": 1, "batch_size": 16, "warmup_timeout": 77.0}
# the same as the class's parameters: the model and the data's shape are its task
TASK_KEYS = ("model", "image_size", "diffusion_timesteps")
SERVER = {"diffusion": DiffusionTraining(task=ServerTask(**{key: TINY[key] for key in TASK_KEYS}),
                                         **{key: TINY[key] for key in ("aux_sampler", "ddim_steps", "aux_fraction",
                                                                       "batch_size", "warmup_timeout")}),
          "correction": CorrectionSettings(correction_epochs=TINY["correction_epochs"])}

Answer = Callable[[Message, int], RecordDict]


def initial_model() -> dict[str, np.ndarray]:
    """The tiny DDPM's seeded initial weights (the run config of TINY, as `fedsynth run` would build it)."""
    raw = {**{key.replace("_", "-"): value for key, value in TINY.items()}, "algorithm": "fedddpm"}
    return model_weights(make_model(parse_run_config(raw, SERVER_STRATEGIES), seeded=True))


def developer_train(message: Message, pid: int) -> RecordDict:
    """A Flower developer's train function: move every float array by (pid + 1) / 1000, reply in `flwr new`'s
    template names (`train_loss`, `num-examples`).

    It reads the warm-up's config only to say so in its metrics; fedsynth's client code is not involved.
    """
    config = message.content["config"]
    model = {name: (array.numpy() + np.float32((pid + 1) / 1000)) if array.numpy().dtype.kind == "f"
             else array.numpy() for name, array in message.content["arrays"].items()}
    return RecordDict({"arrays": to_record(model),
                       "metrics": MetricRecord({"num-examples": 100 * (pid + 1),
                                                "train_loss": 0.5 if config.get("phase") == "warmup" else 0.25})})


class DeveloperGrid:
    """A duck-typed Flower `Grid` whose nodes answer with plain functions; it records each send_and_receive call."""

    def __init__(self, num_nodes: int, train: Answer = developer_train) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.pids = {7000 + 3 * pid: pid for pid in range(num_nodes)}
        self.train = train
        self.calls: list[tuple[list[Message], float | None]] = []  # (messages, timeout) of each send_and_receive

    def sends(self) -> list[tuple[list[Message], float | None]]:
        """The calls that sent something (start() also calls send_and_receive for an evaluate round of none)."""
        return [(messages, timeout) for messages, timeout in self.calls if messages]

    def get_node_ids(self) -> Iterable[int]:
        return list(self.pids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        self.calls.append((messages, timeout))
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid4().hex
            assert message.metadata.message_type == MessageType.TRAIN  # fraction_evaluate = 0: no evaluate round
            replies.append(Message(self.train(message, self.pids[message.metadata.dst_node_id]), reply_to=message))
        return replies


def phase_of(message: Message) -> str | None:
    return message.content["config"].get("phase")


def test_a_developers_clientapp_answers_the_warmup_under_start() -> None:
    grid = DeveloperGrid(3)
    strategy = strategies.FedDDPM(**SERVER, fraction_evaluate=0.0)
    initial = initial_model()
    result = strategy.start(grid, to_record(initial), num_rounds=2, timeout=30)

    # the warm-up is one send_and_receive before round 1's, with warmup_timeout; then start()'s own rounds
    assert [(len(messages), timeout) for messages, timeout in grid.sends()] == [(3, 77.0), (3, 30), (3, 30)]
    warmup_messages = grid.sends()[0][0]
    assert [phase_of(m) for m in warmup_messages] == ["warmup"] * 3
    assert all(phase_of(m) is None for messages, _ in grid.sends()[1:] for m in messages)
    for message in warmup_messages:
        assert dict(message.content["config"]) == {"server-round": 0, "phase": "warmup",
                                                   "warmup-epochs": strategy.diffusion.warmup_epochs,
                                                   "warmup-steps": strategy.diffusion.warmup_steps}
        sent = from_record(message.content["arrays"])
        assert all(np.array_equal(sent[name], initial[name]) for name in initial)

    # the auxiliary set came from the developer's warm models: |A_i| from each node's num-examples
    record = strategy.round_log.phases[0].as_record()
    assert (record["phase"], record["answered"], record["failed"]) == ("warmup", 3, 0)
    expected = {pid: auxiliary_count(100 * (pid + 1), 0.05) for pid in range(3)}
    assert strategy.aux_counts == expected and len(strategy.auxiliary) == sum(expected.values()) == record["aux-size"]
    assert record["train-loss"] == pytest.approx(0.5)
    assert result.train_metrics_clientapp[2]["correction-epochs"] == 1  # every round corrected on A


def test_a_flower_wrapper_runs_the_warmup_too() -> None:
    """A wrapper's start() calls only the inner configure_train: that is where the warm-up runs. Flower's DP
    wrappers are refused (the warm models would escape their clipping: tests/test_flower_wrappers.py)."""
    from tests.library_grid import passthrough_wrapper

    grid = DeveloperGrid(2)
    inner = strategies.FedDDPM(**SERVER, fraction_evaluate=0.0)
    passthrough_wrapper(inner).start(grid, to_record(initial_model()), num_rounds=1, timeout=30)
    assert [[phase_of(m) for m in messages] for messages, _ in grid.sends()] == [["warmup"] * 2, [None] * 2]
    assert inner.round_log.phases[0].answered == 2 and inner.auxiliary is not None


def test_a_restored_strategy_skips_the_warmup() -> None:
    grid = DeveloperGrid(2)
    first = strategies.FedDDPM(**SERVER, fraction_evaluate=0.0)
    result = first.start(grid, to_record(initial_model()), num_rounds=1, timeout=30)
    resumed = strategies.FedDDPM(**SERVER, fraction_evaluate=0.0)
    resumed.load_state_dict(first.state_dict())
    again = DeveloperGrid(2)
    resumed.start(again, result.arrays, num_rounds=2, timeout=30)
    assert [[phase_of(m) for m in messages] for messages, _ in again.sends()] == [[None] * 2]  # round 2 only
    np.testing.assert_array_equal(resumed.auxiliary, first.auxiliary)


def warm_reply(message: Message, model: dict[str, np.ndarray] | None, metrics: dict | None = None) -> Message:
    content = RecordDict({"metrics": MetricRecord(metrics or {"num-examples": 40, "train-loss": 0.3})})
    if model is not None:
        content["arrays"] = to_record(model)
    return Message(content, reply_to=message)


def test_configure_warmup_and_aggregate_warmup_by_hand() -> None:
    grid = DeveloperGrid(5)
    strategy = strategies.FedDDPM(**SERVER, fraction_evaluate=0.0, min_nodes=2)
    initial = initial_model()
    messages = list(strategy.warmup_phase.configure(to_record(initial), grid))
    assert [m.metadata.dst_node_id for m in messages] == sorted(grid.pids)  # one per node of the table
    assert all(m.metadata.message_type == MessageType.TRAIN and set(m.content) == {"arrays", "config"}
               and dict(m.content["config"]) == {"server-round": 0, "phase": "warmup", "warmup-epochs": 200,
                                                 "warmup-steps": TINY.get("warmup_steps", 0)} for m in messages)
    for message in messages:
        message.metadata.__dict__["_message_id"] = uuid4().hex
    first_name = sorted(initial)[0]
    misshaped = {**initial, first_name: np.zeros((1, 1), dtype=np.float32)}
    replies = [
        warm_reply(messages[0], initial),                                       # good
        Message(Error(code=0, reason="out of memory"), reply_to=messages[1]),   # error reply
        warm_reply(messages[2], None),                                          # no model
        warm_reply(messages[3], misshaped),                                     # a mis-shaped model
        # messages[4]'s node never answers
    ]
    with pytest.raises(WarmupFailed, match="only 1 node"):  # one warm model, min_nodes = 2
        strategy.warmup_phase.aggregate(replies)
    assert strategy.auxiliary is None and not strategy.round_log.phases

    replies.append(warm_reply(messages[4], initial, {"num-examples": 20, "train_loss": 0.1}))  # the template's name
    record = strategy.warmup_phase.aggregate(replies)
    reasons = {failure["node"]: failure["reason"] for failure in record["failures"]}
    node = [m.metadata.dst_node_id for m in messages]
    assert set(reasons) == {node[1], node[2], node[3]} and record["answered"] == 2 and record["sampled"] == 5
    assert reasons[node[1]] == "error: out of memory"
    assert reasons[node[2]] == "warmup reply lacks the model"
    assert first_name in reasons[node[3]]
    assert record["train-loss"] == pytest.approx((0.3 + 0.1) / 2)
    assert [phase.as_record() for phase in strategy.round_log.phases] == [record] and len(strategy.auxiliary) == record["aux-size"] == 3  # |A_i| 2 + 1


def test_a_node_that_never_answers_the_warmup_is_a_timeout() -> None:
    grid = DeveloperGrid(2)
    strategy = strategies.FedDDPM(**SERVER, fraction_evaluate=0.0)
    messages = list(strategy.warmup_phase.configure(to_record(initial_model()), grid))
    for message in messages:
        message.metadata.__dict__["_message_id"] = uuid4().hex
    record = strategy.warmup_phase.aggregate([warm_reply(messages[0], initial_model())])
    assert [f["reason"] for f in record["failures"]] == ["timeout"] and record["answered"] == 1


def test_the_fid_stats_phase_by_hand() -> None:
    cfg = parse_run_config({"algorithm": "fedddpm+", **TINY_DIFFUSION, "fid-features": "random",
                            "round-timeout": 55.0}, SERVER_STRATEGIES)
    nodes = [NodeInfo(node_id=10 + pid, partition_id=pid, num_train_examples=50) for pid in range(3)]
    reference = ClientFeatureReference(nodes, cfg.round_timeout)
    extractor = run_extractor(cfg)  # the random extractor: its weights travel with the query
    shape = image_shape(cfg)
    messages = list(reference.configure_fid_stats(extractor, shape))
    assert [m.metadata.dst_node_id for m in messages] == [10, 11, 12]
    assert all(m.metadata.message_type == "query.fid_stats" for m in messages)
    assert all(dict(m.content["config"]) == {"fid-features": extractor.name} and "fid-extractor" in m.content
               for m in messages)

    rng = np.random.default_rng(0)
    features = [rng.standard_normal((n, reference._dim)) for n in (20, 30)]

    def sums(message: Message, f: np.ndarray) -> Message:
        return Message(RecordDict({"fid-sums": to_record({"sum-f": f.sum(0), "sum-ff": f.T @ f}),
                                   "metrics": MetricRecord({"num-examples": len(f)})}), reply_to=message)

    class Grid:
        def __init__(self) -> None:
            self.calls: list[float | None] = []

        def send_and_receive(self, sent: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
            sent = list(sent)
            self.calls.append(timeout)
            for message in sent:
                message.metadata.__dict__["_message_id"] = uuid4().hex
            bad = Message(RecordDict({"fid-sums": to_record({"sum-f": np.ones(2), "sum-ff": np.eye(2)}),
                                      "metrics": MetricRecord({"num-examples": 5})}), reply_to=sent[2])
            return [sums(sent[0], features[0]), sums(sent[1], features[1]), bad]

    grid = Grid()
    stats, gathering = reference.get(grid, extractor, shape)
    assert grid.calls == [55.0]  # one call of the grid's send_and_receive, with round-timeout
    assert gathering["fid-reference-nodes"] == 2 and gathering["fid-reference-images"] == 50  # the bad one left out
    direct = gaussian_stats(np.concatenate(features))
    np.testing.assert_allclose(stats.mean, direct.mean, atol=1e-10)
    np.testing.assert_allclose(stats.cov, direct.cov, atol=1e-10)
    assert reference.get(grid, extractor, shape) == (stats, {}) and grid.calls == [55.0]  # asked once

    fresh = ClientFeatureReference(nodes, cfg.round_timeout)
    sent = list(fresh.configure_fid_stats(extractor, shape))
    for message in sent:
        message.metadata.__dict__["_message_id"] = uuid4().hex
    with pytest.raises(NoFeatureSums):
        fresh.aggregate_fid_stats([Message(Error(code=0, reason="no data"), reply_to=sent[0])])


def test_fedsynths_client_trains_the_warm_up_the_server_asked_for() -> None:
    """The warm-up's length, lr and the rest of its recipe travel in its message (as every setting a node's rule
    reads); a warm-up message without them is refused naming the key, not completed from the run config."""
    from client_app.diffusion import warmup_recipe
    from common.run.config import RunConfig

    cfg = RunConfig(algorithm="fedddpm", model="unet-small", warmup_epochs=200, warmup_steps=0, lr_decay=0.9)
    recipe = cfg.recipe_config("adam")
    asked = warmup_recipe({**recipe, "server-round": 0, "phase": "warmup", "warmup-epochs": 3, "warmup-steps": 7,
                           "lr": 0.001})
    assert (asked.local_epochs, asked.local_steps, asked.local_optimizer, asked.lr) == (3, 7, "adam", 0.001)
    with pytest.raises(ValueError, match="'warmup-epochs', 'warmup-steps'"):
        warmup_recipe({**recipe, "server-round": 0, "phase": "warmup", "lr": 0.001})
    with pytest.raises(ValueError, match="'lr'"):
        warmup_recipe({**recipe, "server-round": 0, "phase": "warmup", "warmup-epochs": 3, "warmup-steps": 7})
    with pytest.raises(ValueError, match="'batch-size'"):
        warmup_recipe({**{k: v for k, v in recipe.items() if k != "batch-size"}, "server-round": 0,
                       "phase": "warmup", "warmup-epochs": 3, "warmup-steps": 7, "lr": 0.001})
