"""A process's copies of the partition files it has read: a process that handles many messages reads each file once.

In deployment a message may run in a new process, which then keeps nothing. In simulation a Ray actor, and the
in-process engine, handle every round's messages of many nodes in one process, and reading a node's `.npz` again
for every message (the zip's CRC, numpy's header parse) was ~4 ms of a trivial message's ~27 ms
(benchmarks/app_work.py). A copy is keyed by the file's path and its identity on disk (device, inode, size,
modification time), so a file that was rebuilt or replaced is read again. Its arrays are read-only: a caller that
would change them in place fails, instead of changing what the next message of that node reads. The copies are
dropped least recently used first once they hold more than `MAX_BYTES`.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

MAX_BYTES = 256 * 2**20  # a whole CIFAR-10's uint8 images fit; a partition larger than this is not kept

_Key = tuple[str, int, int, int, int]
_copies: OrderedDict[_Key, dict[str, np.ndarray]] = OrderedDict()


def file_key(path: Path) -> _Key:
    """The path and what tells a changed file from the one read before."""
    stat = os.stat(path)
    return str(Path(path).resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def held_bytes() -> int:
    return sum(array.nbytes for arrays in _copies.values() for array in arrays.values())


def read_arrays(path: Path, read: Callable[[Path], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`read(path)`'s arrays, read-only, from this process's copy when the file is the one read before."""
    key = file_key(path)
    if key in _copies:
        _copies.move_to_end(key)
        return dict(_copies[key])
    arrays = read(path)
    for array in arrays.values():
        array.setflags(write=False)
    if sum(array.nbytes for array in arrays.values()) <= MAX_BYTES:
        _copies[key] = arrays
        while held_bytes() > MAX_BYTES:
            _copies.popitem(last=False)
    return dict(arrays)


def clear() -> None:
    """Forget every copy (the next read of each file goes to disk): as a new process would start."""
    _copies.clear()
