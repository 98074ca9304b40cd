"""How many CPU threads torch may use in this ClientApp process.

Several ClientApps on one host each start torch with as many intra-op threads
as the host has cores, so two SuperNodes on a 2-core host run four busy
threads on two cores: deployed rounds took 3-8x longer than with one thread
each (issue 22). The thread count is therefore a node setting, applied at the
start of every ClientApp message (each may run in a new `flwr-clientapp`
process), first found of:

1. node config `torch-threads` (the operator's explicit choice);
2. the `OMP_NUM_THREADS` environment variable: the operator's, or the one Ray
   sets in simulation to the ClientApp's `--cpus-per-client` (floored, >= 1);
3. this process's usable cores divided by node config `supernodes-per-host`
   (the SuperNodes the operator says run on this host; default 1), at least 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
THREADS_KEY = "torch-threads"
NODES_PER_HOST_KEY = "supernodes-per-host"


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; the whole machine where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} = {value!r} must be a positive integer")
    return value


def torch_threads(node_config: Mapping[str, Any], environ: Mapping[str, str], cores: int) -> int:
    """The thread count by the rules of the module docstring; ValueError for a malformed setting."""
    if THREADS_KEY in node_config:
        return _positive_int(node_config[THREADS_KEY], f"node config '{THREADS_KEY}'")
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp:
        try:
            return _positive_int(int(omp), "OMP_NUM_THREADS")
        except ValueError:
            raise ValueError(f"OMP_NUM_THREADS = {omp!r} must be a positive integer") from None
    per_host = _positive_int(node_config.get(NODES_PER_HOST_KEY, 1), f"node config '{NODES_PER_HOST_KEY}'")
    return max(1, cores // per_host)

