"""A duck-typed Flower `Grid` whose nodes answer with a ClientApp-shaped function `(msg, context) -> Message`,
in this process (the tests of docs/library.md's reply builders and contract errors)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from uuid import uuid4

from flwr.app import Context, Message, MessageType, MetricRecord, RecordDict

Answer = Callable[[Message, Context], Message]


def evaluate_nothing(msg: Message, context: Context) -> Message:
    """An evaluate reply with no local test split (`num-examples` 0 is allowed)."""
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 0, "eval_acc": 0.0, "eval_loss": 0.0})}),
                   reply_to=msg)


class ClientAppGrid:
    """Nodes 0..n-1 (node ids 900 + pid), each with its own `Context` (partition id in `node_config`)."""

    def __init__(self, num_nodes: int, train: Answer, evaluate: Answer = evaluate_nothing,
                 query: Answer | None = None) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.train, self.evaluate, self.query = train, evaluate, query
        self.contexts = {900 + pid: Context(run_id=1, node_id=900 + pid, state=RecordDict(), run_config={},
                                            node_config={"partition-id": pid, "num-partitions": num_nodes})
                         for pid in range(num_nodes)}
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid4().hex
            self.sent.append(message)
            kind = message.metadata.message_type
            answer = (self.train if kind == MessageType.TRAIN else self.evaluate if kind == MessageType.EVALUATE
                      else self.query)
            replies.append(answer(message, self.contexts[message.metadata.dst_node_id]))
        return replies


def passthrough_wrapper(strategy):
    """A Flower strategy wrapper that only forwards to the strategy it wraps (as Flower's wrappers hold it:
    `wrapper.strategy`); it is none of Flower's DP wrappers, so fedsynth's strategies do not judge it."""
    from flwr.serverapp.strategy import Strategy

    class Passthrough(Strategy):
        def __init__(self, inner) -> None:
            self.strategy = inner

        def configure_train(self, *args):
            return self.strategy.configure_train(*args)

        def aggregate_train(self, *args):
            return self.strategy.aggregate_train(*args)

        def configure_evaluate(self, *args):
            return self.strategy.configure_evaluate(*args)

        def aggregate_evaluate(self, *args):
            return self.strategy.aggregate_evaluate(*args)

        def summary(self) -> None:
            pass

    return Passthrough(strategy)
