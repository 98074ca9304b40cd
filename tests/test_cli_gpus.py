"""`--gpus-per-client` reaches Ray's client resources, and `device = "auto"` picks CUDA (issue 21); no GPU needed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from common.metrics.evaluation import resolve_device
from fedsynth.cli import add_gpus_option, main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def captured(monkeypatch):
    """Replace Flower's simulation entry by a recorder of its keyword arguments."""
    import importlib

    module = importlib.import_module("flwr.simulation.run_simulation")  # the package re-exports a function of that name
    calls: list[dict] = []
    monkeypatch.setattr(module, "_run_simulation", lambda **kwargs: calls.append(kwargs))
    # the plumbing is what is tested here, on any machine: the CLI refuses GPUs where torch sees none
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return calls


def test_run_passes_the_gpu_fraction_to_rays_client_resources(tmp_path, captured, capsys):
    code = main(["run", "--app-dir", str(REPO), "--num-supernodes", "4", "--cpus-per-client", "2",
                 "--gpus-per-client", "0.25", "--run-config", f'results-dir="{tmp_path}"'])
    assert code == 1 and "without writing" in capsys.readouterr().err  # the recorder ran no federation
    (call,) = captured
    assert call["backend_name"] == "ray" and call["num_supernodes"] == 4
    assert call["backend_config"]["client_resources"] == {"num_cpus": 2.0, "num_gpus": 0.25}


def test_compare_passes_it_for_every_algorithm(tmp_path, captured, monkeypatch):
    import fedsynth.cli

    monkeypatch.setattr(fedsynth.cli, "write_comparison", lambda runs, folder: None)
    monkeypatch.setattr(Path, "is_file", lambda self: True)  # pretend each run wrote its summary
    fedsynth.cli.compare(REPO, ["fedavg", "fedprox"], {"results-dir": str(tmp_path)}, 3, 1.0, "c", 0.5)
    assert [c["backend_config"]["client_resources"]["num_gpus"] for c in captured] == [0.5, 0.5]


def test_without_the_option_no_gpu_is_reserved(tmp_path, captured):
    main(["run", "--app-dir", str(REPO), "--run-config", f'results-dir="{tmp_path}"'])
    assert captured[0]["backend_config"]["client_resources"]["num_gpus"] == 0.0


@pytest.mark.parametrize("text,ok", [("0.1", True), ("1", True), ("2", True), ("-0.5", False), ("1.5", False)])
def test_the_option_accepts_fractions_and_whole_gpus(text, ok):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_gpus_option(parser)
    if ok:
        assert parser.parse_args(["--gpus-per-client", text]).gpus_per_client == float(text)
    else:
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parser.parse_args(["--gpus-per-client", text])


def test_auto_device_picks_cuda_when_ray_gives_the_clientapp_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
