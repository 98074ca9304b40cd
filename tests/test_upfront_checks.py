"""Study files, CLI options and data are checked up front, naming the key or file at fault (issue 34).

Each case of the issue that used to give a traceback, a late failure or a silent acceptance is refused
here in seconds, before any run or Ray starts, with a message that names the key and what it accepts.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.run.config import ConfigError, parse_run_config
from common.data.datasets import load_dataset
from common.data.partition import PartitionSpec, partition_indices
from fedsynth.cli import EXIT_BAD_INPUT, main
from fedsynth.study.studyfile import StudyError, parse_study
from server_app.registry import SERVER_STRATEGIES

REPO = Path(__file__).resolve().parent.parent


def raw_study(**study) -> dict:
    return {
        "study": {"report-seeds": [0, 1], "tuning-seeds": [5], **study},
        "base": {"model": "mlp"},
        "arms": {"x": {"algorithm": "fedavg", "grid": {"lr": [0.01, 0.1]}}, "y": {"algorithm": "fedprox"}},
        "claims": ["x > y"],
    }


@pytest.mark.parametrize("change, words", [
    # the tracebacks
    ({"targets": ["x"]}, ["targets", "a list of numbers"]),
    ({"score": "rounds-to:1e"}, ["rounds-to:1e", "not a number"]),
    ({"last-k": "x"}, ["last-k", "an integer >= 1"]),
    ({"num-supernodes": "two"}, ["num-supernodes", "an integer >= 1"]),
    # the silent acceptances
    ({"num-supernodes": 0}, ["num-supernodes", "an integer >= 1"]),
    ({"report-seeds": [-1, 0]}, ["report-seeds", "integers >= 0"]),
    ({"metric": "central-acuracy"}, ["metric 'central-acuracy'", "did you mean 'central-accuracy'"]),
    ({"tuning-metric": "local-test-acc"}, ["tuning-metric", "did you mean 'local-test-accuracy'"]),
    ({"report-seed": [0]}, ["unknown key 'report-seed'", "did you mean 'report-seeds'"]),
    ({"last-k": 1.5}, ["last-k", "an integer >= 1"]),
    # and their neighbours
    ({"cpus-per-client": math.nan}, ["cpus-per-client", "a number > 0"]),
    ({"gpus-per-client": 1.5}, ["gpus-per-client"]),
    ({"tuning-central-eval": "yes"}, ["tuning-central-eval", "true or false"]),
    ({"extra-metrics": ["kdi"]}, ["metric 'kdi'", "did you mean 'kid'"]),
])
def test_a_bad_study_value_is_refused_naming_the_key_and_what_it_accepts(change, words):
    with pytest.raises(StudyError) as info:
        parse_study(raw_study(**change), Path("s.toml"))
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("edit, words", [
    (lambda raw: raw.update(claims=[{"claim": 5}]), ["claim = 5"]),
    (lambda raw: raw.update(claims=[{"claim": "x > y", "scroe": "best"}]), ["'scroe'", "did you mean 'score'"]),
    (lambda raw: raw["arms"]["x"].update(grid="lr"), ["grid = 'lr'", "must be a table"]),
    (lambda raw: raw["arms"]["x"].update(paper="high"), ["paper = 'high'"]),
    (lambda raw: raw.update(variants={"a": 3}), ["variant 'a'", "table"]),
    (lambda raw: raw.update(claims="x > y"), ["claims must be an array"]),
])
def test_bad_claims_arms_and_variants_are_refused(edit, words):
    raw = raw_study()
    edit(raw)
    with pytest.raises(StudyError) as info:
        parse_study(raw, Path("s.toml"))
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("raw, words", [
    ({"seed": -1}, ["'seed' = -1", ">= 0"]),
    ({"run-name": "a\x00b"}, ["'run-name'", "NUL"]),
    ({"max-weight-share": -0.5}, ["'max-weight-share'"]),  # 0 means "not set" (bounded-influence fills it)
    ({"max-missing-nodes": -1}, ["'max-missing-nodes'"]),
])
def test_bad_run_config_values_are_refused_by_the_parser(raw, words):
    with pytest.raises(ConfigError) as info:
        parse_run_config(raw, SERVER_STRATEGIES)
    assert all(w in str(info.value) for w in words), str(info.value)


def run_args(tmp_path, *options) -> list[str]:
    return ["run", "--app-dir", str(REPO), *options, "--run-config", f'results-dir="{tmp_path}" model="mlp"']


@pytest.mark.parametrize("options, words", [
    (["--cpus-per-client", "0"], ["--cpus-per-client 0", "> 0"]),
    (["--cpus-per-client", "nan"], ["--cpus-per-client nan"]),
    (["--num-supernodes", "0"], ["--num-supernodes 0"]),
])
def test_cli_resource_options_are_refused_before_ray_starts(tmp_path, capsys, options, words):
    started = time.monotonic()
    assert main(run_args(tmp_path, *options)) == EXIT_BAD_INPUT
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_gpus_on_a_machine_without_one_are_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(run_args(tmp_path, "--gpus-per-client", "1")) == EXIT_BAD_INPUT
    assert "no CUDA GPU" in capsys.readouterr().err


def test_compare_checks_every_algorithm_before_the_first_run(tmp_path, capsys, monkeypatch):
    import fedsynth.cli

    ran: list = []
    monkeypatch.setattr(fedsynth.cli, "run_simulation", lambda *a, **k: ran.append(a))
    code = main(["compare", "--app-dir", str(REPO), "--algorithms", "fedavg,fedporx", "--run-config",
                 f'results-dir="{tmp_path}"'])
    assert code == EXIT_BAD_INPUT and ran == []  # before: fedavg ran in full, then fedporx was refused
    assert "'fedporx'" in capsys.readouterr().err


def write_data(root: Path, side: int = 28, label: int | None = None) -> Path:
    from conftest import write_idx_labels

    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 40), ("t10k", 10)):
        images = rng.integers(0, 255, size=(n, side, side), dtype=np.uint8)
        header = bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in images.shape)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        labels = rng.integers(0, 10, size=n)
        if label is not None:
            labels[3] = label
        write_idx_labels(raw / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


def test_labels_out_of_range_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz holds labels from 0 to 255.*0\.\.9"):
        load_dataset("fashion-mnist", write_data(tmp_path, label=255))


def test_images_of_another_size_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte holds 32x32 images.*expect 28x28"):
        load_dataset("fashion-mnist", write_data(tmp_path, side=32))


def test_fewer_samples_than_nodes_names_the_counts():
    with pytest.raises(ValueError, match="20 training samples, fewer than the 30 partitions"):
        partition_indices(np.arange(20) % 10, PartitionSpec("fashion-mnist", "iid", 30, 0))
