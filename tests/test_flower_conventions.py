"""fedsynth's strategies on Flower's wire conventions, from the outside: a grid of plain ClientApp functions.

- replies in the names of `flwr new`'s PyTorch template (`train_loss`, `eval_loss`, `eval_acc`) are aggregated;
- `weighted_by_key` names the weighing metric, as in Flower's strategies;
- the settings a node's rule needs travel in the train message's config (as FedProx sends `proximal-mu`),
  and `fedsynth.client` reads them from there;
- a first round whose every reply breaks the contract ends with one error saying what to change;
- `start()`'s `num_rounds` rules: FedDDPM+ corrects at the last round of `start()`;
- live nodes: a node that joins after round 1 takes part from its next round (centralized and decentralized),
  and OledFL/DFedAvg run under `start()` with no other call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from uuid import uuid4

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from common.algorithm_table import ALGORITHMS
from fedsynth import strategies
from fedsynth.client import config_value, message_codec

Reply = Callable[[Message, int], RecordDict]


def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of named numpy arrays (ArrayRecord takes a dict of `Array`s, or a list of ndarrays)."""
    return ArrayRecord({name: Array(value) for name, value in arrays.items()})


def template_train(message: Message, pid: int) -> RecordDict:
    """The template's train reply: the model moved by (pid + 1) / 10, `train_loss` and `num-examples`."""
    model = {k: v.numpy() + np.float32((pid + 1) / 10) for k, v in message.content["arrays"].items()}
    return RecordDict({"arrays": record(model),
                       "metrics": MetricRecord({"train_loss": 1.0 / (pid + 1), "num-examples": 10 * (pid + 1)})})


def template_evaluate(message: Message, pid: int) -> RecordDict:
    return RecordDict({"metrics": MetricRecord({"eval_loss": 0.5, "eval_acc": 0.25 * (pid + 1),
                                                "num-examples": 4})})


