"""An in-process Grid: the real ServerApp logic talking to the real ClientApp, without Ray.

Each node has its own Context (node config, persistent state, run config);
`send_and_receive` calls the ClientApp for each message in turn. Faults can be
injected per (partition, round, message type): an exception, or a reply that
never arrives (a timeout). An exception of the ClientApp becomes an error reply,
as in Flower's runtimes. Flower's own engine is exercised by the slower
simulation tests; this harness makes the exact-number tests fast, and the
presets that need a server-side hook between rounds (FedCOG's continuation
from a FedAvg checkpoint) use it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from uuid import uuid4

from flwr.app import Context, Message, RecordDict

from client_app.app import app as client_app


class InProcessGrid:
    """Duck-typed `flwr.serverapp.Grid` running the ClientApp in this process."""

    def __init__(self, num_nodes: int, run_config: dict[str, Any], node_config: Callable[[int], dict] | None = None,
                 keep_sent: bool = True) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        # Messages take their run id from the process's task identity, as in a ServerApp process.
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.contexts: dict[int, Context] = {}
        for pid in range(num_nodes):
            node_id = 1000 + pid
            config = node_config(pid) if node_config else {"partition-id": pid, "num-partitions": num_nodes}
            self.contexts[node_id] = Context(
                run_id=1, node_id=node_id, node_config=config, state=RecordDict(), run_config=dict(run_config)
            )
        # (partition id, server round, message type) -> "raise" | "timeout" | callable(reply) -> reply
        self.faults: dict[tuple[int, int, str], Any] = {}
        # every message sent, for tests to inspect; off for real runs, where it holds every round's models
        # (a 200-round run of 100 decentralized nodes reached 12 GB)
        self.keep_sent = keep_sent
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def _round_of(self, message: Message) -> int:
        config = message.content.config_records.get("config")
        return int(config["server-round"]) if config and "server-round" in config else 0

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            # a message id, as Flower's grids give each pushed message; replies name it in reply_to_message_id
            message.metadata.__dict__["_message_id"] = uuid4().hex
            if self.keep_sent:
                self.sent.append(message)
            node_id = message.metadata.dst_node_id
            context = self.contexts[node_id]
            pid = context.node_config.get("partition-id")
            kind = message.metadata.message_type.split(".")[0]
            fault = self.faults.get((pid, self._round_of(message), kind))
            if fault == "timeout":
                continue
            if fault == "raise":
                replies.append(_error_reply(message, "injected failure"))
                continue
            try:
                reply = client_app(message, context)
            except Exception as err:  # noqa: BLE001 - as Flower's runtime: a ClientApp exception is an error reply
                replies.append(_error_reply(message, f"{type(err).__name__}: {err}"))
                continue
            if callable(fault):
                reply = fault(reply)
            replies.append(reply)
        return replies


def _error_reply(message: Message, reason: str) -> Message:
    from flwr.app import Error

    return Message(Error(code=2, reason=reason), reply_to=message)


def run_federation(raw: dict[str, Any], grid: "InProcessGrid") -> dict[str, Any]:
    """handshake -> strategy -> run, exactly as the ServerApp's main does, on an in-process grid."""
    from server_app.app import serve_run_config

    return serve_run_config(grid, raw)


class SlowGrid(InProcessGrid):
    """An in-process grid whose rounds take at least `delay` seconds (to be killed mid-run)."""

    def __init__(self, *args: Any, delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        import time

        replies = super().send_and_receive(messages, timeout=timeout)
        time.sleep(self.delay)
        return replies


if __name__ == "__main__":
    # python -m fedsynth.inprocess '<run config as JSON>' <num nodes> [<seconds per round>]
    import json
    import sys

    config = json.loads(sys.argv[1])
    nodes = int(sys.argv[2])
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    run_federation(config, SlowGrid(nodes, config, delay=delay))
