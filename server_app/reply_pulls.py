"""The deployed ServerApp's pull of a reply's objects: a missing object asked for again after 0.05 s, not Flower's 1 s.

The SuperLink hands the ServerApp a reply as soon as the node has pushed the message itself, before the node has
pushed its objects (the model's arrays: `PushMessages`, then `PushObject` per object). The ServerApp's
`HttpGrid.pull_messages` (flwr/superlink/grid/http_grid.py, Flower 1.42.0) then pulls the objects with
`pull_objects`' defaults: an object that is not there yet is asked for again after `PULL_INITIAL_BACKOFF` = 1 s
(+-20 %), then 2 s, 4 s ... up to 10 s (flwr/supercore/constant.py). fedsynth's ServerApp checks for replies every
`reply-poll-interval` (0.05 s, server_app/messaging.py), so in lockstep rounds its pull often lands while the last
node is still uploading, and the round waits out that 1 s: `benchmarks/deployment_timeline.py --adaptive` measured
"the server has pulled every reply" at 0.88 s median (0.33-1.25 s) after the last node's push had returned.
`adapt_reply_pulls` makes the first retry come after `FIRST_RETRY` (0.05 s), doubling from there to Flower's cap,
as deploy/supernode-waits.py does for the SuperNode's pulls; the retries' count and time limits stay Flower's.

Pinned to Flower `FLOWER_VERSION`, whose grid this was written against: on any other version, or with
FEDSYNTH_ADAPTIVE_WAITS=0 (or false/no/off: the SuperNodes' switch, read in the ServerApp's process), it says so
in one log line and leaves Flower's grid unchanged. Only a deployed ServerApp's grid (`HttpGrid`) is concerned:
simulation's in-memory grid reads its state directly.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from functools import partial
from types import ModuleType
from typing import Any

FLOWER_VERSION = "1.42.0"
SWITCH = "FEDSYNTH_ADAPTIVE_WAITS"
FIRST_RETRY = 0.05  # s before a reply's object not yet at the SuperLink is asked for again (Flower: 1 s)
GRID_MODULE = "flwr.superlink.grid.http_grid"

log = logging.getLogger("flwr")


def switched_off(environ: Mapping[str, str]) -> bool:
    return environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def flower_version() -> str:
    from importlib.metadata import version

    return version("flwr")


def is_deployed_grid(grid: Any) -> bool:
    """Whether `grid` is Flower's HttpGrid (without importing it where it is not loaded)."""
    module = sys.modules.get(GRID_MODULE)
    return module is not None and isinstance(grid, module.HttpGrid)


def adapt_reply_pulls(grid: Any, environ: Mapping[str, str] = os.environ, version: str | None = None,
                      module: ModuleType | None = None) -> bool:
    """Make `grid`'s module pull a reply's missing objects again after `FIRST_RETRY` s; whether it does now.

    `module` is the grid's module (Flower's `http_grid`, whose `pull_messages` looks `pull_objects` up at call
    time); a second call changes nothing."""
    if module is None:
        if not is_deployed_grid(grid):
            return False
        module = sys.modules[GRID_MODULE]
    if getattr(module.pull_objects, "fedsynth_first_retry", None) is not None:
        return True
    if switched_off(environ):
        log.info("%s=%s: Flower's own retry of a reply's objects (1 s, then 2 s ...)", SWITCH, environ[SWITCH])
        return False
    version = flower_version() if version is None else version
    if version != FLOWER_VERSION:
        log.info("Flower %s is not %s, which the ServerApp's reply pulls were written for: Flower's own retries",
                 version, FLOWER_VERSION)
        return False
    adapted = partial(module.pull_objects, initial_backoff=FIRST_RETRY)
    adapted.fedsynth_first_retry = FIRST_RETRY  # type: ignore[attr-defined]
    module.pull_objects = adapted
    log.info("reply objects not yet at the SuperLink are asked for again after %g s (Flower: 1 s; %s=0 turns "
             "this off)", FIRST_RETRY, SWITCH)
    return True
