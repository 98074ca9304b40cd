"""Sites' own folders in Flower's simulation engine through the `dataset-path` template (issue 33).

The user tries the sites' layout on one machine before deploying it: the same three folders as the
deployment test, reached as `dataset-path = "<root>/{partition-id}"`, with a user's own model
factory from a temporary package; and FedDDPM on them, scored by FID against their feature sums.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.site_folders import site_run_config, write_sites

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_the_sites_folders_run_in_simulation_through_the_template_with_a_user_model(tmp_path, monkeypatch):
    from fedsynth.simulation import run_simulation

    sites = write_sites(tmp_path / "sites")
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    for index, site in enumerate(sites):
        (by_id / str(index)).symlink_to(site.path, target_is_directory=True)
    package = tmp_path / "userpkg" / "simmodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(
        "from torch import nn\n\n\ndef small(num_classes, channels, image_size):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, 32), nn.ReLU(),\n"
        "                         nn.Linear(32, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path / "userpkg"))  # the engine's workers get the driver's sys.path
    monkeypatch.setenv("FEDSYNTH_ALLOWED_IMPORTS", "simmodels")  # and its environment: the site permits it
    overrides = site_run_config(**{
        "dataset-path": str(by_id / "{partition-id}"), "model": "simmodels.nets:small", "num-server-rounds": 2,
        "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"), "run-name": "sim",
        "node-wait-timeout": 300.0,
    })
    folder = run_simulation(REPO, overrides, num_supernodes=3, cpus_per_client=1)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["num-nodes"] == 3 and summary["accuracy-source"] == "local-test"
    nodes = sorted(json.loads((folder / "nodes.json").read_text()), key=lambda row: row["partition-id"])
    for row, site in zip(nodes, sites):  # partition i reads folder i
        cut = 0 if site.num_test else round(site.num_train * 0.2)
        assert (row["partition-id"], row["num-train-examples"]) == (sites.index(site), site.num_train - cut)


def test_fedddpm_on_the_sites_folders_reports_fid_from_their_feature_sums_in_simulation(tmp_path):
    """FedDDPM on the same folders in Flower's simulation engine: the `fid_stats` query reaches every node
    through Flower, and the run reports a FID against the sites' feature sums (the server holds no images)."""
    from fedsynth.simulation import run_simulation
    from tests.diffusion_tiny import TINY_DIFFUSION

    sites = write_sites(tmp_path / "sites")
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    for index, site in enumerate(sites):
        (by_id / str(index)).symlink_to(site.path, target_is_directory=True)
    overrides = site_run_config(**{
        **TINY_DIFFUSION, "algorithm": "fedddpm", "dataset": "own", "image-channels": 1, "num-server-rounds": 1,
        "local-steps": 1, "warmup-steps": 1, "dataset-path": str(by_id / "{partition-id}"),
        "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"), "run-name": "ddpm",
        "node-wait-timeout": 300.0,
    })
    folder = run_simulation(REPO, overrides, num_supernodes=3, cpus_per_client=1)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["fid-reference"] == "nodes' feature sums", summary
    assert summary["final-fid"] > 0 and summary["fid-features"].startswith("random") and "final-kid" not in summary
    warmup = json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])
    assert warmup["fid-reference-nodes"] == 3 and warmup["fid-reference-images"] == sum(
        site.num_train - (0 if site.num_test else round(site.num_train * 0.2)) for site in sites)
