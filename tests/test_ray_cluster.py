"""`--ray-address` (issue 37): the check that a Ray cluster can host the run, and a run on a real two-node cluster
whose ClientApps land on both nodes and which finishes on the head node after the worker node is killed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsynth.cli import main
from fedsynth.simulation import PLACEMENT_FILE, backend_config
from fedsynth.ray_cluster import ClusterError, RayNode, actors_per_node, check_cluster, probe_cluster

REPO = Path(__file__).resolve().parent.parent


# ---- the check at start -----------------------------------------------------------------------------------------

def test_actors_per_node_follows_flowers_rule_by_hand():
    assert actors_per_node(RayNode("a", cpus=8, gpus=0), 2, 0) == 4
    assert actors_per_node(RayNode("a", cpus=8, gpus=1), 1, 0.25) == 4  # 8 by CPUs, 4 by the GPU
    assert actors_per_node(RayNode("a", cpus=3, gpus=2), 1, 0.5) == 3  # 3 by CPUs, 4 by the GPUs
    assert actors_per_node(RayNode("a", cpus=8, gpus=0), 1, 0.5) == 0  # a GPU asked for, none there


def fake(*nodes: RayNode):
    return lambda address: list(nodes)


def test_a_cluster_that_fits_gives_each_nodes_actors():
    fits = check_cluster("h:1", 1, 0, probe=fake(RayNode("head", 1, 0), RayNode("worker", 2, 0)))
    assert fits == {"head": 1, "worker": 2}


@pytest.mark.parametrize("nodes, cpus, gpus, words", [
    ((RayNode("aaaaaaaa1", 1, 0), RayNode("bbbbbbbb2", 2, 0)), 4, 0,
     ["4 CPUs (--cpus-per-client)", "largest node has 2", "aaaaaaaa (1 CPUs, 0 GPUs)"]),
    ((RayNode("aaaaaaaa1", 8, 0),), 1, 0.5, ["0.5 GPUs (--gpus-per-client)", "no node has a GPU"]),
    ((RayNode("aaaaaaaa1", 8, 0), RayNode("bbbbbbbb2", 1, 1)), 2, 1, ["2 CPUs and 1 GPUs on one node"]),
])
def test_a_cluster_that_cannot_host_one_clientapp_is_refused_naming_what_is_missing(nodes, cpus, gpus, words):
    with pytest.raises(ClusterError, match="cannot host one ClientApp") as caught:
        check_cluster("h:1", cpus, gpus, probe=fake(*nodes))
    for word in words:
        assert word in str(caught.value)


def test_an_address_where_nothing_listens_fails_in_seconds():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens there
    start = time.monotonic()
    with pytest.raises(ClusterError, match=f"no Ray cluster at 127.0.0.1:{port}"):
        probe_cluster(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 10


def test_the_address_reaches_rays_init_args_and_a_refused_cluster_exits_2(tmp_path, monkeypatch, capsys):
    import importlib

    import fedsynth.ray_cluster

    config = backend_config(1.0, 0.0, "10.0.0.1:6379", tmp_path / PLACEMENT_FILE)
    assert config["init_args"]["address"] == "10.0.0.1:6379" and "address" not in backend_config(1.0)["init_args"]
    module = importlib.import_module("flwr.simulation.run_simulation")
    calls: list[dict] = []
    monkeypatch.setattr(module, "_run_simulation", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(fedsynth.ray_cluster, "probe_cluster", lambda address: [RayNode("n", 64, 0)])
    args = ["run", "--app-dir", str(REPO), "--ray-address", "10.0.0.1:6379", "--cpus-per-client", "32",
            "--run-config", f'results-dir="{tmp_path}" run-name="r"']
    main(args)  # 32 CPUs per ClientApp: more than this machine has, but the cluster's node has 64
    assert calls[0]["backend_config"]["init_args"]["address"] == "10.0.0.1:6379"
    monkeypatch.setattr(fedsynth.ray_cluster, "probe_cluster", lambda address: [RayNode("n", 2, 0)])
    assert main(args[:-1] + [f'results-dir="{tmp_path}" run-name="s"']) == 2
    assert "cannot host one ClientApp" in capsys.readouterr().err and len(calls) == 1


def test_a_study_on_a_cluster_runs_one_run_at_a_time(tmp_path, capsys):
    code = main(["study", str(REPO / "studies" / "fedsynsam-cpu.toml"), "--app-dir", str(REPO), "--ray-address",
                 "127.0.0.1:1", "--jobs", "2", "--out", str(tmp_path)])
    assert code == 2 and "one run at a time" in capsys.readouterr().err


# ---- a real two-node cluster ------------------------------------------------------------------------------------

def start_cluster(head_cpus: int, worker_cpus: int):
    """A head and a worker raylet on this host (ray.cluster_utils.Cluster), or a skip saying why in one line."""
    from ray.cluster_utils import Cluster

    try:
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={"num_cpus": head_cpus, "include_dashboard": False})
        worker = cluster.add_node(num_cpus=worker_cpus)
        cluster.wait_for_nodes(timeout=60)
    except Exception as err:  # noqa: BLE001 - any failure to start Ray here is a reason to skip, said in one line
        pytest.skip(f"a two-node Ray cluster cannot start here: {type(err).__name__}: {err}")
    return cluster, worker


@pytest.fixture
def two_node_cluster():
    """A head and a worker with one CPU each: one ClientApp actor on each."""
    cluster, worker = start_cluster(1, 1)
    try:
        yield cluster, worker
    finally:
        cluster.shutdown()


@pytest.fixture
def worker_only_cluster():
    """A head that hosts no ClientApp and a worker with one CPU: every actor is on the worker."""
    cluster, worker = start_cluster(0, 1)
    try:
        yield cluster, worker
    finally:
        cluster.shutdown()


def start_run(cluster, tmp_path: Path, data_dir: Path, rounds: int, *extra: str) -> subprocess.Popen:
    config = (f'data-dir="{data_dir}" cache-dir="{tmp_path / "cache"}" results-dir="{tmp_path}" run-name="run" '
              f'num-server-rounds={rounds} local-steps=60 batch-size=16 model="mlp" checkpoint-every=1 '
              f'node-wait-timeout=600.0 ' + " ".join(extra))
    return subprocess.Popen(
        [sys.executable, "-m", "fedsynth.cli", "run", "--app-dir", str(REPO), "--num-supernodes", "4",
         "--cpus-per-client", "1", "--ray-address", cluster.address, "--run-config", config],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_for_rounds(run: subprocess.Popen, folder: Path, rounds: int, nodes: int = 1) -> set[str]:
    """Wait until the run has logged `rounds` rounds and its ClientApps ran on `nodes` nodes; those nodes."""
    placement, metrics = folder / PLACEMENT_FILE, folder / "metrics.jsonl"
    deadline = time.monotonic() + 300
    seen: set[str] = set()
    while time.monotonic() < deadline and run.poll() is None:
        seen = {json.loads(line)["ray-node-id"] for line in placement.read_text().splitlines()} if placement.is_file() else set()
        done = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        if len(seen) >= nodes and done >= rounds:
            return seen
        time.sleep(0.2)
    run.kill()
    pytest.fail(f"the run did not reach {rounds} rounds on {nodes} node(s): {seen}\n{run.communicate()[0][-3000:]}")


@pytest.mark.slow
def test_a_run_spreads_over_two_nodes_and_finishes_on_the_head_when_the_worker_dies(
        tmp_path, tiny_data_dir, two_node_cluster):
    cluster, worker = two_node_cluster
    rounds = 12
    run = start_run(cluster, tmp_path, tiny_data_dir, rounds)
    placement = tmp_path / "run" / PLACEMENT_FILE
    nodes = wait_for_rounds(run, tmp_path / "run", rounds=2, nodes=2)  # both nodes used, the run two rounds in
    assert worker.node_id in nodes
    killed_at = len(placement.read_text().splitlines())
    cluster.remove_node(worker, allow_graceful=False)  # the worker node dies mid-run
    output, _ = run.communicate(timeout=600)
    assert run.returncode == 0, output[-3000:]
    assert "a ClientApp actor was lost" in output  # the worker's actor died, and its message ran again on the head
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["rounds"] == rounds
    assert summary["failed-rounds"] == 0 and summary["rounds-with-dropped-replies"] == 0  # no reply was lost
    after = [json.loads(line) for line in placement.read_text().splitlines()[killed_at:]]
    assert all(entry["ray-node-id"] != worker.node_id for entry in after)  # later placements all on the head


@pytest.mark.slow
def test_a_run_that_loses_every_node_fails_with_a_checkpoint_and_resumes_on_a_new_one(
        tmp_path, tiny_data_dir, worker_only_cluster):
    cluster, worker = worker_only_cluster
    rounds = 8
    run = start_run(cluster, tmp_path, tiny_data_dir, rounds, "max-failed-rounds=1")
    wait_for_rounds(run, tmp_path / "run", rounds=2)
    cluster.remove_node(worker, allow_graceful=False)  # the only node with ClientApps dies
    output, _ = run.communicate(timeout=600)
    assert run.returncode != 0 and "every ClientApp actor was lost" in output, output[-3000:]
    assert (tmp_path / "run" / "checkpoint.safetensors").is_file()
    new = cluster.add_node(num_cpus=1)  # a node joins again
    cluster.wait_for_nodes(timeout=60)
    resumed = start_run(cluster, tmp_path, tiny_data_dir, rounds, "max-failed-rounds=1", "resume=true")
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["rounds"] == rounds
    placed = [json.loads(line)["ray-node-id"] for line in (tmp_path / "run" / PLACEMENT_FILE).read_text().splitlines()]
    assert new.node_id in placed and set(placed) == {worker.node_id, new.node_id}
