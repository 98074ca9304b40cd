"""Within a round, wait for a node that the SuperLink reports unavailable, and send its message again once it is back.

What Flower 1.42 does when a SuperNode dies (flwr/server/superlink/linkstate/):

- A node is online until `online_until`, which each heartbeat moves to now + `HEARTBEAT_PATIENCE` (2) x its
  heartbeat interval (30 s by default): a killed SuperNode stays "online" for up to 60 s. Messages pushed to
  it meanwhile are stored and wait; `grid.get_node_ids()` still lists it.
- Once `online_until` has passed, pulling the reply of any message to that node (one it had claimed before it
  died, or one still waiting) returns an error reply that the SuperLink makes itself, with
  `ErrorCode.NODE_UNAVAILABLE` (5) and the reason "Node Unavailable", from node id 1; the message is then
  deleted. `get_node_ids()` leaves the node out from then on.
- A SuperNode started again at once is refused ("Failed to activate SuperNode") while its old session is
  online, since only a node that is registered or offline may activate; deploy/retry-activation.sh starts it
  again every 2 s. With SuperNode authentication (deploy/supernode.sh's default) it then activates under the
  **same node id** (its key's), `get_node_ids()` lists it again, and a message pushed to it now is delivered.
  Without authentication it comes back under a new node id.
- Pushing the same `Message` object again stores it again: Flower's deployment grid gives it the same message
  id (its content hash leaves the id out), the in-memory grid a new one, set on the object itself, so the
  strategy that built the message pairs the new reply with it either way.

So a round that lost a node to a restart would lose its reply, although the node is back seconds after the
SuperLink's answer. `NodeReturnWait` keeps such a message instead: while the round's timeout lasts, and for at
most `return_wait` seconds after the SuperLink's answer, it looks at the grid's node ids every
`check_interval` seconds, and sends the message again as soon as its node is listed. A node that does not
come back within `return_wait` keeps its "Node Unavailable" reply, and later rounds do not wait for it again
until it has answered a message (a node that left for good costs one such wait, not one per round). The wait
also ends when a node id appears that was never seen before: a SuperNode without authentication comes back
under a new id, which the strategy takes in at its next round, so waiting for the old id would be in vain.

Flower's answer says the same in both cases ("The destination node failed to report a heartbeat within 2 x its
expected interval"), also when the SuperNode ended its session itself (a stop or a restart deactivates it: Flower
sets its `online_until` to that moment). Who ended it shows in the timing: the grid's `get_nodes()` lists each
online node's `online_until`, the deadline its last heartbeat set. `NodeReturnWait` keeps the latest deadline it
saw for each node (the server's grid looks every `check_interval` seconds while a round waits for replies), and
`session_end` reads the answer against it: an answer before the deadline means the node deactivated itself; an
answer after it, that its heartbeats stopped (a SuperNode killed, frozen or cut off). The answer's reason is
rewritten to say which, so the round's failure record and the log name who ended the session. The deadline is the
SuperLink's clock and the answer's time the ServerApp's: they agree where the ServerApp runs on the SuperLink's
host (Flower's SuperExec); a grid that lists no deadline (simulation's) gives "not known".

Every other reply, and every run without a lost node, goes through unchanged: the same messages, the same
replies, the same model.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from logging import INFO, WARNING

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log


def is_node_unavailable(reply: Message) -> bool:
    """Whether `reply` is the SuperLink's answer for a node whose heartbeats stopped ("Node Unavailable")."""
    return reply.has_error() and reply.error.code == ErrorCode.NODE_UNAVAILABLE


def session_end(answered_at: float, online_until: float | None) -> str:
    """Who ended a node's session, from the wall-clock time of the SuperLink's "Node Unavailable" answer and the
    node's heartbeat deadline (`online_until`) as the grid last listed it (None: never listed with one)."""
    if online_until is None:
        return ("the SuperLink reports it unavailable; whether it deactivated itself or its heartbeats stopped is "
                "not known (the grid lists no heartbeat deadline)")
    if answered_at < online_until:
        return (f"the SuperNode ended its session itself (deactivated {online_until - answered_at:.0f} s before "
                "its heartbeat deadline: stopped or restarting)")
    return ("the SuperLink ended its session: no heartbeat within 2 x its interval (the SuperNode was killed, "
            "froze or lost its connection)")


def node_deadlines(nodes: Iterable[Any]) -> dict[int, float]:
    """Each listed node's heartbeat deadline (`online_until`, unix seconds), where the grid gives one."""
    deadlines = {}
    for node in nodes:
        has = node.HasField("online_until") if hasattr(node, "HasField") else hasattr(node, "online_until")
        if has and node.online_until > 0:
            deadlines[int(node.node_id)] = float(node.online_until)
    return deadlines


@dataclass
class Held:
    """A message whose node the SuperLink reported unavailable, and that answer (kept if the node stays away)."""

    message: Message
    answer: Message
    since: float  # monotonic time of the SuperLink's answer


