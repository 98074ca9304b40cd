"""The hostile probe's reply family (benchmarks/hostile_probe.py): one node of three answers a strategy's train (or
evaluate) message with a hostile reply, through Flower's Message API, on an in-process grid.

docs/library.md's contract: a reply that fails, times out or breaks the contract is dropped and listed with its
reason in `strategy.round_log.latest.failures`; a reply from another node than the one its message went to never counts
as that node's; a first round in which every reply broke the contract raises `ReplyContractError`. So a hostile reply
is handled when the run ends with the model of the honest replies alone and a failure recorded (or a refusal naming the
fault), silently wrong when it changed the model (or made it non-finite) or vanished without a record. With bounded
influence off (the default, the papers' plain mean), a huge but finite update or count that is counted is the
documented behaviour.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hostile_probe import HANDLED, UNCLEAR, WRONG, Case, Verdict

HOSTILE = 902  # node ids 900, 901 (honest) and 902
Mutate = Callable[..., object]


def net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


class Grid:
    """Three nodes answering in this process: `train(msg, node_id)` and `evaluate(msg, node_id)` give each reply
    (or a list of replies, or None for none)."""

    def __init__(self, train: Callable, evaluate: Callable) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.train, self.evaluate = train, evaluate

    def get_node_ids(self):
        return [900, 901, HOSTILE]

    def send_and_receive(self, messages, *, timeout=None):
        from uuid import uuid4

        from flwr.app import MessageType

        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid4().hex
            answer = self.train if message.metadata.message_type == MessageType.TRAIN else self.evaluate
            got = answer(message, message.metadata.dst_node_id)
            replies += [] if got is None else got if isinstance(got, list) else [got]
        return replies


def honest_train(msg, node_id: int, records: dict | None = None):
    """The node's model moved by 0.1 x (its index + 1), replied with `fedsynth.client.train_reply`."""
    import torch
    from flwr.app import RecordDict

    from fedsynth.client import train_reply

    model = net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * (node_id - 899))
    extra = {name: {k: np.zeros(a.numpy().shape, np.float32) for k, a in msg.content["arrays"].items()}
             for name in (records or {})}
    return train_reply(msg, model, num_examples=10, train_loss=0.5, records=extra or None, state=RecordDict())


def honest_evaluate(msg, node_id: int):
    from flwr.app import Message, MetricRecord, RecordDict

    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 10, "eval_acc": 0.5, "eval_loss": 1.0})}),
                   reply_to=msg)


def final_model(strategy, train, evaluate=honest_evaluate):
    from flwr.app import ArrayRecord, ConfigRecord

    initial = ArrayRecord(net().state_dict())
    result = strategy.start(grid=Grid(train, evaluate), initial_arrays=initial, num_rounds=1, timeout=10,
                            train_config=ConfigRecord({"lr": 0.1}))
    return {k: v.numpy() for k, v in result.arrays.items()}, result


def round_failures(strategy) -> list[dict]:
    """The last round's dropped replies, `{"node", "partition", "reason"}` each (none when no round ran)."""
    entry = strategy.round_log.latest
    return [failure.as_record() for failure in entry.failures] if entry is not None else []


