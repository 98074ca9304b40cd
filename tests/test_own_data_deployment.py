"""Sites' own data in Flower's deployment engine (issue 33): three SuperNodes, each with its own imagefolder.

The sites (tests/site_folders.py) hold different class subsets, one stores its images at another
size, one has no test split. The SuperNodes get `dataset-path` and `name` only (no partition ids);
the server holds no dataset: the run uses `dataset = "own"` (no named dataset to find), and HOME,
XDG_CACHE_HOME and every cache folder are the test's own, so nothing global can be found. FedAvg
and FedCOG must end `finished:completed` with each node's train count equal to its folder's size
minus its test cut; the FedAvg run trains a user's model factory shipped inside the Flower app
(`model = "sitemodels.nets:small"`, a package next to the app's own). Then a federation with a site whose class is outside the label space and a
site with an empty folder must fail at the handshake, quickly, naming both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedsynth.loopback import LoopbackFederation, app_copy
from tests.site_folders import CLASS_NAMES, write_sites

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


USER_MODEL = """from torch import nn


def small(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, 16), nn.ReLU(),
                         nn.Linear(16, num_classes))
"""


def app_with_user_model(target: Path) -> Path:
    """The Flower app as `flwr run` ships it (pyproject.toml, its packages) plus a user's model package."""
    app_copy(REPO, target)
    (target / "sitemodels").mkdir()
    (target / "sitemodels" / "__init__.py").write_text("")
    (target / "sitemodels" / "nets.py").write_text(USER_MODEL)
    return target


def _isolated_env(work: Path) -> dict[str, str]:
    for name in ("home", "xdg"):
        (work / name).mkdir(exist_ok=True)
    return {"HOME": str(work / "home"), "XDG_CACHE_HOME": str(work / "xdg"), "OMP_NUM_THREADS": "1"}


def _node_config(path: Path, name: str, work: Path) -> str:
    return f'dataset-path="{path}" name="{name}" cache-dir="{work / ("cache-" + name)}"'


def _run_config(results: Path, run_name: str, **extra: str) -> str:
    values = {
        "partition": "'node'", "dataset": "'own'", "image-channels": "1", "image-size": "28",
        "class-names": f"'{','.join(CLASS_NAMES)}'", "num-server-rounds": "2", "local-steps": "3",
        "batch-size": "8", "min-nodes": "3", "node-wait-timeout": "120.0", "round-timeout": "300.0",
        "checkpoint-every": "0", "results-dir": f"'{results}'", "run-name": f"'{run_name}'", **extra,
    }
    return " ".join(f"{key}={value}" for key, value in values.items())


def test_three_sites_with_their_own_folders_run_fedavg_and_fedcog_with_no_data_on_the_server(tmp_path):
    sites = write_sites(tmp_path / "sites")
    results = tmp_path / "results"
    configs = [_node_config(site.path, site.name, tmp_path) for site in sites]
    with LoopbackFederation(tmp_path, 0, extra_env=_isolated_env(tmp_path), node_configs=configs) as federation:
        app = app_with_user_model(tmp_path / "app")
        for algorithm, extra in (("fedavg", {"model": "'sitemodels.nets:small'"}),
                                 ("fedcog", {"cog-start-round": "2", "gen-steps": "4", "gen-budget": "24"})):
            run_id = federation.submit(app, _run_config(results, algorithm, algorithm=f"'{algorithm}'", **extra))
            status = federation.wait_until_finished(run_id, timeout=500, summary=results / algorithm / "summary.json")
            assert status == "finished:completed", f"{algorithm}: {status}" + federation.log_tails()
            folder = results / algorithm
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["status"] == "ok" and summary["num-nodes"] == 3, summary
            assert summary["accuracy-source"] == "local-test"
            nodes = {row["name"]: row for row in json.loads((folder / "nodes.json").read_text())}
            for site in sites:
                cut = 0 if site.num_test else round(site.num_train * 0.2)
                assert nodes[site.name]["num-train-examples"] == site.num_train - cut, nodes
                assert nodes[site.name]["num-test-examples"] == (site.num_test or cut), nodes
            rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            assert [r["round"] for r in rounds] == [1, 2] and all(r["answered"] == 3 for r in rounds)
            if algorithm == "fedavg":  # the user's model: 784 -> 16 -> 10
                from safetensors.numpy import load_file

                shapes = {k: v.shape for k, v in load_file(str(folder / "model.safetensors")).items()}
                assert shapes == {"1.weight": (16, 784), "1.bias": (16,), "3.weight": (10, 16), "3.bias": (10,)}
            if algorithm == "fedcog":
                assert rounds[1]["stat-cog-generated"] > 0  # FedCOG's generation ran on the sites' data
    assert not (tmp_path / "xdg" / "fedsynth" / "data").exists()  # no dataset was looked for in the defaults


def test_sites_with_a_foreign_label_and_an_empty_folder_are_refused_at_once_naming_them(tmp_path, flower_app):
    sites = write_sites(tmp_path / "sites")
    foreign = sites[1].path / "train" / CLASS_NAMES[sites[1].classes[0]]
    foreign.rename(foreign.parent / "cat")  # a class the run does not know
    (tmp_path / "empty").mkdir()
    configs = [_node_config(sites[0].path, "good", tmp_path), _node_config(sites[1].path, "foreign", tmp_path),
               _node_config(tmp_path / "empty", "hollow", tmp_path)]
    results = tmp_path / "results"
    with LoopbackFederation(tmp_path, 0, extra_env=_isolated_env(tmp_path), node_configs=configs) as federation:
        time.sleep(5)  # the SuperNodes connect, as in a deployment that starts its run after its nodes
        start = time.monotonic()
        run_id = federation.submit(flower_app, _run_config(results, "bad", **{"node-wait-timeout": "300.0"}))
        summary_file = results / "bad" / "summary.json"
        while not summary_file.is_file() and time.monotonic() - start < 120:
            time.sleep(0.5)
        refused_after = time.monotonic() - start
        status = federation.wait_until_finished(run_id, timeout=120)
        logs = federation.log_tails()
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "failed", summary
    reason = summary["status-reason"]
    assert "node 'foreign'" in reason and "'cat'" in reason and "outside the federation's label space" in reason
    assert "node 'hollow'" in reason and "is empty" in reason, reason
    assert "node 'good'" not in reason
    assert status == "finished:failed", status + logs
    # The ServerApp opens the results folder (config.json) right before its handshake and writes
    # summary.json when the handshake fails: that is the time the refusal took (it includes starting
    # every node's ClientApp process); the whole run, Flower's start-up included, is far below the wait.
    # On an idle machine it takes seconds; on this 2-core CI host shared with other suites (load ~17, where
    # importing the ClientApp alone takes 14 s and the three nodes' ClientApp processes start at once) it
    # took 43 s, so the bound is a fifth of the 300 s node-wait-timeout: a wait for the timeout fails it.
    handshake = summary_file.stat().st_mtime - (results / "bad" / "config.json").stat().st_mtime
    assert handshake < 60, f"the handshake took {handshake:.1f}s"
    assert refused_after < 300, f"refused after {refused_after:.1f}s, not before node-wait-timeout"
