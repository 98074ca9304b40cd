"""A checkpoint is verified field by field before a resumed run writes anything (issue 34).

Each bad checkpoint of the issue is built, the resume is refused with a message
naming the fault, and the results folder is left byte for byte as it was. A
checkpoint holding metrics of rounds after its own is resumed with them dropped,
so metrics.jsonl counts every round once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from common.run.config import parse_run_config
from fedsynth.inprocess import InProcessGrid, run_federation
from server_app.checkpoint import CHECKPOINT_FILE, CheckpointError, contents_checksum
from server_app.registry import SERVER_STRATEGIES


def config(tmp_path: Path, data_dir: Path, **extra) -> dict:
    return {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
            "run-name": "run", "num-server-rounds": 3, "local-steps": 2, "batch-size": 16, "model": "mlp",
            "checkpoint-every": 1, **extra}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_data_dir) -> tuple[dict, Path]:
    """A 3-round run whose folder each test copies."""
    tmp_path = tmp_path_factory.mktemp("base")
    raw = config(tmp_path, tiny_data_dir)
    run_federation(raw, InProcessGrid(2, raw))
    return raw, tmp_path / "results" / "run"


@pytest.fixture
def run_copy(finished_run, tmp_path) -> tuple[dict, Path]:
    import shutil

    raw, folder = finished_run
    target = tmp_path / "results" / "run"
    shutil.copytree(folder, target)
    (target / ".lock").unlink(missing_ok=True)
    return {**raw, "results-dir": str(tmp_path / "results"), "resume": True}, target


def read(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        return dict(handle.metadata()), {k: handle.get_tensor(k) for k in handle.keys()}


def rewrite(path: Path, meta: dict, tensors: dict) -> None:
    """Save with a checksum that matches: the fields themselves are what is wrong."""
    from safetensors.numpy import save_file

    meta = {**meta, "checksum": contents_checksum(tensors, meta)}
    save_file(tensors, str(path), metadata=meta)


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


def refused(raw: dict, folder: Path, *words: str) -> None:
    before = files(folder)
    with pytest.raises(CheckpointError) as info:
        run_federation(raw, InProcessGrid(2, raw))
    assert all(w in str(info.value) for w in words), str(info.value)
    assert files(folder) == before  # nothing rewritten: not summary.json, not metrics.jsonl, not the model


def test_a_flipped_bit_is_refused_by_the_checksum(run_copy):
    raw, folder = run_copy
    path = folder / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x40  # a bit in the last array's data
    path.write_bytes(bytes(data))
    refused(raw, folder, "checksum", "corrupt")


def test_a_three_byte_rng_state_is_refused(run_copy):
    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    rewrite(folder / CHECKPOINT_FILE, meta, {**tensors, "rng/torch": np.zeros(3, dtype=np.uint8)})
    refused(raw, folder, "RNG state", "(3,)")


@pytest.mark.parametrize("round_", [-5, 0, 99])
def test_a_round_outside_the_run_is_refused(run_copy, round_):
    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    rewrite(folder / CHECKPOINT_FILE, {**meta, "round": str(round_)}, tensors)
    refused(raw, folder, f"round {round_}", "num-server-rounds = 3")


@pytest.mark.parametrize("nodes", ['"all"', "[[0, 1, 2]]", '[["0", 10]]', "[[0, true]]"])
def test_a_node_table_that_is_not_partition_example_pairs_is_refused_naming_it(run_copy, nodes):
    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    rewrite(folder / CHECKPOINT_FILE, {**meta, "nodes": nodes}, tensors)
    refused(raw, folder, "'nodes' entry", "[partition id, training examples] pairs")


def test_nan_metrics_are_refused(run_copy):
    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    metrics = json.loads(meta["metrics"])
    metrics[1]["train-loss"] = float("nan")
    metrics[2]["central-accuracy"] = None  # how metrics.jsonl writes a NaN
    rewrite(folder / CHECKPOINT_FILE, {**meta, "metrics": json.dumps(metrics)}, tensors)
    refused(raw, folder, "non-finite metrics", "round(s) [1, 2]")


def test_metrics_past_the_checkpoints_round_are_dropped_so_every_round_is_counted_once(run_copy):
    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    metrics = json.loads(meta["metrics"])
    assert [r["round"] for r in metrics] == [0, 1, 2, 3]
    # a checkpoint of round 2 whose metrics (and metrics.jsonl) already hold rounds 3, 4 and 5
    extra = [{**metrics[-1], "round": r} for r in (4, 5)]
    rewrite(folder / CHECKPOINT_FILE, {**meta, "round": "2", "metrics": json.dumps(metrics + extra)}, tensors)
    with open(folder / "metrics.jsonl", "a") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in extra)
    run_federation(raw, InProcessGrid(2, raw))
    rounds = [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3]


def test_a_checkpoint_is_refused_by_the_cli_before_the_engine_starts(run_copy, tiny_data_dir):
    from fedsynth.simulation import preflight

    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    rewrite(folder / CHECKPOINT_FILE, {**meta, "round": "99"}, tensors)
    before = files(folder)
    with pytest.raises(CheckpointError, match="round 99"):
        preflight(parse_run_config(raw, SERVER_STRATEGIES), folder, 2, 1.0)
    assert files(folder) == before


def test_a_checkpoint_missing_its_strategy_arrays_is_refused_before_anything_is_written(finished_run, tmp_path):
    raw, folder = finished_run
    raw = {**raw, "algorithm": "fedavgm", "results-dir": str(tmp_path / "results"), "run-name": "m"}
    run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "m"
    meta, tensors = read(folder / CHECKPOINT_FILE)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("state/")}  # the velocity's arrays are gone
    rewrite(folder / CHECKPOINT_FILE, meta, tensors)
    refused({**raw, "resume": True}, folder, "corrupt")


@pytest.mark.parametrize("checkpoint_format", ["1", "2"])  # written before checksums, or a checksum removed
def test_a_checkpoint_without_a_checksum_is_resumed_only_when_the_run_config_accepts_it_by_name(run_copy,
                                                                                             checkpoint_format):
    from safetensors.numpy import save_file

    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    meta = {k: v for k, v in meta.items() if k != "checksum"}
    save_file(tensors, str(folder / CHECKPOINT_FILE), metadata={**meta, "format": checkpoint_format})
    raw = {**raw, "num-server-rounds": 4}  # one round more than the checkpoint's run
    refused(raw, folder, "has no checksum", "accept-unverified-checkpoint = true")
    run_federation({**raw, "accept-unverified-checkpoint": True}, InProcessGrid(2, raw))
    rounds = [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3, 4]


def test_a_checkpoint_whose_model_breaks_every_reply_is_named_not_the_clientapp(run_copy):
    """A huge finite weight passes the checks of a checkpoint; the round after the resume names the checkpoint."""
    from server_app.strategies.base import TooManyFailedRounds

    raw, folder = run_copy
    meta, tensors = read(folder / CHECKPOINT_FILE)
    huge = {k: np.full_like(v, 3e38) if k.startswith("model/") and v.dtype == np.float32 else v
            for k, v in tensors.items()}
    rewrite(folder / CHECKPOINT_FILE, meta, huge)
    with pytest.raises(TooManyFailedRounds) as ended:
        run_federation({**raw, "num-server-rounds": 4}, InProcessGrid(2, raw))
    message = str(ended.value)
    assert f"first round after resuming from the checkpoint in {folder} (round 3)" in message, message
    assert "|w| = 3e+38" in message and "Change the ClientApp's reply" not in message