def judge(make: Callable, mutate: Mutate | None = None, evaluate_mutate: Mutate | None = None,
          expect: str = "drop", records: tuple[str, ...] = (), reference_honest: bool = False) -> Verdict:
    """Run `make()`'s strategy with node 902 hostile and judge against the run in which 902 gives no reply.

    expect: "drop" (its reply must not count; a failure recorded), "count" (the documented plain mean counts it:
    the model must stay finite), "bounded" (bounded influence: the model stays near the honest one).
    """
    from fedsynth.strategies import ReplyContractError, TooManyFailedRounds

    def train(hostile: bool):
        def answer(msg, node_id):
            reply = honest_train(msg, node_id, dict.fromkeys(records))
            if node_id != HOSTILE:
                return reply
            if not hostile:
                return reply if reference_honest else None
            return mutate(msg, reply) if mutate else reply
        return answer

    def evaluate(msg, node_id):
        reply = honest_evaluate(msg, node_id)
        return evaluate_mutate(msg, reply) if node_id == HOSTILE and evaluate_mutate else reply

    reference, _ = final_model(make(), train(hostile=False))
    strategy = make()
    try:
        final, result = final_model(strategy, train(hostile=True), evaluate)
    except (ReplyContractError, TooManyFailedRounds) as err:
        return HANDLED, f"{type(err).__name__}: {err}"
    except Exception as err:  # noqa: BLE001 - a raw error from inside the strategy
        return UNCLEAR, f"start() raised {type(err).__name__}: {err}"
    failures = round_failures(strategy)
    said = "; ".join(str(f.get("reason")) for f in failures)[:300] or "no failure recorded"
    finite = all(np.isfinite(v).all() for v in final.values())
    gap = (max(float(np.max(np.abs(final[k].astype(np.float64) - reference[k]))) for k in reference)
           if finite else math.inf)
    if evaluate_mutate is not None:
        metrics = result.evaluate_metrics_clientapp.get(1, {})
        accuracy = next((float(v) for k, v in metrics.items() if "acc" in k), None)
        values = [float(v) for v in metrics.values() if isinstance(v, (int, float))]
        if accuracy is None or not all(math.isfinite(v) for v in values) or not 0 <= accuracy <= 1:
            return WRONG, f"evaluate metrics {dict(metrics)}"
        return HANDLED, f"evaluate metrics {dict(metrics)}"
    if expect == "count":
        recorded = [r for r, m in result.train_metrics_clientapp.items() if "non-finite-model" in m]
        if not finite and recorded:
            return HANDLED, f"the model became non-finite, recorded as 'non-finite-model' in round {recorded[0]}"
        return (HANDLED, f"counted by the documented plain mean (gap {gap:.3g})") if finite else \
            (WRONG, f"the model became non-finite; {said}")
    if expect == "bounded":
        return (HANDLED, f"bounded: gap {gap:.3g} to the honest model") if gap < 1.0 else \
            (WRONG, f"bounded influence let it move the model by {gap:.3g}; {said}")
    if not finite:
        return WRONG, f"the model became non-finite; {said}"
    if gap > 1e-5:
        return WRONG, f"counted: the model moved {gap:.3g} from the honest one; {said}"
    if not failures:
        return WRONG, "dropped without a record in round_log.latest.failures"
    return HANDLED, said


# ---- the hostile replies: functions (msg, honest reply) -> reply(ies)

def with_arrays(change: Callable[[dict], dict]) -> Mutate:
    def mutate(msg, reply):
        from flwr.app import Array, ArrayRecord

        arrays = change({k: v.numpy().copy() for k, v in reply.content["arrays"].items()})
        reply.content["arrays"] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
        return reply
    return mutate


def with_metrics(change: Callable[[dict], dict]) -> Mutate:
    def mutate(msg, reply):
        from flwr.app import MetricRecord

        metrics = change(dict(reply.content["metrics"]))
        reply.content["metrics"] = MetricRecord(metrics)
        return reply
    return mutate


def each(change: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], dict]:
    return lambda arrays: {k: change(v) for k, v in arrays.items()}


def first(change: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], dict]:
    return lambda arrays: {k: change(v) if i == 0 else v for i, (k, v) in enumerate(arrays.items())}


def set_metric(key: str, value: object) -> Callable[[dict], dict]:
    return lambda m: {**m, key: value}


def drop_metric(key: str) -> Callable[[dict], dict]:
    return lambda m: {k: v for k, v in m.items() if k != key}


def without(record: str) -> Mutate:
    def mutate(msg, reply):
        del reply.content[record]
        return reply
    return mutate


def from_node(src: int) -> Mutate:
    def mutate(msg, reply):
        reply.metadata.__dict__["_src_node_id"] = src
        return reply
    return mutate


