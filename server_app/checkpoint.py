"""Server checkpoints: the whole server state of a run in one safetensors file.

A checkpoint holds the global model, the strategy's state (its `state_arrays`
groups and `state_meta`), the round number, torch's global RNG state and the
metrics written so far. Arrays go in the safetensors body and everything else
as JSON in its header metadata, so a checkpoint loads without unpickling
anything, and a single file can be written atomically (temp file, then rename):
a run killed mid-write leaves the previous checkpoint intact.

Every field is verified before a resumed run writes anything (`load_checkpoint`):
a SHA-256 checksum over every array and every metadata field (a flipped bit is
refused, not resumed), the round within 1..num-server-rounds, torch's RNG state
of the shape torch uses, finite arrays and metrics, metric records numbered
up to the checkpoint's round, and model arrays that fit the model.

Where the randomness lives: node sampling and clients' batch orders are drawn
from generators seeded by (seed, round, partition), so resuming at round r
replays exactly what an uninterrupted run does from r on; torch's global RNG
state is saved for strategies that draw from it (e.g. sampling on the server).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from logging import WARNING
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from common.run.config import RunConfig
from common.records import Weights

CHECKPOINT_FILE = "checkpoint.safetensors"
FORMAT_VERSION = 2  # 2: with a checksum; 1 (without) is read only with accept-unverified-checkpoint
_CHECKSUM = "checksum"
_READ_ON_RESUME = ("central-accuracy", "central-loss")  # numbers the summary takes max/last of
_MODEL = "model/"
_STATE = "state/"
_RNG = "rng/torch"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run."""


@dataclass
class Checkpoint:
    """What a resumed run starts from."""

    server_round: int
    weights: Weights
    state_arrays: dict[str, Weights]
    state_meta: dict[str, Any]
    metrics: list[dict[str, Any]]
    torch_rng: np.ndarray | None = None
    nodes: list[list[int]] | None = None  # [partition id, training examples] of every node, from the handshake


# Run-config keys a resume may change: where things are, how long to wait, how often to save, how many
# rounds in all (to extend a run). Every other key changes what the run computes, so it must match.
RESUME_MAY_CHANGE = frozenset({
    "resume", "overwrite", "accept-unverified-checkpoint", "run-name", "results-dir", "data-dir", "cache-dir",
    "device", "round-timeout", "reply-poll-interval", "node-wait-timeout", "node-return-wait", "warmup-timeout",
    "checkpoint-every", "save-model", "num-server-rounds", "max-failed-rounds", "max-missing-nodes", "eval-every",
    "perturbation-diagnostic",
})


def _identity(cfg: RunConfig) -> dict[str, Any]:
    """The config keys a checkpoint must agree with to be resumable."""
    return {k: v for k, v in cfg.as_dict().items() if k not in RESUME_MAY_CHANGE}


def config_differences(saved: dict[str, Any], cfg: RunConfig) -> dict[str, tuple[Any, Any]]:
    """{key: (checkpoint's value, this run's value)} for the keys that must match (those the checkpoint has)."""
    now = _identity(cfg)
    return {k: (saved[k], now[k]) for k in sorted(saved) if k in now and saved[k] != now[k]}


def node_table(nodes: Any) -> list[list[int]]:
    """[partition id, training examples] of each node (NodeInfo), as a checkpoint records them."""
    return sorted([int(n.partition_id), int(n.num_train_examples)] for n in nodes)


def _saved_node_table(value: Any) -> list[list[int]] | None:
    """A checkpoint's `nodes` entry: None (written before it existed) or [partition id, examples] pairs; ValueError
    naming 'nodes' otherwise."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            for pair in value):
        raise ValueError(f"its 'nodes' entry is not a list of [partition id, training examples] pairs: {value!r:.80}")
    return value


def node_table_problem(saved: list[list[int]], nodes: list[list[int]], late_joins: bool) -> str | None:
    """Why a run with `nodes` cannot continue a checkpoint written with `saved` ([partition id, examples] each).

    The same partitions with the same counts always can. Where the algorithm takes in sites that join mid-run
    (`late_joins`), the node tables may also differ by whole partitions, as they did during the run: a
    partition of the checkpoint that is not connected at the resumed start (a site that had joined late, or
    is away) joins again when it connects, and a partition the checkpoint lacks (a site that joined after the
    checkpoint was written) is taken in as a site that joined late. Either keeps its partition id, so its
    place in the seeded sampling. A partition whose training-example count changed is never the same site.
    """
    before, now = dict(map(tuple, saved)), dict(map(tuple, nodes))
    changed = sorted(p for p in before.keys() & now.keys() if before[p] != now[p])
    if not changed and (before.keys() == now.keys() or late_joins):
        return None
    return (f"was written with nodes (partition, examples) {sorted(map(list, saved))} but this run has "
            f"{sorted(map(list, nodes))}" + (f" (partitions {changed} changed their training examples)" if changed
                                              else " and this algorithm's node set is fixed at the start")
            + "; resume with the same SuperNodes and partitioning")


def _check_metrics(metrics: Any) -> None:
    if not isinstance(metrics, list) or not all(
        isinstance(r, dict) and isinstance(r.get("round"), int) and not isinstance(r.get("round"), bool)
        for r in metrics
    ):
        raise ValueError("its 'metrics' field is not a list of round records")


def contents_checksum(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> str:
    """SHA-256 over every array (name, dtype, shape, bytes) and every metadata field but the checksum itself."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        value = np.require(tensors[key], requirements="C")  # 0-d stays 0-d (ascontiguousarray makes it (1,))
        digest.update(json.dumps([key, value.dtype.str, list(value.shape)]).encode())
        digest.update(value.tobytes())
    digest.update(json.dumps({k: v for k, v in meta.items() if k != _CHECKSUM}, sort_keys=True).encode())
    return digest.hexdigest()


