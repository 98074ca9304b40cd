"""Flower's Ray backend for a run on a Ray cluster: it outlives a lost node and says where each ClientApp ran.

Flower 1.42's `RayBackend` puts an actor whose node died back into its pool, so
every later message that draws it fails at once with `ActorDiedError`: after a
worker node is lost most replies of every round are errors, though the nodes
left could do the work. `ClusterRayBackend` drops a dead actor instead and runs
the message again on a live one (the ClientApp's Context is kept by the engine,
not by the actor, so the retry starts from the same state). When no actor is
left, each message fails, the rounds fall below `min-nodes` and the run stops
after `max-failed-rounds` with its checkpoint, to be resumed with `resume=true`.

It also records which Ray node ran each partition: the first time a partition
runs on a node, one JSON line `{"partition-id", "ray-node-id", "message-type"}`
goes to the file named by the backend config's `PLACEMENT_KEY` (the run's
`ray-placement.jsonl`). The ClientApp is untouched; the node id comes from the
actor (`ray.get_runtime_context().get_node_id()`).

Flower 1.42 has no registry of backends (`start_vce` imports `RayBackend` from
its module when the engine starts), so `installed()` puts this class there for
the length of one simulation.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import ray
from flwr.app import Context, Message
from flwr.clientapp.client_app import ClientApp
from flwr.common.constant import PARTITION_ID_KEY
from flwr.server.superlink.fleet.vce.backend import raybackend
from flwr.simulation.ray_transport.ray_actor import VirtualClientEngineActor, pool_size_from_resources
from flwr.supercore import log

PLACEMENT_KEY = "fedsynth_placement_file"  # Flower turns "-" into "_" in backend config keys


class NoActorLeftError(RuntimeError):
    """Every ClientApp actor of the run was lost with its node."""


@ray.remote
class PlacedClientAppActor(VirtualClientEngineActor):
    """Flower's ClientApp actor that can also say which Ray node it runs on."""

    def __init__(self, on_actor_init_fn: Callable[[], None] | None = None) -> None:
        super().__init__()
        if on_actor_init_fn:
            on_actor_init_fn()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


class ClusterRayBackend(raybackend.RayBackend):
    """`RayBackend` with its own actor pool: dead actors dropped and their messages rerun, placements recorded."""

    def __init__(self, backend_config: dict[str, Any]) -> None:
        super().__init__(backend_config)
        placement = backend_config.get(PLACEMENT_KEY)
        self.placement_file = Path(placement) if placement else None
        self._actors: list[Any] = []
        self._idle: list[Any] = []
        self._available = threading.Condition()
        self._node_of: dict[Any, str] = {}
        self._placed: set[tuple[int, str]] = set()
        self._workers = 0

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        capacity = pool_size_from_resources(self.client_resources)
        self._actors = [PlacedClientAppActor.options(**self.client_resources).remote(**self.actor_kwargs)
                        for _ in range(capacity)]
        self._idle = list(self._actors)
        self._workers = capacity
        self.app_fn = app_fn
        log(INFO, "ClientApp actors on the Ray cluster: %i", capacity)

    @property
    def num_workers(self) -> int:
        return self._workers  # the engine's worker threads: fixed at build, more than the actors once one is lost

    def is_worker_idle(self) -> bool:
        with self._available:
            return bool(self._idle)

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        if self.app_fn is None:
            raise ValueError("Call the backend's `build()` method before processing messages.")
        partition_id = int(context.node_config[PARTITION_ID_KEY])
        while True:
            actor = self._take()
            try:
                _, reply, updated = ray.get(actor.run.remote(self.app_fn, message, str(partition_id), context))
            except ray.exceptions.RayActorError as err:
                self._drop(actor, err)
                continue  # the same message, from the same Context, on an actor that is alive
            except BaseException:
                self._give_back(actor)
                raise
            self._record(partition_id, actor, message.metadata.message_type)
            self._give_back(actor)
            return reply, updated

    def terminate(self) -> None:
        for actor in self._actors:
            with contextlib.suppress(Exception):
                actor.terminate.remote()
        ray.shutdown()

    def _take(self) -> Any:
        with self._available:
            while not self._idle:
                if not self._actors:
                    raise NoActorLeftError("every ClientApp actor was lost with its Ray node; no node left to run on")
                self._available.wait()
            return self._idle.pop()

    def _give_back(self, actor: Any) -> None:
        with self._available:
            self._idle.append(actor)
            self._available.notify()

    def _drop(self, actor: Any, err: BaseException) -> None:
        with self._available:
            if actor in self._actors:
                self._actors.remove(actor)
            left = len(self._actors)
            self._available.notify_all()  # waiters re-check: none may be left
        log(WARNING, "a ClientApp actor was lost (%s: its Ray node died?); %i left, its message runs again on one",
            type(err).__name__, left)

    def _record(self, partition_id: int, actor: Any, message_type: str) -> None:
        if self.placement_file is None:
            return
        if actor not in self._node_of:
            self._node_of[actor] = ray.get(actor.node_id.remote())
        node = self._node_of[actor]
        with self._available:
            if (partition_id, node) in self._placed:
                return
            self._placed.add((partition_id, node))
            with open(self.placement_file, "a") as handle:
                handle.write(json.dumps({"partition-id": partition_id, "ray-node-id": node,
                                         "message-type": message_type}) + "\n")


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Flower's simulation engine builds a `ClusterRayBackend` instead of its `RayBackend` inside this block."""
    original = raybackend.RayBackend
    raybackend.RayBackend = ClusterRayBackend  # type: ignore[misc]
    try:
        yield
    finally:
        raybackend.RayBackend = original  # type: ignore[misc]