class FunctionGrid:
    """A duck-typed Flower `Grid` whose nodes answer with plain functions; nodes can join between rounds."""

    def __init__(self, num_nodes: int, train: Reply = template_train, evaluate: Reply = template_evaluate) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        # Messages take their run id from the process's task identity, as in a ServerApp process.
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.pids: dict[int, int] = {}
        self.train, self.evaluate = train, evaluate
        self.received: list[tuple[int, Message]] = []  # (partition, message) of every message sent
        self.round_hooks: dict[int, Callable[[], None]] = {}
        for _ in range(num_nodes):
            self.add_node()

    def add_node(self) -> int:
        pid = len(self.pids)
        self.pids[5000 + 7 * pid] = pid
        return pid

    def get_node_ids(self) -> Iterable[int]:
        return list(self.pids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid4().hex
            pid = self.pids[message.metadata.dst_node_id]
            self.received.append((pid, message))
            answer = self.train if message.metadata.message_type == MessageType.TRAIN else self.evaluate
            replies.append(Message(answer(message, pid), reply_to=message))
        return replies


def initial() -> ArrayRecord:
    return record({"w": np.zeros(3, dtype=np.float32)})


def weights(record: ArrayRecord) -> np.ndarray:
    return np.asarray(record["w"].numpy())


def test_a_template_clientapp_runs_with_fedsynths_fedavg():
    grid = FunctionGrid(2)
    strategy = strategies.FedAvg()  # the plain weighted mean
    result = strategy.start(grid, initial(), num_rounds=2, timeout=10, train_config=ConfigRecord({"lr": 0.1}))

    # counts 10 and 20: (0.1 * 10 + 0.2 * 20) / 30 per round
    np.testing.assert_allclose(weights(result.arrays), np.full(3, 2 * 5.0 / 30), rtol=1e-6)
    train = result.train_metrics_clientapp[2]
    assert train["train-loss"] == pytest.approx((1.0 * 10 + 0.5 * 20) / 30)
    evaluation = result.evaluate_metrics_clientapp[2]
    assert evaluation["local-test-accuracy"] == pytest.approx(0.375)  # (0.25 + 0.5) / 2, 4 examples each
    assert evaluation["local-test-loss"] == pytest.approx(0.5)


def test_weighted_by_key_names_the_weighing_metric():
    def train(message: Message, pid: int) -> RecordDict:
        content = template_train(message, pid)
        content["metrics"] = MetricRecord({**dict(content["metrics"]), "examples": 10 * (pid + 1)})  # 10 and 20
        return content

    strategy = strategies.FedAvg(weighted_by_key="examples")
    result = strategy.start(FunctionGrid(2, train=train), initial(), num_rounds=1, timeout=10)
    np.testing.assert_allclose(weights(result.arrays), np.full(3, (0.1 * 10 + 0.2 * 20) / 30), rtol=1e-6)
    assert result.train_metrics_clientapp[1]["train-loss"] == pytest.approx((1.0 * 10 + 0.5 * 20) / 30)


def test_a_weight_that_disagrees_with_num_examples_is_a_broken_reply():
    def train(message: Message, pid: int) -> RecordDict:  # the weighing metric is not the example count
        content = template_train(message, pid)
        content["metrics"] = MetricRecord({**dict(content["metrics"]), "batches": 3 - pid})
        return content

    with pytest.raises(strategies.ReplyContractError, match="'batches' .weighted_by_key. = 3 disagrees with "
                                                            "'num-examples' = 10"):
        strategies.FedAvg(weighted_by_key="batches").start(FunctionGrid(2, train=train), initial(), num_rounds=1,
                                                           timeout=10)


@pytest.mark.parametrize(("strategy", "expected"), [
    (lambda: strategies.FedSAM(sam_rho=0.07), {"sam-rho": 0.07, "compression": "none"}),
    (lambda: strategies.FedSynSAM(codec=strategies.QSGD(bits=4, qsgd_scope="bucket", qsgd_bucket=64), synsam_beta=0.8),
     {"compression": "qsgd", "bits": 4, "qsgd-scope": "bucket", "qsgd-bucket": 64, "synsam-beta": 0.8}),
    (lambda: strategies.FedCOG(cog_start_round=2), {"cog-start-round": 2}),
    (lambda: strategies.OledFL(gossip=strategies.Gossip(topology="ring"), ole_beta=0.5), {"ole-beta": 0.5}),
    (lambda: strategies.OledFL(sam=True, gossip=strategies.Gossip(topology="ring"), ole_beta=0.5, sam_rho=0.02),
     {"ole-beta": 0.5, "sam-rho": 0.02}),
])
def test_the_train_message_carries_every_client_setting(strategy, expected):
    grid = FunctionGrid(3)
    messages = list(strategy().configure_train(1, initial(), ConfigRecord({"lr": 0.1}), grid))
    assert messages
    for message in messages:
        config = message.content["config"]
        assert {key: config_value(config, key) for key in expected} == expected
        assert config["lr"] == 0.1 and config["server-round"] == 1


def test_the_client_reads_the_codec_from_the_train_config():
    strategy = strategies.FedSynSAM(codec=strategies.QSGD(bits=4, levels=7, qsgd_scope="bucket", qsgd_bucket=64))
    message = list(strategy.configure_train(1, initial(), ConfigRecord({}), FunctionGrid(2)))[0]
    spec = message_codec(message.content["config"])
    assert (spec.compression, spec.bits, spec.levels, spec.qsgd_scope, spec.qsgd_bucket) == ("qsgd", 4, 7, "bucket", 64)
    assert message_codec(ConfigRecord({"lr": 0.1})).compression == "none"
    with pytest.raises(KeyError, match="sam-rho"):
        config_value(ConfigRecord({}), "sam-rho")


def test_a_broken_reply_contract_fails_the_first_round_with_one_error():
    def train(message: Message, pid: int) -> RecordDict:  # no loss at all
        return RecordDict({"arrays": message.content["arrays"], "metrics": MetricRecord({"num-examples": 5})})

    calls: list[int] = []
    with pytest.raises(strategies.ReplyContractError, match="train-loss.*Change the ClientApp's reply.*train_loss"):
        strategies.FedAvg(max_failed_rounds=5).start(
            FunctionGrid(2, train=train), initial(), num_rounds=4, timeout=10,
            evaluate_fn=lambda rnd, arrays: calls.append(rnd))
    assert calls == [0]  # no round finished: the error came in round 1, not after max_failed_rounds


def test_scaffold_names_its_extra_record_in_the_contract_error():
    with pytest.raises(strategies.ReplyContractError, match="scaffold-delta-c"):
        strategies.Scaffold().start(FunctionGrid(2), initial(), num_rounds=2, timeout=10)


def test_a_node_error_is_not_a_contract_violation():
    def train(message: Message, pid: int) -> RecordDict:
        raise RuntimeError("node down")

    grid = FunctionGrid(2)

    def failing(messages, *, timeout=None):
        from flwr.app import Error

        out = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid4().hex
            out.append(Message(Error(code=2, reason="node down"), reply_to=message))
        return out

    grid.send_and_receive = failing
    with pytest.raises(strategies.TooManyFailedRounds) as raised:
        strategies.FedAvg(max_failed_rounds=2).start(grid, initial(), num_rounds=3, timeout=10)
    assert not isinstance(raised.value, strategies.ReplyContractError)


def join_after_round_1(grid: FunctionGrid) -> Callable[[int, ArrayRecord], None]:
    """An `evaluate_fn` that connects one more node to `grid` once round 1 is done."""

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> None:
        if server_round == 1:
            grid.add_node()

    return evaluate_fn


def test_a_node_that_joins_after_round_1_takes_part_from_its_next_round():
    grid = FunctionGrid(2)
    strategy = strategies.FedAvg()
    evaluate_fn = join_after_round_1(grid)
    strategy.start(grid, initial(), num_rounds=3, timeout=10, evaluate_fn=evaluate_fn)
    trained = {(pid, int(m.content["config"]["server-round"])) for pid, m in grid.received
               if m.metadata.message_type == MessageType.TRAIN}
    assert (2, 1) not in trained and {(2, 2), (2, 3)} <= trained
    assert strategy.round_log.latest.answered == 3


def test_min_available_nodes_waits_for_the_nodes(monkeypatch):
    grid = FunctionGrid(1)
    waits: list[int] = []

    def sleep(seconds: float) -> None:  # each poll, one more node connects
        waits.append(len(list(grid.get_node_ids())))
        grid.add_node()

    monkeypatch.setattr("server_app.strategies.node_table.time.sleep", sleep)
    strategy = strategies.FedAvg(min_available_nodes=3)
    strategy.start(grid, initial(), num_rounds=1, timeout=10)
    assert waits == [1, 2] and strategy.round_log.latest.answered == 3


def decentralized_train(message: Message, pid: int) -> RecordDict:
    """A node's model: its own restored model (or zeros) plus (pid + 1) / 10; it reports its own model's round."""
    own = message.content.array_records.get("node-state:decentralized-own-model")
    base = np.asarray(own["w"].numpy()) if own is not None else np.zeros(3, dtype=np.float32)
    return RecordDict({"arrays": record({"w": base + np.float32((pid + 1) / 10)}),
                       "metrics": MetricRecord({"train-loss": 0.1, "num-examples": 5})})


@pytest.mark.parametrize("public", [strategies.DFedAvg, strategies.OledFL])
def test_the_decentralized_relay_runs_under_start_and_takes_a_joining_node(public):
    grid = FunctionGrid(3, train=decentralized_train)
    strategy = public(gossip=strategies.Gossip(topology="ring"), min_nodes=1)
    evaluate_fn = join_after_round_1(grid)
    result = strategy.start(grid, initial(), num_rounds=3, timeout=10, evaluate_fn=evaluate_fn)
    assert result.arrays is not None
    joined = [m for pid, m in grid.received if pid == 3 and m.metadata.message_type == MessageType.TRAIN]
    assert [int(m.content["config"]["server-round"]) for m in joined] == [2, 3]
    # it starts from the average model of round 1 (the three nodes moved by 0.1, 0.2, 0.3), sent as its own model
    np.testing.assert_allclose(joined[0].content["node-state:decentralized-own-model"]["w"].numpy(), np.full(3, 0.2), rtol=1e-6)
    assert "gossip" in joined[0].content.config_records and len(strategy.node_table.nodes) == 4
    assert strategy.round_log.latest.answered == 4


def test_docs_name_only_client_functions_that_exist():
    """Every `fedsynth.client.<name>` in the strategies' docstrings and docs/library.md is a real function."""
    import re
    from pathlib import Path

    import fedsynth.client as client

    root = Path(__file__).resolve().parent.parent
    text = "".join(path.read_text() for path in sorted((root / "fedsynth" / "strategies").glob("*.py")))
    text += (root / "docs" / "library.md").read_text()
    named = set(re.findall(r"fedsynth\.client\.([A-Za-z_]\w*)", text))
    assert named and not {name for name in named if not hasattr(client, name)}


def test_the_docs_arrayrecord_of_numpy_arrays_builds():
    """library.md's way to send a dict of numpy arrays (ArrayRecord itself refuses a dict of ndarrays)."""
    weights = {"w": np.arange(3, dtype=np.float32), "n": np.array(2, dtype=np.int64)}
    back = {name: array.numpy() for name, array in record(weights).items()}
    assert back.keys() == weights.keys() and all(np.array_equal(back[k], weights[k]) for k in weights)


def test_flower_names_are_read_as_fedsynths_and_fedsynths_own_win():
    from server_app.wire import with_fedsynth_metric_names

    template = MetricRecord({"train_loss": 0.5, "eval_acc": 0.75, "eval_loss": 1.5, "num-examples": 3})
    read = with_fedsynth_metric_names(template)
    assert (read["train-loss"], read["local-test-accuracy"], read["local-test-loss"]) == (0.5, 0.75, 1.5)
    both = MetricRecord({"train_loss": 0.5, "train-loss": 0.25, "num-examples": 3})
    assert with_fedsynth_metric_names(both) is both  # a fedsynth reply is read as it came


def test_joining_nodes_are_numbered_on_and_never_renumbered():
    from server_app.strategies.node_table import NodeInfo, with_new_nodes

    table = [NodeInfo(node_id=50, partition_id=0), NodeInfo(node_id=20, partition_id=1)]
    grown = with_new_nodes(table, [20, 90, 50, 70])  # 50 and 20 known; 70 and 90 join, numbered in id order
    assert [(n.node_id, n.partition_id) for n in grown] == [(50, 0), (20, 1), (70, 2), (90, 3)]
    assert with_new_nodes(grown, [90]) == grown  # a node that left keeps its entry


def test_a_contract_error_needs_every_failure_to_be_a_contract_break():
    from server_app.wire import contract_violation_error

    broken = [{"reason": "reply metric 'train-loss' = None is not a finite number"}]
    assert "train-loss" in contract_violation_error("FedAvg", broken, "reply X")
    assert contract_violation_error("FedAvg", broken + [{"reason": "timeout"}], "reply X") is None
    assert contract_violation_error("FedAvg", broken + [{"reason": "error: node down"}], "reply X") is None
    assert contract_violation_error("FedAvg", [], "reply X") is None


def test_every_parameter_of_every_public_strategy_is_typed_and_documented():
    """No public class takes `**kwargs`; its docstring, and so `help()`, lists each parameter with its default."""
    import inspect
    import pydoc

    public = [getattr(strategies, name) for name in strategies.__all__]
    classes = [cls for cls in public if isinstance(cls, type) and hasattr(cls, "configure_train")]
    assert len(classes) == len({row.strategy_name for row in ALGORITHMS.values()})  # one per table `strategy`
    for cls in classes:
        parameters = list(inspect.signature(cls).parameters.values())
        assert parameters, cls
        help_text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
        for parameter in parameters:
            assert parameter.kind is parameter.KEYWORD_ONLY, (cls, parameter)  # no *args, no **kwargs
            assert parameter.annotation is not parameter.empty and parameter.default is not parameter.empty
            shown = getattr(parameter.default, "__name__", None) or repr(parameter.default)
            entry = f"{parameter.name} : {parameter.annotation} (default: {shown})"
            assert entry in cls.__doc__, (cls, entry)
            assert entry in help_text, (cls, entry)


def test_a_public_class_takes_only_the_settings_its_server_uses():
    """Client-only or app-only run-config keys are no parameters (FedAvg has no rho; no class has the app's rounds)."""
    import inspect

    fedavg = set(inspect.signature(strategies.FedAvg).parameters)
    assert not fedavg & {"sam_rho", "cog_start_round", "ole_beta", "model", "dataset"}
    assert "sam_rho" in inspect.signature(strategies.FedSAM).parameters  # FedSAM sends it as "sam-rho"
    assert "ole_beta" not in inspect.signature(strategies.DFedAvg).parameters
    assert "codec" not in inspect.signature(strategies.DFedAvg).parameters  # the relay decodes nothing
    for name in strategies.__all__:
        cls = getattr(strategies, name)
        if isinstance(cls, type) and hasattr(cls, "configure_train"):
            assert not set(inspect.signature(cls).parameters) & {"num_server_rounds", "lr", "results_dir", "run_name"}


def test_the_defaults_are_the_run_configs():
    """A public class's defaults are the run config's for its algorithm (one set of defaults; a change there flows
    through): `aggregation = "auto"` is FedSynSAM's paper mean, as the class's default."""
    import inspect

    from common.run.config import RunConfig

    defaults = RunConfig(algorithm="fedsynsam")
    for name in ("aggregation", "seed", "min_nodes", "server_lr", "sam_rho", "synsam_beta"):
        assert inspect.signature(strategies.FedSynSAM).parameters[name].default == getattr(defaults, name), name
    distillation = inspect.signature(strategies.FedSynSAM).parameters["distillation"].default
    assert (distillation.trajectory_rounds, distillation.synthetic_ipc) == (defaults.trajectory_rounds,
                                                                           defaults.synthetic_ipc)
    # the grouped values' defaults are the run config's too (their fields mirror its keys)
    assert (strategies.QSGD().bits, strategies.QSGD().qsgd_scope, strategies.TopK().topk_ratio) == (
        defaults.bits, defaults.qsgd_scope, defaults.topk_ratio)
    assert (strategies.TrimmedMean().fraction, strategies.Krum().byzantine_nodes) == (
        defaults.trim_fraction, defaults.byzantine_nodes)


def test_state_dict_continues_a_run_as_if_it_never_stopped():
    """FedAvgM's velocity through state_dict(): 2 rounds, a new strategy loads the state, round 3 == a 3-round run."""
    whole = strategies.FedAvgM(server_momentum=0.5).start(FunctionGrid(2), initial(), num_rounds=3)

    first = strategies.FedAvgM(server_momentum=0.5)
    part = first.start(FunctionGrid(2), initial(), num_rounds=2)
    state = first.state_dict()
    assert state["completed-rounds"] == 2 and "velocity" in state["arrays"]

    again = strategies.FedAvgM(server_momentum=0.5)
    again.load_state_dict(state)
    grid = FunctionGrid(2)
    resumed = again.start(grid, part.arrays, num_rounds=3)
    assert {int(m.content["config"]["server-round"]) for _, m in grid.received} == {3}  # rounds 1-2 send nothing
    np.testing.assert_array_equal(weights(resumed.arrays), weights(whole.arrays))

    forgetful = strategies.FedAvgM(server_momentum=0.5)
    forgetful.load_state_dict({**state, "arrays": {}})  # without the velocity the last step is another one
    assert not np.array_equal(weights(forgetful.start(FunctionGrid(2), part.arrays, num_rounds=3).arrays),
                              weights(whole.arrays))


def test_a_resumed_state_whose_model_breaks_every_reply_is_named_not_the_clientapp():
    def train(message: Message, pid: int) -> RecordDict:  # a node training from a huge model overflows
        with np.errstate(over="ignore"):
            model = {k: v.numpy() * np.float32(10) for k, v in message.content["arrays"].items()}
        return RecordDict({"arrays": record(model), "metrics": MetricRecord({"train_loss": 1.0, "num-examples": 10})})

    strategy = strategies.FedAvg()
    strategy.load_state_dict({"arrays": {}, "meta": {}, "completed-rounds": 2})
    huge = record({"w": np.full(3, 3e38, dtype=np.float32)})  # finite, but x10 is not
    with pytest.raises(strategies.ReplyContractError) as ended:
        strategy.start(FunctionGrid(2, train=train), huge, num_rounds=4, timeout=10)
    message = str(ended.value)
    assert "first round after resuming from the state given to load_state_dict (round 2)" in message
    assert "largest weight is |w| = 3e+38, in 'w'" in message
    assert "Change the ClientApp's reply" not in message
