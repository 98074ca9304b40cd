"""Opt-in TensorBoard tracking (`tensorboard = true`, issue 21): one scalar per metrics key and round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.run.results import RunResults, read_metrics
from common.run.tracking import round_scalars
from fedsynth.inprocess import InProcessGrid, run_federation
from tests.diffusion_tiny import TINY_DIFFUSION


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    return accumulator


def _config(tmp_path: Path, data_dir: Path, **extra) -> dict:
    return {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
            "run-name": "run", "num-server-rounds": 3, "local-steps": 2, "batch-size": 16, "model": "mlp",
            "tensorboard": True, **extra}


def test_round_scalars_keep_numbers_only():
    record = {"round": 3, "central-accuracy": 0.5, "answered": 2, "ok": True, "name": "x", "per-node": [1, 2],
              "fid": float("nan")}
    assert round_scalars(record) == {"central-accuracy": 0.5, "answered": 2.0}


def test_event_files_hold_one_scalar_per_key_and_round(tmp_path, tiny_data_dir):
    raw = _config(tmp_path, tiny_data_dir)
    run_federation(raw, InProcessGrid(2, raw))
    folder = tmp_path / "results" / "run"
    rounds = read_metrics(folder / "metrics.jsonl")
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in rounds:
        for key, value in round_scalars(record).items():
            expected.setdefault(key, []).append((record["round"], value))
    assert {"central-accuracy", "train-loss", "uplink-bytes"} <= set(expected)
    events = _events(folder)
    assert sorted(events.Tags()["scalars"]) == sorted(expected)
    for key, points in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), key


def test_without_the_key_no_event_file_is_written(tmp_path, tiny_data_dir):
    raw = _config(tmp_path, tiny_data_dir, tensorboard=False, **{"num-server-rounds": 1})
    run_federation(raw, InProcessGrid(2, raw))
    assert not list((tmp_path / "results" / "run").glob("events.out.tfevents.*"))


def test_a_diffusion_run_also_writes_its_sample_grids(tmp_path, tiny_data_dir):
    raw = {**_config(tmp_path, tiny_data_dir, **{"num-server-rounds": 2}), **TINY_DIFFUSION, "fid-every": 1}
    run_federation(raw, InProcessGrid(2, raw))
    events = _events(tmp_path / "results" / "run")
    assert [e.step for e in events.Images("samples")] == [1, 2]
    assert [e.step for e in events.Scalars("fid")] == [1, 2]


def test_a_resumed_run_purges_the_rounds_it_runs_again(tmp_path, tiny_data_dir):
    from common.run.config import parse_run_config

    raw = _config(tmp_path, tiny_data_dir)
    cfg = parse_run_config(raw, ["fedavg"])
    first = RunResults(cfg)
    for step in range(4):
        first.log_round({"round": step, "central-accuracy": 0.1 * step})
    first.tensorboard.close()  # the run dies after round 3; its checkpoint holds rounds 0..1
    first.close()  # its process, and with it the results folder's lock, is gone
    (tmp_path / "results" / "run" / "checkpoint.safetensors").write_bytes(b"")  # a resume needs one to be there
    resumed = RunResults(parse_run_config({**raw, "resume": True}, ["fedavg"]))
    resumed.restore_rounds([{"round": 0, "central-accuracy": 0.0}, {"round": 1, "central-accuracy": 0.1}])
    for step in (2, 3):
        resumed.log_round({"round": step, "central-accuracy": 0.5 + step})
    resumed.write_summary({})
    got = _events(tmp_path / "results" / "run").Scalars("central-accuracy")
    assert [e.step for e in got] == [0, 1, 2, 3]
    assert [e.value for e in got] == pytest.approx([0.0, 0.1, 2.5, 3.5])
    assert json.loads((tmp_path / "results" / "run" / "summary.json").read_text()) == {}
