#!/usr/bin/env python3
"""`deploy/supernode-waits.py [--] [flower-supernode] ARGS`: flower-supernode whose waits adapt to the federation.

Flower 1.42.0's SuperNode loop (flwr/supernode/start_client_internal.py) waits fixed times, none of them a setting:
- after every pull that brought no message, `time.sleep(3)` before the next pull;
- an object of a received message that the SuperLink does not hold yet is asked for again after
  `PULL_INITIAL_BACKOFF` = 1 s, then 2 s, 4 s ... (flwr/supercore/constant.py, `pull_objects`' default);
- once its ClientApp task runs, the node looks for the reply every 0.5 s, and for each of the reply's objects
  every 0.5 s, before it pushes the reply.
In lockstep rounds these are most of a deployed round's time beside the training (docs/performance.md). This
launcher runs Flower's own `flower-supernode` entry point with the arguments after `--` (and after the word
`flower-supernode`, when given, as a Compose service's command passes it) with those waits replaced:
- after an empty pull the next comes after `FIRST_WAIT` (0.05 s), each further empty pull waits `GROWTH` times
  longer, up to Flower's 3 s (`LAST_WAIT`); a message starts the series again. An idle node settles at Flower's
  rate (one pull per 3 s), and a node in lockstep rounds sees its next message within a fraction of the time it
  has waited for it (benchmarks/superlink_request_rate.py measures what this costs the SuperLink);
- an object's first retry comes after `OBJECT_FIRST_RETRY` (0.05 s), doubling from there to Flower's cap (10 s);
- the reply is pushed as soon as it and its objects are in the node's store: the node's state and object store
  say when they change, instead of being looked at every 0.5 s.
Everything else (the connection, its retries, heartbeats, the pushes themselves, errors) is Flower's, unchanged.

Pinned to Flower `FLOWER_VERSION` (1.42.0), whose loop this was written against: on any other version, or with
FEDSYNTH_ADAPTIVE_WAITS=0 (or false/no/off), it says so in one log line and runs Flower's SuperNode unchanged.
deploy/supernode.sh, the compose SuperNode services and the loopback federation (fedsynth/loopback.py) run
SuperNodes through it. It imports Flower only, so it runs from this folder without the project installed.
tests/test_supernode_waits.py runs it against a stand-in for Flower's loop.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

FLOWER_VERSION = "1.42.0"
SWITCH = "FEDSYNTH_ADAPTIVE_WAITS"
FIRST_WAIT = 0.05  # s after the first empty pull
GROWTH = 1.5  # each further empty pull waits this much longer ...
LAST_WAIT = 3.0  # ... up to Flower's own wait after an empty pull
OBJECT_FIRST_RETRY = 0.05  # s before an object not yet at the SuperLink is asked for again (Flower: 1 s)
REPLY_LOOK = 0.5  # Flower's interval between looks for the reply: the longest a change can go unnoticed here


def log(line: str) -> None:
    print(f"supernode-waits.py: {line}", file=sys.stderr, flush=True)


class Backoff:
    """The waits after consecutive empty pulls: `first`, then `growth` times longer each, at most `last`."""

    def __init__(self, first: float = FIRST_WAIT, growth: float = GROWTH, last: float = LAST_WAIT) -> None:
        if not (0 < first <= last and growth >= 1):
            raise ValueError(f"backoff needs 0 < first <= last and growth >= 1, got {first}, {growth}, {last}")
        self.first, self.growth, self.last = first, growth, last
        self.current = first

    def next_wait(self) -> float:
        """The wait after this empty pull; the next one is longer."""
        wait = self.current
        self.current = min(self.current * self.growth, self.last)
        return wait

    def reset(self) -> None:
        """A message came: the next empty pull waits `first` again."""
        self.current = self.first


def pull_until_message(pull: Callable[..., int | None], backoff: Backoff,
                       sleep: Callable[[float], None] = time.sleep) -> Callable[..., int]:
    """Flower's `_pull_and_store_message` (None: no message) as a function that returns only with a message's run
    id, waiting `backoff`'s times between empty pulls; Flower's loop then never reaches its fixed 3 s sleep."""

    def pull_with_backoff(*args: Any, **kwargs: Any) -> int:
        while (run_id := pull(*args, **kwargs)) is None:
            sleep(backoff.next_wait())
        backoff.reset()
        return run_id

    return pull_with_backoff


class Changes:
    """A count of changes to the node's state and object store that a waiting thread can wait on."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._count = 0

    def seen(self) -> int:
        with self._condition:
            return self._count

    def changed(self) -> None:
        with self._condition:
            self._count += 1
            self._condition.notify_all()

    def wait(self, since: int, timeout: float) -> None:
        """Until a change after `since` (a `seen()` value), at most `timeout` s."""
        with self._condition:
            self._condition.wait_for(lambda: self._count != since, timeout)