class NodeReturnWait:
    """What the server's send-and-receive waits for: nodes reported unavailable, for up to `return_wait` s each.

    One instance lives for a whole run (server_app/messaging.py's `PollingGrid` holds it), so that a node whose
    outage outlasted one wait is not waited for again until it answers.
    """

    def __init__(self, return_wait: float, check_interval: float = 1.0) -> None:
        if not return_wait >= 0:
            raise ValueError(f"return_wait must be seconds >= 0, not {return_wait!r}")
        self.return_wait = return_wait
        self.check_interval = check_interval
        self.given_up: set[int] = set()  # nodes that did not come back within return_wait, until they answer
        self.seen: set[int] = set()      # every node id the grid listed or a message went to
        self.resent = 0                  # messages sent again in this run (for tests and logs)
        self.events: list[dict[str, Any]] = []  # each wait: node, seconds, outcome; `take_events` empties it
        self.deadlines: dict[int, float] = {}  # each node's latest heartbeat deadline the grid listed

    def note_sent(self, messages: list[Message]) -> None:
        """Remember the nodes messages go to (a node id never seen before ends a wait: module docstring)."""
        self.seen.update(m.metadata.dst_node_id for m in messages)

    def note_node_ids(self, node_ids: list[int]) -> None:
        """Remember node ids the grid listed."""
        self.seen.update(node_ids)

    def note_deadlines(self, nodes: Iterable[Any]) -> list[int]:
        """Remember the heartbeat deadlines the grid listed (`grid.get_nodes()`); the listed node ids."""
        nodes = list(nodes)
        self.deadlines.update(node_deadlines(nodes))
        return [int(node.node_id) for node in nodes]

    def explain(self, node: int, reply: Message, answered_at: float) -> str:
        """Rewrite a "Node Unavailable" answer's reason to say who ended the node's session (`session_end`)."""
        why = session_end(answered_at, self.deadlines.get(node))
        reply.error = Error(code=reply.error.code, reason=f"Node Unavailable: {why}")
        return why

    def hold(self, message: Message | None, reply: Message, now: float) -> Held | None:
        """`reply` to `message`, kept back to wait for its node's return; None: `reply` is the answer.

        A "Node Unavailable" answer's reason is rewritten first to say who ended the session (`explain`)."""
        if message is None:
            return None
        node = message.metadata.dst_node_id
        if not is_node_unavailable(reply):
            self.given_up.discard(node)  # it answered: a later outage is waited for again
            return None
        why = self.explain(node, reply, time.time())
        if self.return_wait <= 0 or node in self.given_up or node == SUPERLINK_NODE_ID:
            log(WARNING, "node %s is unavailable: %s", node, why)
            return None
        log(WARNING, "node %s is unavailable (%s): waiting up to %.0f s for it to come back (node-return-wait) to "
            "send its message again", node, why, self.return_wait)
        return Held(message, reply, now)

    def expired(self, held: Held, now: float) -> bool:
        """Whether `held`'s node has had its `return_wait`; then it is given up (not waited for again)."""
        if now - held.since < self.return_wait:
            return False
        node = held.message.metadata.dst_node_id
        self.given_up.add(node)
        self._event(held, now, "not back within node-return-wait")
        log(WARNING, "node %s did not come back within node-return-wait = %.0f s: its reply stays 'Node "
            "Unavailable'; later rounds do not wait for it until it answers again", node, self.return_wait)
        return True

    def back(self, held: list[Held], node_ids: list[int]) -> tuple[list[Held], bool]:
        """(the held messages whose node the grid lists again, whether a node id never seen before appeared)."""
        listed = set(node_ids)
        stranger = bool(listed - self.seen)
        self.note_node_ids(node_ids)
        returned = [h for h in held if h.message.metadata.dst_node_id in listed]
        now = time.monotonic()
        for h in returned:
            log(INFO, "node %s is back after %.1f s: its message is sent again", h.message.metadata.dst_node_id,
                now - h.since)
            self._event(h, now, "back: message sent again")
        away = sorted({h.message.metadata.dst_node_id for h in held} - listed)
        if stranger and away:
            log(INFO, "a node id not seen before connected (a node back under a new id joins at the next round): "
                "no longer waiting for node(s) %s", away)
            for h in held:
                if h.message.metadata.dst_node_id in away:
                    self._event(h, now, "a new node id connected: not waited for")
        self.resent += len(returned)
        return returned, stranger

    def timed_out(self, held: list[Held]) -> list[Message]:
        """The SuperLink's answers of the messages still held when the call's timeout ends, each recorded."""
        now = time.monotonic()
        for h in held:
            self._event(h, now, "round-timeout reached")
        return [h.answer for h in held]

    def _event(self, held: Held, now: float, outcome: str) -> None:
        self.events.append({"node": held.message.metadata.dst_node_id, "waited": round(now - held.since, 3),
                            "outcome": outcome})

    def take_events(self) -> list[dict[str, Any]]:
        """The waits since the last call (a round's record lists them as `node-returns`), oldest first."""
        events, self.events = self.events, []
        return events