def _non_finite(value: Any) -> bool:
    """A NaN or an infinity anywhere in a JSON value."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


def _check_fields(path: Path, cfg: RunConfig, server_round: int, metrics: list[dict[str, Any]],
                  rng: np.ndarray | None) -> list[dict[str, Any]]:
    """The round, RNG state and metrics checked; returns the metric records up to the checkpoint's round."""
    if not 1 <= server_round <= cfg.num_server_rounds:
        raise CheckpointError(
            f"checkpoint {path} is of round {server_round}, outside 1..num-server-rounds = {cfg.num_server_rounds}"
            + ("; to extend the run set num-server-rounds to at least that round" if server_round > 1 else
               "; it is corrupt: delete it to start over")
        )
    import torch  # here, not with the module: the strategies import CheckpointError without loading torch

    expected = torch.get_rng_state().numpy()
    if rng is None or rng.dtype != expected.dtype or rng.shape != expected.shape:
        shown = "missing" if rng is None else f"{rng.dtype} of shape {rng.shape}"
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its torch RNG state is {shown}, expected {expected.dtype} of shape "
            f"{expected.shape}; delete it to start over"
        )
    # NaN and inf are written as null (common/run/results.py); the rounds' central numbers are read on resume
    bad = [r["round"] for r in metrics if _non_finite(r) or any(
        key in r and (isinstance(r[key], bool) or not isinstance(r[key], (int, float))) for key in _READ_ON_RESUME)]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} holds non-finite metrics (NaN or inf) in round(s) {bad[:5]}; it cannot be resumed: "
            "start the run over (overwrite = true) or restore an earlier checkpoint"
        )
    later = [r["round"] for r in metrics if r["round"] > server_round]
    if later:
        log(WARNING, "checkpoint %s of round %d holds metrics of later round(s) %s; they are dropped and re-run",
            path, server_round, later[:5])
    return [r for r in metrics if r["round"] <= server_round]


def save_checkpoint(folder: Path, cfg: RunConfig, ckpt: Checkpoint) -> Path:
    """Write the checkpoint atomically into `folder`; returns its path."""
    import torch  # here, not with the module: the strategies import CheckpointError without loading torch
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {f"{_MODEL}{k}": v for k, v in ckpt.weights.items()}
    groups: dict[str, list[str]] = {}
    for group, arrays in ckpt.state_arrays.items():
        if "/" in group:
            raise ValueError(f"state group name {group!r} must not contain '/'")
        groups[group] = list(arrays)
        for name, value in arrays.items():
            tensors[f"{_STATE}{group}/{name}"] = value
    tensors[_RNG] = torch.get_rng_state().numpy()
    meta = {
        "format": str(FORMAT_VERSION),
        "round": str(ckpt.server_round),
        "identity": json.dumps(_identity(cfg)),
        "groups": json.dumps(groups),
        "strategy": json.dumps(ckpt.state_meta),
        "metrics": json.dumps(ckpt.metrics),
        "nodes": json.dumps(ckpt.nodes),
    }
    tensors = {k: np.require(v, requirements="C") for k, v in tensors.items()}
    meta[_CHECKSUM] = contents_checksum(tensors, meta)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / CHECKPOINT_FILE
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".checkpoint-", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _accept_unverified(path: Path, cfg: RunConfig) -> None:
    """A checkpoint without a checksum: refused, unless the run config accepts it by name (then a warning).

    Format 1 (before checksums) and a format-2 file whose checksum was removed look alike and are both
    unverifiable: a damaged or edited file would be resumed as if it were the run's state.
    """
    if not cfg.accept_unverified_checkpoint:
        raise CheckpointError(
            f"checkpoint {path} has no checksum (written before checkpoints had one, or its checksum was removed), "
            "so its contents cannot be verified; resume it anyway with run config "
            "accept-unverified-checkpoint = true, or start over (overwrite = true)"
        )
    log(WARNING, "checkpoint %s has no checksum: its contents are not verified (accept-unverified-checkpoint = true)",
        path)