def error_reply(msg, reply):
    from flwr.app import Error, Message

    return Message(Error(code=2, reason="the site's disk is full"), reply_to=msg)


def twice(msg, reply):
    return [reply, honest_train(msg, 900)]


def unknown_reply_to(msg, reply):
    reply.metadata.__dict__["_reply_to_message_id"] = "not-a-message-id"
    return reply


def record_change(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Mutate:
    def mutate(msg, reply):
        from flwr.app import Array, ArrayRecord

        arrays = {k: change(v.numpy().copy()) for k, v in reply.content[name].items()}
        reply.content[name] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
        return reply
    return mutate


def other_bits(msg, reply):
    config = msg.content["config"]
    kept = config["bits"]
    config["bits"] = 8
    try:
        return honest_train(msg, HOSTILE)
    finally:
        config["bits"] = kept


def nan_float(v: np.ndarray) -> np.ndarray:
    return np.full_like(v, np.nan) if np.issubdtype(v.dtype, np.floating) else v


def evaluate_metrics(change: Callable[[dict], dict]) -> Mutate:
    return with_metrics(change)


def reply_cases() -> list[Case]:
    from fedsynth import strategies as s

    fedavg, qsgd = (lambda: s.FedAvg()), (lambda: s.FedAvg(codec=s.QSGD(bits=4)))
    bounded = lambda: s.FedAvg(aggregation=s.Bounded("weighted", s.BOUNDED_INFLUENCE))  # noqa: E731
    big = lambda v: v * 1e6  # noqa: E731
    plain = [
        ("arrays NaN", with_arrays(first(lambda v: v * np.nan)), "drop"),
        ("arrays +inf", with_arrays(first(lambda v: v + np.inf)), "drop"),
        ("arrays -inf in one entry", with_arrays(first(lambda v: np.where(np.arange(v.size).reshape(v.shape) == 0,
                                                                          -np.inf, v))), "drop"),
        ("arrays 3e38 (float32 sum overflows)", with_arrays(each(lambda v: np.full_like(v, 3e38))), "drop"),
        ("arrays x1e6 (plain mean)", with_arrays(each(big)), "count"),
        ("arrays wrong shape", with_arrays(first(lambda v: v.reshape(-1))), "drop"),
        ("arrays transposed shape", with_arrays(first(lambda v: v.T.copy())), "drop"),
        ("arrays float64", with_arrays(each(lambda v: v.astype(np.float64))), "drop"),
        ("arrays int32", with_arrays(each(lambda v: v.astype(np.int32))), "drop"),
        ("arrays float16", with_arrays(each(lambda v: v.astype(np.float16))), "drop"),
        ("arrays bool", with_arrays(first(lambda v: v > 0)), "drop"),
        ("arrays 0-d scalar", with_arrays(first(lambda v: np.float32(1.0))), "drop"),
        ("arrays empty", with_arrays(first(lambda v: np.zeros((0,), np.float32))), "drop"),
        ("arrays missing one", with_arrays(lambda a: dict(list(a.items())[1:])), "drop"),
        ("arrays renamed", with_arrays(lambda a: {("x" + k if i == 0 else k): v for i, (k, v) in enumerate(a.items())}),
         "drop"),
        ("arrays none at all", with_arrays(lambda a: {}), "drop"),
        ("arrays record absent", without("arrays"), "drop"),
        ("metrics record absent", without("metrics"), "drop"),
        ("num-examples missing", with_metrics(drop_metric("num-examples")), "drop"),
        ("num-examples 0", with_metrics(set_metric("num-examples", 0)), "drop"),
        ("num-examples -5", with_metrics(set_metric("num-examples", -5)), "drop"),
        ("num-examples NaN", with_metrics(set_metric("num-examples", math.nan)), "drop"),
        ("num-examples inf", with_metrics(set_metric("num-examples", math.inf)), "drop"),
        ("num-examples 10.5", with_metrics(set_metric("num-examples", 10.5)), "drop"),
        ("num-examples 2**62 (plain weights)", with_metrics(set_metric("num-examples", 2**62)), "count"),
        ("num-examples list", with_metrics(set_metric("num-examples", [10, 10])), "drop"),
        ("train-loss missing", with_metrics(drop_metric("train-loss")), "drop"),
        ("train-loss NaN", with_metrics(set_metric("train-loss", math.nan)), "drop"),
        ("train-loss inf", with_metrics(set_metric("train-loss", math.inf)), "drop"),
        ("train-loss -1 (documented: any finite float)", with_metrics(set_metric("train-loss", -1.0)), "count"),
        ("extra metric NaN", with_metrics(set_metric("my-metric", math.nan)), "drop"),
        ("extra metric list with inf", with_metrics(set_metric("my-list", [1.0, math.inf])), "drop"),
        ("reply from another node (900)", from_node(900), "drop"),
        ("reply from an unknown node (77)", from_node(77), "drop"),
        ("reply to an unknown message id", unknown_reply_to, "drop"),
        ("a second reply to its message", twice, "drop"),
        ("error reply", error_reply, "drop"),
        ("no reply (timeout)", lambda msg, reply: None, "drop"),
    ]
    cases = [Case("replies", f"FedAvg: {name}", lambda m=m, e=e: judge(fedavg, m, expect=e,
                                                                        reference_honest=m is twice))
             for name, m, e in plain]
    cases += [
        Case("replies", "FedAvg: every node replies NaN", lambda: judge_all_bad()),
        Case("replies", "FedAvg: empty reply set", lambda: judge_empty()),
        Case("replies", "FedAvg(bounded influence): arrays x1e6 and 10**12 examples",
             lambda: judge(bounded, lambda msg, r: with_metrics(set_metric("num-examples", 10**12))(
                 msg, with_arrays(each(big))(msg, r)), expect="bounded")),
        Case("replies", "FedAvg(bounded influence): arrays 3e38",
             lambda: judge(bounded, with_arrays(each(lambda v: np.full_like(v, 3e38))), expect="bounded")),
        Case("replies", "FedAvg(weighted_by_key='w'): w disagrees with num-examples",
             lambda: judge(lambda: s.FedAvg(weighted_by_key="w"), with_metrics(set_metric("w", 10**9)))),
        Case("replies", "FedAvg(weighted_by_key='w'): w missing",
             lambda: judge(lambda: s.FedAvg(weighted_by_key="w"), with_metrics(drop_metric("w")))),
        Case("replies", "FedAvg(aggregation='median'): arrays NaN",
             lambda: judge(lambda: s.FedAvg(aggregation="median"), with_arrays(first(lambda v: v * np.nan)))),
        Case("replies", "FedAvg(max_update_norm=1, refuse): arrays x1e6",
             lambda: judge(lambda: s.FedAvg(aggregation=s.Bounded("weighted", s.BoundedInfluence(update_norm=1.0, update_norm_ratio=0.0, weight_share=1.0, action="refuse"))), with_arrays(each(big)))),
    ]
    compressed = [
        ("payload NaN", record_change("compressed-update", nan_float)),
        ("payload truncated", record_change("compressed-update", lambda v: v.reshape(-1)[:1].copy())),
        ("payload absent, arrays sent", lambda msg, r: honest_train_uncompressed(msg)),
        ("payload encoded with 8 bits, server sent 4", other_bits),
    ]
    cases += [Case("replies", f"FedAvg(qsgd 4 bits): {name}", lambda m=m: judge(qsgd, m)) for name, m in compressed]
    cases.append(Case("replies", "FedAvg(qsgd 4 bits): a payload of norm 2e38 (the model's squares overflow)",
                      lambda: judge(qsgd, pushed(1e38))))
    cases.append(Case("replies", "FedAvg(topk 0.25): top-k values 1e30 (the model's squares overflow)",
                      lambda: judge(lambda: s.FedAvg(codec=s.TopK(topk_ratio=0.25)), pushed(1e30))))
    cases.append(Case("replies", "FedAvg(median): arrays 3e38",
                      lambda: judge(lambda: s.FedAvg(aggregation="median"), pushed(3e38))))
    cases.append(Case("replies", "FedAvg(qsgd 4 bits): arrays + 100 beside the payload (the payload counts)",
                      lambda: judge(qsgd, add_arrays, expect="count")))
    cases.append(Case("replies", "FedAvg(server_lr=1e300): honest replies", lambda: judge(
        lambda: s.FedAvg(server_lr=1e300), lambda msg, r: r, expect="count")))
    for cls, record in ((s.Scaffold, "scaffold-delta-c"), (s.FedLESAMD, "dynamic-correction"),
                        (s.FedSMOO, "perturbation-dual")):
        for name, m in ((f"{record} NaN", record_change(record, lambda v: v * np.nan)),
                        (f"{record} wrong shape", record_change(record, lambda v: v.reshape(-1)[:1].copy())),
                        (f"{record} absent", without(record))):
            cases.append(Case("replies", f"{cls.__name__}: {name}",
                              lambda cls=cls, m=m, record=record: judge(cls, m, records=(record,))))
    evaluations = [
        ("eval_acc 5.0", set_metric("eval_acc", 5.0)), ("eval_acc NaN", set_metric("eval_acc", math.nan)),
        ("eval_acc -1", set_metric("eval_acc", -1.0)), ("eval_loss inf", set_metric("eval_loss", math.inf)),
        ("num-examples -10", set_metric("num-examples", -10)),
        ("num-examples 10**15", set_metric("num-examples", 10**15)),
        ("eval_acc as text", set_metric("eval_acc", [0.5])), ("metrics empty", lambda m: {}),
    ]
    cases += [Case("replies", f"FedAvg evaluate reply: {name}",
                   lambda c=c: judge(fedavg, evaluate_mutate=evaluate_metrics(c))) for name, c in evaluations]
    return cases


def pushed(value: float) -> Mutate:
    """The hostile node's reply from a model whose first four weights are `value` (encoded as the codec says)."""
    def mutate(msg, reply):
        import torch
        from flwr.app import RecordDict

        from fedsynth.client import train_reply

        model = net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        with torch.no_grad():
            model[0].weight.view(-1)[:4] = value
        return train_reply(msg, model, num_examples=10, train_loss=0.5, state=RecordDict())
    return mutate


def honest_train_uncompressed(msg):
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    arrays = {k: v.numpy() + 0.1 for k, v in msg.content["arrays"].items()}
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                               "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5})}), reply_to=msg)


def add_arrays(msg, reply):
    from flwr.app import Array, ArrayRecord

    reply.content["arrays"] = ArrayRecord({k: Array(v.numpy() + 100) for k, v in msg.content["arrays"].items()})
    return reply


def judge_all_bad() -> Verdict:
    from fedsynth.strategies import FedAvg, ReplyContractError

    def train(msg, node_id):
        return with_arrays(first(lambda v: v * np.nan))(msg, honest_train(msg, node_id))

    try:
        final_model(FedAvg(), train)
    except ReplyContractError as err:
        return HANDLED, f"ReplyContractError: {err}"
    except Exception as err:  # noqa: BLE001
        return UNCLEAR, f"{type(err).__name__}: {err}"
    return WRONG, "start() returned normally after a round of NaN replies"


def judge_empty() -> Verdict:
    from fedsynth.strategies import FedAvg, TooManyFailedRounds

    strategy = FedAvg()
    try:
        final, _ = final_model(strategy, lambda msg, node_id: None)
    except TooManyFailedRounds as err:
        return HANDLED, f"TooManyFailedRounds: {err}"
    except Exception as err:  # noqa: BLE001
        return UNCLEAR, f"{type(err).__name__}: {err}"
    failures = round_failures(strategy)
    return (HANDLED, f"round recorded: {failures[:1]}") if failures else \
        (WRONG, "a round without replies passed without a record")