def notifying(method: Callable[..., Any], changes: Changes) -> Callable[..., Any]:
    """`method`, telling `changes` after each call."""

    def changed_after(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        finally:
            changes.changed()

    changed_after.__wrapped__ = method  # type: ignore[attr-defined]
    return changed_after


def push_when_ready(push: Callable[..., None], ready: Callable[[Any, Any], bool | None], changes: Changes,
                    look: float = REPLY_LOOK, clock: Callable[[], float] = time.monotonic) -> Callable[..., None]:
    """Flower's `_push_messages(state, object_store, send, push_object)`, called once `ready(state, object_store)`
    holds (the reply and all its objects are in the node's store), woken by `changes`. `ready` is None while a
    reply exists whose objects are not all there: after `look` s of that, Flower's own push (and its own waits)
    takes over, so an odd reply is never held longer than Flower would hold it."""

    def push_reply(state: Any, object_store: Any, *args: Any, **kwargs: Any) -> None:
        incomplete_since = None
        while True:
            since = changes.seen()
            status = ready(state, object_store)
            if status:
                break
            if status is None:
                incomplete_since = clock() if incomplete_since is None else incomplete_since
                if clock() - incomplete_since >= look:
                    break
            changes.wait(since, look)
        push(state, object_store, *args, **kwargs)

    return push_reply


def reply_ready(state: Any, object_store: Any) -> bool | None:
    """Whether Flower 1.42's node state holds a reply not yet pushed with all its objects' contents (True), one
    whose contents are still coming (None), or none (False). Reads `InMemoryNodeState.msg_store` as Flower's own
    `get_messages_legacy` does, without marking anything retrieved."""
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

    with state.lock_msg_store:
        replies = [entry.message.metadata.message_id for entry in state.msg_store.values()
                   if not entry.is_retrieved and entry.message.metadata.reply_to_message_id != ""]
    if not replies:
        return False
    for message_id in replies:
        try:
            tree = object_store.get_object_tree(message_id)
        except Exception:  # noqa: BLE001 - not preregistered yet: still coming
            return None
        if any(object_store.get(node.object_id) in (b"", None) for node in iterate_object_tree(tree)):
            return None
    return True


def install(loop: Any = None, node_state: type | None = None, object_store: type | None = None) -> None:
    """Replace the waits of Flower 1.42.0's SuperNode loop (`loop`: flwr.supernode.start_client_internal, whose
    module globals `start_client_internal` looks up at call time), and make its node state and object store
    classes (`InMemoryNodeState`, `InMemoryObjectStore`) tell when they change."""
    if loop is None:
        import flwr.supernode.start_client_internal as loop
    if node_state is None:
        from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState as node_state
    if object_store is None:
        from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore as object_store

    changes = Changes()
    node_state.store_message = notifying(node_state.store_message, changes)
    object_store.put = notifying(object_store.put, changes)
    loop._pull_and_store_message = pull_until_message(loop._pull_and_store_message, Backoff())
    loop._push_messages = push_when_ready(loop._push_messages, reply_ready, changes)
    loop.pull_objects = partial(loop.pull_objects, initial_backoff=OBJECT_FIRST_RETRY)


def switched_off(environ: dict[str, str] | os._Environ[str]) -> bool:
    return environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def flower_version() -> str:
    from importlib.metadata import version

    return version("flwr")


def choose(environ: dict[str, str] | os._Environ[str], version: str) -> bool:
    """Whether to install the waits; says why not in one log line."""
    if switched_off(environ):
        log(f"{SWITCH}={environ[SWITCH]}: Flower's own SuperNode waits (3 s after an empty pull)")
        return False
    if version != FLOWER_VERSION:
        log(f"Flower {version} is not {FLOWER_VERSION}, which these waits were written for: running Flower's "
            "SuperNode unchanged")
        return False
    log(f"adaptive waits on: {FIRST_WAIT:g} s after an empty pull, x{GROWTH:g} each, up to {LAST_WAIT:g} s; an "
        f"object's first retry after {OBJECT_FIRST_RETRY:g} s; the reply pushed when it is stored "
        f"({SWITCH}=0 turns them off)")
    return True


def flower_arguments(argv: list[str]) -> list[str]:
    """The arguments for flower-supernode: after a leading `--` and the command's own name, when given."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if argv[:1] and os.path.basename(argv[0]) == "flower-supernode":
        argv = argv[1:]
    return argv


def flower_script(argv: list[str]) -> str | None:
    """The `flower-supernode` console script the command names (a path, or a name looked up on PATH), when it is a
    Python script: it runs in this process, so the waits apply to it and a launcher around this one
    (deploy/supernode-records.py, under deploy/retry-activation.sh) still sees Flower's records."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or os.path.basename(argv[0]) != "flower-supernode":
        return None
    script = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
    if script is None:
        return None
    try:
        with open(script, "rb") as handle:
            first = handle.readline(200)
    except OSError:
        return None
    return script if first.startswith(b"#!") and b"python" in first else None


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    arguments = flower_arguments(given)
    script = flower_script(given)
    if choose(os.environ, flower_version()):
        install()
    if script is not None:
        sys.argv = [script, *arguments]
        runpy.run_path(script, run_name="__main__")
        return
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *arguments]
    sys.exit(flower_supernode())


if __name__ == "__main__":
    main()
