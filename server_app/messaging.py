"""Send a round's messages and collect their replies, noticing each reply within `reply-poll-interval`.

Flower's `Grid.send_and_receive` pushes the messages and then checks for
replies every 3 s in the deployment engine (`flwr/superlink/grid/http_grid.py`)
and every 0.1 s in simulation, so in a deployment a round ends on average
1.5 s after its last reply. This is the same push-then-pull through the Grid's
public `push_messages` / `pull_messages`, with a short interval: a pull is one
small request to the SuperLink (or a lookup in simulation's in-memory state).
Grids that are not Flower's (the in-process harness of tests and presets)
deliver synchronously and keep their own `send_and_receive`.

A message whose node the SuperLink answers for as unavailable (a SuperNode
that died or restarts) is held and sent again once that node is back, within
the round's timeout (server_app/node_return.py says what Flower does there).

`match_replies` pairs each reply with the message it answers through
`reply_to_message_id`. A reply's `src_node_id` is not the node it speaks for:
when a node stops reporting heartbeats the SuperLink itself answers its
pending message with a "Node Unavailable" error whose source is the SuperLink
(node id 1), so failure records keyed by the sender would name the wrong node
and count the lost one twice (once for the error, once as a timeout).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from flwr.app import Message
from flwr.serverapp import Grid

from common.run.interrupt import raise_if_stopped
from server_app.node_return import Held, NodeReturnWait
from server_app.reply_pulls import adapt_reply_pulls


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float | None,
                     poll_interval: float, returns: NodeReturnWait | None = None) -> list[Message]:
    """Push `messages`, then pull replies every `poll_interval` s until all arrived or `timeout` s passed.

    With `returns`, a message whose node the SuperLink answers for as unavailable is held and sent again when
    its node is back, within `timeout` (server_app/node_return.py); if the node stays away, that answer is its
    reply. Raises RunInterrupted at the next poll once a stop was requested (SIGINT/SIGTERM,
    common/run/interrupt.py).
    """
    raise_if_stopped()
    if not isinstance(grid, Grid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    messages = list(messages)
    pending = _push(grid, messages, returns)
    by_id = {message.metadata.message_id: message for message in messages}
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    held: list[Held] = []  # messages whose node is unavailable, waiting for it (only with `returns`)
    last_check = -math.inf
    last_listed = time.monotonic()  # PollingGrid listed the nodes as the call began
    while pending or held:
        if returns is not None and pending and time.monotonic() - last_listed >= returns.check_interval:
            last_listed = time.monotonic()  # the nodes' heartbeat deadlines, for who ended a lost session
            returns.note_deadlines(grid.get_nodes())
        pulled = list(grid.pull_messages(pending)) if pending else []
        for reply in pulled:
            answered = reply.metadata.reply_to_message_id
            kept = None
            if returns is not None and answered in pending:
                kept = returns.hold(by_id.get(answered), reply, time.monotonic())
            if kept is None:
                replies.append(reply)
            else:
                held.append(kept)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in pulled)
        now = time.monotonic()
        if returns is not None and held:
            still_away = []
            for h in held:
                if returns.expired(h, now):  # it had its node-return-wait: the SuperLink's answer is its reply
                    replies.append(h.answer)
                else:
                    still_away.append(h)
            held = still_away
            if held and now - last_check >= returns.check_interval:
                last_check = now
                returned, stranger = returns.back(held, returns.note_deadlines(grid.get_nodes()))
                if returned:
                    again = [h.message for h in returned]
                    pending.update(_push(grid, again, returns))
                    by_id.update({message.metadata.message_id: message for message in again})
                resent = {id(h) for h in returned}
                waiting = [h for h in held if id(h) not in resent]
                if stranger:  # a node back under a new id: the old ids will not return (node_return.py)
                    replies += [h.answer for h in waiting]
                    waiting = []
                held = waiting
        if not pending and not held:
            break
        raise_if_stopped()
        wait = poll_interval if pending or returns is None else returns.check_interval
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = min(wait, remaining)
        time.sleep(wait)
    if held:  # the timeout ended the wait: a node still away keeps the SuperLink's answer
        replies += returns.timed_out(held)
    return replies


def _push(grid: Grid, messages: list[Message], returns: NodeReturnWait | None) -> set[str]:
    """Push `messages`; the ids of those the grid took."""
    if returns is not None:
        returns.note_sent(messages)
    return {message_id for message_id in grid.push_messages(messages) if message_id}


def sender_mismatch(message: Message, reply: Message) -> str | None:
    """Why `reply` cannot speak for the node `message` went to, or None.

    A reply that is not an error must come from that node: a node that answers another node's message id
    (a faulty or hostile ClientApp, or a grid that is not Flower's) is not that node. An error reply may come
    from elsewhere: the SuperLink answers for a lost node from node id 1 (module docstring).
    """
    source, destination = reply.metadata.src_node_id, message.metadata.dst_node_id
    if reply.has_error() or source == destination:
        return None
    return f"reply from node {source} answers the message sent to node {destination}"


def match_replies(sent: Sequence[Message], replies: Iterable[Message]) -> tuple[list[tuple[Message, Message]], list[Message]]:
    """Pair replies with the sent messages they answer; returns ([(sent, reply)...] in `sent` order, unanswered sent).

    A reply is matched by its `reply_to_message_id`. Of several replies to one message, the first from the
    node it went to wins, then the first error reply, then the first from another node (which its caller drops
    with `sender_mismatch`'s reason); replies answering none of `sent` and the other replies to a message are
    left out (`misaddressed_replies` lists those that came from another node).
    """
    ids = [message.metadata.message_id for message in sent]
    if "" in ids or len(set(ids)) != len(ids):
        raise ValueError("every sent message needs its own message id (set when the grid pushes it)")
    by_id = {message.metadata.message_id: message for message in sent}
    reply_to: dict[str, Message] = {}
    for reply in replies:
        message = by_id.get(reply.metadata.reply_to_message_id)
        if message is None:
            continue
        held = reply_to.get(message.metadata.message_id)
        if held is None or _rank(message, reply) < _rank(message, held):
            reply_to[message.metadata.message_id] = reply
    pairs: list[tuple[Message, Message]] = []
    unanswered: list[Message] = []
    for message in sent:
        reply = reply_to.get(message.metadata.message_id)
        if reply is None:
            unanswered.append(message)
        else:
            pairs.append((message, reply))
    return pairs, unanswered


def _rank(message: Message, reply: Message) -> int:
    """0: from the node the message went to; 1: an error reply (the SuperLink's for a lost node); 2: another node's."""
    if sender_mismatch(message, reply) is not None:
        return 2
    return 1 if reply.has_error() and reply.metadata.src_node_id != message.metadata.dst_node_id else 0


def surplus_replies(sent: Sequence[Message], replies: Iterable[Message],
                    pairs: Sequence[tuple[Message, Message]]) -> list[tuple[int, str]]:
    """(sender's node id, reason) for each reply `pairs` left out that `misaddressed_replies` does not list: a second
    reply of the node a message went to, and a reply that answers none of `sent`. A caller records each as dropped,
    so a node that answers twice or out of turn leaves a trace (the first reply of the addressed node still counts)."""
    if not all(message.metadata.message_id for message in sent):  # never pushed: paired by node id
        return []
    by_id = {message.metadata.message_id: message for message in sent}
    chosen = {id(reply) for _, reply in pairs}
    out = []
    for reply in replies:
        if id(reply) in chosen:
            continue
        source = reply.metadata.src_node_id
        message = by_id.get(reply.metadata.reply_to_message_id)
        if message is None:
            out.append((source, "reply to no message of this round: dropped"))
        elif sender_mismatch(message, reply) is None:
            out.append((source, f"a second reply to the message sent to node {message.metadata.dst_node_id}: "
                                "dropped (the first counts)"))
    return out


def misaddressed_replies(sent: Sequence[Message], replies: Iterable[Message],
                         pairs: Sequence[tuple[Message, Message]]) -> list[tuple[Message, Message]]:
    """(message, reply) for each reply from another node to one of `sent` that `pairs` left out: a caller
    records each as dropped, so the node that sent it cannot hide another node's reply without a trace."""
    if not all(message.metadata.message_id for message in sent):  # never pushed: paired by node id
        return []
    by_id = {message.metadata.message_id: message for message in sent}
    chosen = {id(reply) for _, reply in pairs}
    out = []
    for reply in replies:
        message = by_id.get(reply.metadata.reply_to_message_id)
        if message is not None and id(reply) not in chosen and sender_mismatch(message, reply) is not None:
            out.append((message, reply))
    return out


class PollingGrid(Grid):
    """A Grid that notices replies within `poll_interval` s and waits for nodes that restart; the rest is the grid's.

    Flower's `Strategy.start()` calls `grid.send_and_receive`, which polls every 3 s in deployment. Handing
    `start()` this wrapper keeps fedsynth's round latency (module docstring) under Flower's own loop; any
    Flower user can do the same: `strategy.start(grid=PollingGrid(grid), ...)`. A message whose node the
    SuperLink reports unavailable is sent again when that node is back, within the call's timeout and at most
    `node_return_wait` s after that report (0: never; server_app/node_return.py).
    """

    def __init__(self, grid: Grid, poll_interval: float = 0.05, node_return_wait: float = 120.0) -> None:
        self.grid = grid
        self.poll_interval = poll_interval
        self.returns = NodeReturnWait(node_return_wait)

    def set_run(self, run_id):  # type: ignore[no-untyped-def]
        return self.grid.set_run(run_id)

    @property
    def run(self):  # type: ignore[no-untyped-def]
        return self.grid.run

    def create_message(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        node_ids = self.returns.note_deadlines(self.grid.get_nodes())  # who ends a lost session (node_return.py)
        self.returns.note_node_ids(node_ids)  # known ids do not end a wait for a return
        return node_ids

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if not messages:  # a round phase with nothing to send (Flower's start() still calls it)
            return []
        if self.returns.return_wait > 0:  # the nodes connected now: only a node id that connects later ends a wait
            self.get_node_ids()
        return send_and_receive(self.grid, messages, timeout, self.poll_interval, self.returns)


def polling_grid(grid: Grid, poll_interval: float, node_return_wait: float = 120.0) -> Grid:
    """`grid` wrapped in a PollingGrid, or unchanged when it is not Flower's (a test's in-process grid). A deployed
    grid pulls a reply's missing objects again after 0.05 s (server_app/reply_pulls.py)."""
    adapt_reply_pulls(grid)
    return PollingGrid(grid, poll_interval, node_return_wait) if isinstance(grid, Grid) else grid
