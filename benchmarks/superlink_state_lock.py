"""Does the SuperLink's SQLite state answer `database is locked` to resnet18-sized replies, and at which busy timeout?

    python benchmarks/superlink_state_lock.py [--busy-timeout-ms 5000] [--nodes 3] [--rounds 2] [--burn 0]

With `--database FILE`, Flower 1.42's SuperLink keeps the objects of every message (the replies'
arrays, in chunks of at most 5 MB) in that SQLite file (`SqlObjectStore`), one write transaction per
`push-object` request, each SQLite connection with `busy_timeout` 5000 ms
(flwr/supercore/constant.py `SQLITE_PRAGMAS`): a push that waits longer for the write lock fails with
`database is locked`, which the SuperLink answers with HTTP 500 and the SuperNode does not retry.
This drives Flower's own `SqlObjectStore` as the SuperLink does: `--nodes` threads each preregister
and push a reply of resnet18's shapes (11.7M float32 parameters, ~45 MB) with Flower's 2 concurrent
pushes per node, while a reader pulls them back as the ServerApp does, `--rounds` times, on a host
as loaded as it is (plus `--burn` busy processes). It counts the pushes and pulls that failed with
SQLite's busy error (`database is locked`, told apart from other errors as deploy/superlink-state.py tells it:
the sqlite3 module's result code, not the text) and the slowest one, for the busy timeout given.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def superlink_state_launcher():  # type: ignore[no-untyped-def]
    """deploy/superlink-state.py as a module (its name has a dash): its `is_busy_state` classifies the errors."""
    path = Path(__file__).resolve().parent.parent / "deploy" / "superlink-state.py"
    spec = importlib.util.spec_from_file_location("superlink_state", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resnet18_shapes() -> list[tuple[int, ...]]:
    import torchvision

    return [tuple(t.shape) for t in torchvision.models.resnet18(num_classes=10).state_dict().values()]


def _burn(stop: float) -> None:
    while time.time() < stop:
        pass


def run(busy_timeout_ms: int, nodes: int, rounds: int, burn: int) -> dict[str, float]:
    import flwr.supercore.sql_mixin as sql_mixin
    from flwr.app import ArrayRecord
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore

    sql_mixin.SQLITE_PRAGMAS = tuple((k, str(busy_timeout_ms) if k == "busy_timeout" else v)
                                     for k, v in sql_mixin.SQLITE_PRAGMAS)
    shapes = resnet18_shapes()
    rng = np.random.default_rng(0)
    is_busy_state = superlink_state_launcher().is_busy_state
    stats = {"pushes": 0, "pulls": 0, "locked": 0, "other-errors": 0, "slowest-push-s": 0.0, "slowest-pull-s": 0.0}
    lock = threading.Lock()

    def note(kind: str, seconds: float, error: Exception | None) -> None:
        with lock:
            stats[f"{kind}es" if kind == "push" else f"{kind}s"] += 1
            stats[f"slowest-{kind}-s"] = max(stats[f"slowest-{kind}-s"], seconds)
            if error is not None:
                stats["locked" if is_busy_state(error) else "other-errors"] += 1

    def timed(kind: str, call) -> None:
        start = time.monotonic()
        try:
            call()
            note(kind, time.monotonic() - start, None)
        except Exception as err:  # noqa: BLE001 - counted
            note(kind, time.monotonic() - start, err)

    burners = [multiprocessing.Process(target=_burn, args=(time.time() + 3600,)) for _ in range(burn)]
    for proc in burners:
        proc.start()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlObjectStore(str(Path(tmp) / "state.db"))
        store.initialize()
        started = time.monotonic()
        for round_ in range(rounds):
            replies = []
            for node in range(nodes):
                record = ArrayRecord([rng.standard_normal(s).astype(np.float32) for s in shapes])
                replies.append((get_object_tree(record), {k: v.deflate() for k, v in get_all_nested_objects(record).items()}))

            def push(tree_and_objects) -> None:
                tree, objects = tree_and_objects
                timed("push", lambda: store.preregister(1, tree))  # the reply's push-messages request
                with ThreadPoolExecutor(2) as pool:  # Flower's FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PUSHES
                    for object_id, content in objects.items():
                        pool.submit(timed, "push", lambda i=object_id, c=content: store.put(i, c))

            def pull() -> None:  # the ServerApp reads the replies' objects while others are still pushed
                for _ in range(3):
                    for _, objects in replies:
                        for object_id in list(objects)[:20]:
                            timed("pull", lambda i=object_id: store.get(i))

            threads = [threading.Thread(target=push, args=(r,)) for r in replies] + [threading.Thread(target=pull)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for _, objects in replies:
                for object_id in objects:
                    timed("push", lambda i=object_id: store.delete(i))
        stats["seconds"] = time.monotonic() - started
    for proc in burners:
        proc.terminate()
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-timeout-ms", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burn", type=int, default=0)
    args = parser.parse_args()
    import os

    load = os.getloadavg()[0]
    stats = run(args.busy_timeout_ms, args.nodes, args.rounds, args.burn)
    print(f"busy_timeout {args.busy_timeout_ms} ms, {args.nodes} nodes, {args.rounds} rounds, load {load:.1f}: "
          + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()))


if __name__ == "__main__":
    main()
