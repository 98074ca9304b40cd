"""Joining an existing Ray cluster (`--ray-address`): the check at start that it can host the run's ClientApps.

Flower's Ray backend passes its `init_args` to `ray.init`, so `address` makes a
simulation a driver of an existing cluster whose nodes host the ClientApp
actors. Flower sizes its actor pool per node (`pool_size_from_resources`:
CPUs / num_cpus, capped by GPUs / num_gpus where a GPU is asked for) and stops
with "ActorPool is empty" when no node fits one actor; an unreachable address
makes `ray.init` retry for a long time. So before the engine starts, a short
probe in a child process (a hard timeout, nothing of Ray left in this process)
reads the cluster's nodes, and `check_cluster` says what is missing, in words.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROBE_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0


class ClusterError(RuntimeError):
    """The Ray cluster cannot be reached or cannot host one ClientApp of the run."""


@dataclass(frozen=True)
class RayNode:
    """One live node of a Ray cluster and the CPUs and GPUs it offers."""

    node_id: str
    cpus: float
    gpus: float


def actors_per_node(node: RayNode, cpus_per_client: float, gpus_per_client: float) -> int:
    """How many ClientApp actors fit on a node, by Flower's rule (ray_actor.pool_size_from_resources)."""
    actors = int(node.cpus / cpus_per_client) if cpus_per_client > 0 else 0
    if gpus_per_client > 0:
        actors = min(actors, int(node.gpus / gpus_per_client)) if node.gpus else 0
    return actors


def check_cluster(address: str, cpus_per_client: float, gpus_per_client: float,
                  probe: Callable[[str], Sequence[RayNode]] | None = None) -> dict[str, int]:
    """The actors each live node can host; ClusterError naming what is missing when no node fits one."""
    nodes = list((probe or probe_cluster)(address))
    if not nodes:
        raise ClusterError(f"the Ray cluster at {address} has no live node")
    fits = {node.node_id: actors_per_node(node, cpus_per_client, gpus_per_client) for node in nodes}
    if sum(fits.values()) > 0:
        return fits
    most_cpus = max(node.cpus for node in nodes)
    most_gpus = max(node.gpus for node in nodes)
    missing = []
    if most_cpus < cpus_per_client:
        missing.append(f"{cpus_per_client:g} CPUs (--cpus-per-client); its largest node has {most_cpus:g}")
    if gpus_per_client > 0 and most_gpus < gpus_per_client:
        missing.append(f"{gpus_per_client:g} GPUs (--gpus-per-client); "
                       + (f"its largest node has {most_gpus:g}" if most_gpus else "no node has a GPU"))
    if not missing:  # each resource fits somewhere, but never both on the same node
        missing.append(f"{cpus_per_client:g} CPUs and {gpus_per_client:g} GPUs on one node")
    listing = ", ".join(f"{node.node_id[:8]} ({node.cpus:g} CPUs, {node.gpus:g} GPUs)" for node in nodes)
    raise ClusterError(f"the Ray cluster at {address} cannot host one ClientApp: each asks for "
                       f"{' and '.join(missing)}. Nodes: {listing}")


def probe_cluster(address: str, timeout: float = PROBE_TIMEOUT_S) -> list[RayNode]:
    """The cluster's live nodes, read by a child process joining it (`python -m fedsynth.ray_cluster ADDRESS`)."""
    _check_reachable(address)
    try:
        done = subprocess.run([sys.executable, "-m", "fedsynth.ray_cluster", address], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"no Ray cluster answered at {address} within {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"could not join the Ray cluster at {address}: {last}")
    return [RayNode(**node) for node in json.loads(done.stdout.strip().splitlines()[-1])]


def _check_reachable(address: str) -> None:
    """A host:port address that refuses connections fails in seconds, not after Ray's minute of retries."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto" or a "ray://" client address: left to ray.init (and the probe's timeout)
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ClusterError(f"no Ray cluster at {address}: {err.strerror or err} (start one with `ray start --head`)") from None


def _probe_main(address: str) -> None:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    nodes = [
        {"node_id": node["NodeID"], "cpus": float(node["Resources"].get("CPU", 0)),
         "gpus": float(node["Resources"].get("GPU", 0))}
        for node in ray.nodes() if node.get("Alive") and node.get("Resources")
    ]
    ray.shutdown()
    print(json.dumps(nodes))


if __name__ == "__main__":
    _probe_main(sys.argv[1])