def load_checkpoint(folder: Path, cfg: RunConfig, template: Weights, nodes: list[list[int]] | None = None,
                    late_joins: bool = False) -> Checkpoint:
    """Read and check a checkpoint against this run's config, nodes and model shapes; all values finite.

    `late_joins`: the algorithm takes in sites that join mid-run (`node_table_problem`). Raises CheckpointError
    before anything in the folder is touched.
    """
    from safetensors import safe_open

    path = folder / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(
            f"resume = true but there is no checkpoint at {path}; start without resume, or set "
            "'run-name' (and 'results-dir') to the run to continue"
        )
    try:
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        identity = json.loads(meta["identity"])
        groups = json.loads(meta["groups"])
        strategy_meta = json.loads(meta["strategy"])
        metrics = json.loads(meta["metrics"])
        _check_metrics(metrics)
        saved_nodes = _saved_node_table(json.loads(meta.get("nodes", "null")))
        server_round = int(meta["round"])
    except Exception as err:  # noqa: BLE001 - any parse failure means the same thing to the user
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a fedsynth checkpoint ({type(err).__name__}: {err}); "
            "delete it to start over, or restore it from a backup"
        ) from None
    if meta.get("format") not in (str(FORMAT_VERSION), "1"):
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')!r}, expected {FORMAT_VERSION}")
    if _CHECKSUM not in meta or meta.get("format") == "1":
        _accept_unverified(path, cfg)
    elif meta[_CHECKSUM] != contents_checksum(tensors, meta):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its checksum does not match its contents (a changed or damaged file); "
            "delete it to start over, or restore it from a backup"
        )
    mismatched = config_differences(identity, cfg)
    if mismatched:
        detail = ", ".join(f"'{k}' is {old!r} in the checkpoint but {new!r} now" for k, (old, new) in mismatched.items())
        raise CheckpointError(
            f"checkpoint {path} belongs to another run: {detail}; resume with the checkpoint's config "
            f"(its config.json), or start a new run under another 'run-name' (differing keys: "
            f"{', '.join(mismatched)})"
        )
    problem = None if saved_nodes is None or nodes is None else node_table_problem(saved_nodes, nodes, late_joins)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} {problem}")
    bad = [key for key, value in tensors.items() if key != _RNG and value.dtype.kind in "fc" and not np.all(np.isfinite(value))]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} holds non-finite values (NaN or inf) in {len(bad)} array(s), e.g. '{bad[0]}'; "
            "it cannot be resumed: start the run over (overwrite = true) or restore an earlier checkpoint"
        )
    weights = {k[len(_MODEL):]: v for k, v in tensors.items() if k.startswith(_MODEL)}
    for name, ref in template.items():
        if name not in weights or weights[name].shape != ref.shape or weights[name].dtype != ref.dtype:
            raise CheckpointError(
                f"checkpoint {path} does not fit the model: array '{name}' is "
                f"{getattr(weights.get(name), 'shape', 'missing')}, expected {ref.shape}"
            )
    if set(weights) != set(template):
        raise CheckpointError(f"checkpoint {path} has arrays the model does not: {sorted(set(weights) - set(template))[:3]}")
    try:
        state = {
            group: {name: tensors[f"{_STATE}{group}/{name}"] for name in names} for group, names in groups.items()
        }
    except (KeyError, AttributeError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} is corrupt: its strategy state lacks {err}") from None
    metrics = _check_fields(path, cfg, server_round, metrics, tensors.get(_RNG))
    return Checkpoint(server_round, weights, state, strategy_meta, metrics, tensors.get(_RNG), saved_nodes)


def fork_checkpoint(source: Path, target: Path, cfg: RunConfig) -> Path:
    """Copy a checkpoint into another run's folder under that run's config (a deliberate fork, e.g. FedCOG
    continuing a FedAvg run); a plain resume refuses a changed config."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(source / CHECKPOINT_FILE), framework="numpy") as handle:
        meta = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    if _CHECKSUM not in meta or meta.get("format") == "1":
        _accept_unverified(source / CHECKPOINT_FILE, cfg)
    elif meta[_CHECKSUM] != contents_checksum(tensors, meta):
        raise CheckpointError(f"checkpoint {source / CHECKPOINT_FILE} is corrupt: its checksum does not match its "
                              "contents; it cannot be forked")
    meta["identity"] = json.dumps(_identity(cfg))
    meta["format"] = str(FORMAT_VERSION)
    meta[_CHECKSUM] = contents_checksum(tensors, meta)
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / CHECKPOINT_FILE), metadata=meta)
    return target / CHECKPOINT_FILE
