"""A site's own data (`partition = "node"`, issue 33): formats, label space, validation, a server without data.

The three imagefolder sites of tests/site_folders.py are PNG files cut from Fashion-MNIST's test
images; the `datasets` formats use the tiny dataset of tests/hf_tiny.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from common.run.config import ConfigError, parse_run_config
from common.data.site_data import fill_path_template, load_site_data, site_spec
from common.data.site_reader import LabelSpace, SiteDataError
from fedsynth.inprocess import InProcessGrid, run_federation
from server_app.registry import SERVER_STRATEGIES
from tests.hf_tiny import NUM_CLASSES, SIDE, tiny_image_dataset, write_parquet, write_saved
from tests.site_folders import CLASS_NAMES, fashion_mnist_test_images, site_run_config, write_images, write_sites


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory):
    return write_sites(tmp_path_factory.mktemp("sites"))


def _cfg(**extra):
    return parse_run_config(site_run_config(**extra), SERVER_STRATEGIES)


def _own_cfg(**extra):
    """The tiny hf dataset's shape, with no named dataset."""
    return _cfg(**{"dataset": "own", "class-names": "", "num-classes": NUM_CLASSES, "image-channels": 1,
                   "image-size": SIDE, **extra})


def test_label_space_maps_ids_names_and_refuses_the_rest():
    named = LabelSpace(3, ("cat", "dog", "cow"))
    # a whole float is its id (pandas stores an int column with a gap as floats; issue 47), a fraction or NaN is not
    assert [named.label_of(v) for v in ("dog", 2, np.int64(0), "horse", 3, -1, True, 1.0, 1.5, float("nan"))] == [
        1, 2, 0, None, None, None, None, 1, None, None]
    ids = LabelSpace(3)
    assert [ids.label_of(v) for v in ("2", "7", "cat", 1)] == [2, None, None, 1]


def test_the_path_template_takes_the_partition_id_and_needs_one():
    assert fill_path_template("/data/sites/{partition-id}/x", {"partition-id": 4}) == "/data/sites/4/x"
    assert fill_path_template("/data/site", {}) == "/data/site"
    with pytest.raises(ValueError, match="no 'partition-id'"):
        fill_path_template("/data/{partition-id}", {})


def test_shape_keys_are_required_without_a_named_dataset_and_hf_is_refused():
    with pytest.raises(ConfigError, match="'image-channels'"):
        _cfg(dataset="own", **{"image-size": 28})
    with pytest.raises(ConfigError, match="'num-classes' = 3 but 'class-names' names 10"):
        _cfg(**{"num-classes": 3})
    with pytest.raises(ConfigError, match="dataset-path"):
        _cfg(dataset="hf:x")
    with pytest.raises(ConfigError, match="'own'"):
        parse_run_config({"dataset": "own"}, SERVER_STRATEGIES)  # only with partition = node


def test_imagefolder_sites_map_class_folders_through_the_class_names_resize_and_cut_a_test_split(sites, tmp_path):
    cfg = _cfg()
    x_all, y_all = fashion_mnist_test_images()
    for site in sites:
        data = load_site_data(site_spec(cfg, str(site.path)), site.name, str(tmp_path))
        assert data.x_train.shape[1:] == (28, 28, 1) and data.x_train.dtype == np.uint8  # site-b's 32x32 resized
        held = sorted(set(data.y_train.tolist()) | set(data.y_test.tolist()))
        assert held == sorted(site.classes)  # ids from the class names, not from sorted folder names
        cut = round(site.num_train * 0.2) if not site.num_test else 0
        assert (len(data.y_train), len(data.y_test)) == (site.num_train - cut, site.num_test or cut)
        if site.side == 28:  # unresized PNGs are Fashion-MNIST's own pixels
            first = data.x_train[0, :, :, 0]
            assert any(np.array_equal(first, image) for image in x_all[y_all == data.y_train[0]])
    assert len(list((tmp_path / "sites").glob("*.npz"))) == 3  # decoded once, cached per node
    again = load_site_data(site_spec(cfg, str(sites[2].path)), "site-c", str(tmp_path))
    assert len(again.y_train) == 24  # from the cache, the same seeded cut


def test_save_to_disk_parquet_csv_and_flwr_datasets_create_output_load(tmp_path):
    from flwr_datasets.cli.create import create
    from PIL import Image

    cfg = _own_cfg(**{"local-test-fraction": 0.25})
    expected = tiny_image_dataset()
    write_saved(tmp_path / "saved")
    write_parquet(tmp_path / "pq")
    for folder in ("saved", "pq"):  # a train and a test split
        data = load_site_data(site_spec(cfg, str(tmp_path / folder)), folder, str(tmp_path / "cache"))
        np.testing.assert_array_equal(data.y_train, expected["train"]["digit"])
        np.testing.assert_array_equal(data.x_test[3, :, :, 0], np.asarray(expected["test"][3]["picture"]))
    # what `flwr-datasets create` writes: one saved Dataset per partition (no test split: a seeded cut)
    create(str(tmp_path / "pq"), num_partitions=2, out_dir=tmp_path / "fds")
    part = load_site_data(site_spec(cfg, str(tmp_path / "fds" / "partition_1")), "p1", str(tmp_path / "cache"))
    assert (len(part.y_train), len(part.y_test)) == (90, 30)  # 120 rows of the 240, 25 % held out
    with pytest.raises(SiteDataError, match="flwr-datasets create.*partition_<i>"):
        load_site_data(site_spec(cfg, str(tmp_path / "fds")), "root", "")
    # csv: an image column of paths relative to the csv file, string class names
    (tmp_path / "csv" / "img").mkdir(parents=True)
    rows = ["file,kind"]
    for i in range(6):
        Image.fromarray(np.asarray(expected["train"][i]["picture"])).save(tmp_path / "csv" / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,c{expected['train'][i]['digit']}")
    (tmp_path / "csv" / "train.csv").write_text("\n".join(rows) + "\n")
    named = _own_cfg(**{"num-classes": 0, "class-names": "c0,c1,c2,c3", "hf-image-column": "file",
                        "hf-label-column": "kind", "local-test-fraction": 0.5})
    data = load_site_data(site_spec(named, str(tmp_path / "csv")), "csv", "")
    assert sorted(data.y_train.tolist() + data.y_test.tolist()) == sorted(expected["train"]["digit"][:6])


def _bad_folder(tmp_path: Path, problem: str) -> Path:
    x, y = fashion_mnist_test_images()
    root = tmp_path / problem
    if problem == "outside":  # a class the run does not know
        write_images(root / "train", x[:3], y[:3], 28)
        (root / "train" / CLASS_NAMES[int(y[0])]).rename(root / "train" / "cat")
    elif problem == "empty":
        root.mkdir()
    elif problem == "empty-train":
        (root / "train" / "tshirt").mkdir(parents=True)
    elif problem == "undecodable":
        write_images(root / "train", x[:3], y[:3], 28)
        (root / "train" / CLASS_NAMES[int(y[0])] / "broken.png").write_bytes(b"not a png")
    return root


@pytest.mark.parametrize("problem, words", [
    ("outside", ["'cat'", "outside the federation's label space", "class-names"]),
    ("missing", ["does not exist"]),
    ("empty", ["is empty"]),
    ("empty-train", ["holds no training images"]),
    ("undecodable", ["broken.png", "cannot be decoded"]),
])
def test_a_bad_folder_is_refused_with_a_message_naming_the_node(tmp_path, problem, words):
    with pytest.raises(SiteDataError) as caught:
        load_site_data(site_spec(_cfg(), str(_bad_folder(tmp_path, problem))), "site-x", str(tmp_path / "cache"))
    message = str(caught.value)
    assert message.startswith("node 'site-x': ") and all(w in message for w in words), message


def _run_sites(tmp_path: Path, folders: list[Path], names: list[str], **extra) -> tuple[dict, Path]:
    raw = site_run_config(**{"num-server-rounds": 2, "cache-dir": str(tmp_path / "cache"),
                             "results-dir": str(tmp_path / "results"), "run-name": "run", **extra})
    grid = InProcessGrid(len(folders), raw, node_config=lambda i: {"dataset-path": str(folders[i]), "name": names[i]})
    return run_federation(raw, grid), tmp_path / "results" / "run"


def test_a_federation_of_own_folders_needs_no_data_on_the_server(sites, tmp_path, monkeypatch):
    import common.data.datasets

    def no_dataset(*args, **kwargs):
        raise AssertionError("the server opened a dataset")

    monkeypatch.setattr(common.data.datasets, "load_dataset", no_dataset)  # only the torchvision layout would need it
    summary, folder = _run_sites(tmp_path, [s.path for s in sites], [s.name for s in sites])
    assert summary["status"] == "ok" and summary["num-nodes"] == 3
    nodes = {row["name"]: row for row in json.loads((folder / "nodes.json").read_text())}
    for site in sites:
        cut = 0 if site.num_test else round(site.num_train * 0.2)
        assert nodes[site.name]["num-train-examples"] == site.num_train - cut
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert not any("central-accuracy" in r for r in rounds)  # no test set on the server: no central evaluation
    assert summary["accuracy-source"] == "local-test" and summary["final-accuracy"] == summary[
        "final-local-test-accuracy"]


def test_a_server_test_folder_is_used_for_central_evaluation(sites, tmp_path):
    summary, folder = _run_sites(tmp_path, [s.path for s in sites[:2]], ["a", "b"],
                                 **{"central-test-path": str(sites[0].path)})  # its test/ split: 8 images
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rounds[0]["round"] == 0 and "central-accuracy" in rounds[-1]
    assert summary["accuracy-source"] == "central" and summary["final-accuracy"] == summary["final-central-accuracy"]
    assert round(rounds[-1]["central-accuracy"] * 8) == pytest.approx(rounds[-1]["central-accuracy"] * 8)


def test_a_node_with_bad_data_fails_the_run_at_once_naming_the_node_in_the_results(sites, tmp_path):
    from server_app.handshake import HandshakeError

    bad = _bad_folder(tmp_path, "outside")
    start = time.monotonic()
    with pytest.raises(HandshakeError, match="refused at the handshake.*node 'site-bad'.*'cat'"):
        _run_sites(tmp_path, [sites[0].path, bad], ["site-a", "site-bad"], **{"node-wait-timeout": 120.0})
    assert time.monotonic() - start < 30  # not the node-wait-timeout
    summary = json.loads((tmp_path / "results" / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "site-bad" in summary["status-reason"]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedcog", "scaffold"])
def test_the_handshake_carries_no_label_histogram(sites, tmp_path, tiny_data_dir, algorithm):
    from flwr.app import Context, Message, RecordDict

    from client_app.app import app

    for raw, node_config in (
        (site_run_config(algorithm=algorithm, **{"cache-dir": str(tmp_path)}),
         {"dataset-path": str(sites[0].path), "name": "a"}),
        ({"algorithm": algorithm, "partition": "iid", "data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path)},
         {"partition-id": 0, "num-partitions": 2}),
    ):
        context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config=raw)
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        query = Message(RecordDict(), dst_node_id=5, message_type="query.handshake")
        reply = app(query, context)
        metrics = reply.content.metric_records["metrics"]
        assert set(metrics) <= {"partition-id", "num-partitions", "num-train-examples", "num-test-examples"}
        assert not any(isinstance(metrics[key], list) for key in metrics)


# ----- a user's own model: model = "package.module:factory" --------------------------------------------

USER_MODELS = '''
from torch import nn


def tiny(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, num_classes))


def not_a_module(num_classes, channels, image_size):
    return [num_classes, channels, image_size]
'''


@pytest.fixture()
def user_package(tmp_path, monkeypatch):
    package = tmp_path / "userpkg" / "sitemodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path / "userpkg"))
    monkeypatch.setenv("FEDSYNTH_ALLOWED_IMPORTS", "sitemodels")  # the site permits it (common/imports.py)
    return "sitemodels.nets"


def test_a_user_model_factory_trains_on_the_sites(sites, tmp_path, user_package):
    from safetensors.numpy import load_file

    summary, folder = _run_sites(tmp_path, [s.path for s in sites], [s.name for s in sites],
                                 model=f"{user_package}:tiny")
    assert summary["status"] == "ok"
    weights = load_file(str(folder / "model.safetensors"))
    assert {name: w.shape for name, w in weights.items()} == {"1.weight": (10, 784), "1.bias": (10,)}


@pytest.mark.parametrize("model, words", [
    ("sitemodels.nets:not_a_module", ["returned list, not a torch.nn.Module"]),
    ("sitemodels.nowhere:tiny", ["cannot import module 'sitemodels.nowhere'", "every SuperNode"]),
    ("sitemodels.nets:absent", ["no callable 'absent'"]),
])
def test_a_bad_user_model_is_refused_with_a_clear_error(user_package, model, words):
    from common.run.task import make_model

    with pytest.raises((ConfigError, ValueError)) as caught:
        make_model(_cfg(model=model))
    assert all(w in str(caught.value) for w in words), str(caught.value)


def test_moon_refuses_a_user_model_saying_what_it_lacks(user_package):
    with pytest.raises(ConfigError, match="MOON needs the model's `features` and `head`"):
        _cfg(model="sitemodels.nets:tiny", algorithm="moon")


def test_an_hf_run_with_its_shape_in_the_run_config_and_no_central_eval_opens_no_dataset_on_the_server(
        tmp_path, monkeypatch):
    import common.data.hf_datasets

    write_saved(tmp_path / "data" / "saved")
    raw = {"dataset": "hf:saved", "data-dir": str(tmp_path / "data"), "partition": "iid", "model": "mlp",
           "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"), "num-server-rounds": 1,
           "local-steps": 2, "batch-size": 8}
    run_federation({**raw, "run-name": "warm"}, InProcessGrid(2, {**raw, "run-name": "warm"}))  # the nodes' caches

    def opened(*args, **kwargs):
        raise AssertionError("a dataset was opened")

    for name in ("open_dataset", "hf_dataset_info", "load_hf_arrays"):
        monkeypatch.setattr(common.data.hf_datasets, name, opened)
    keys = {**raw, "run-name": "cold", "central-eval": False, "image-channels": 1, "image-size": SIDE,
            "num-classes": NUM_CLASSES}
    summary = run_federation(keys, InProcessGrid(2, keys))  # the nodes read their cached partitions
    assert summary["status"] == "ok" and summary["accuracy-source"] == "local-test"
    wrong = {**keys, "run-name": "wrong", "image-size": 32}
    with pytest.raises(Exception, match="do not describe dataset 'hf:saved'"):
        run_federation(wrong, InProcessGrid(2, wrong))


def test_two_nodes_with_one_name_are_refused_naming_both(sites, tmp_path):
    from server_app.handshake import HandshakeError

    with pytest.raises(HandshakeError, match="'twin'.*'twin'.*give every SuperNode its own 'name'"):
        _run_sites(tmp_path, [sites[0].path, sites[1].path], ["twin", "twin"])


def test_the_run_accuracy_metric_is_central_where_evaluated_else_the_nodes_local_test():
    from common.run.results import run_accuracy
    from fedsynth.study.scores import curve

    central = [{"round": 0, "central-accuracy": 0.1}, {"round": 1, "central-accuracy": 0.5, "local-test-accuracy": 0.7}]
    local = [{"round": 1, "local-test-accuracy": 0.4}, {"round": 2, "local-test-accuracy": 0.6}]
    assert [(r, v) for r, v, _ in curve(central, "accuracy")] == [(0, 0.1), (1, 0.5)]
    assert [(r, v) for r, v, _ in curve(local, "accuracy")] == [(1, 0.4), (2, 0.6)]
    assert run_accuracy({"final-central-accuracy": 0.5, "final-local-test-accuracy": 0.7}) == {
        "final-accuracy": 0.5, "accuracy-source": "central"}
    assert run_accuracy({"final-local-test-accuracy": 0.7}) == {"final-accuracy": 0.7, "accuracy-source": "local-test"}


def test_fedddpm_on_the_sites_folders_reports_fid_against_their_pooled_feature_sums(sites, tmp_path, monkeypatch):
    """Issue 33: FedDDPM on per-node folders, no data on the server, reports FID; its reference is the
    sites' feature sums, asked for once per run (a resume does not ask again), and every FID equals the
    FID against the sites' pooled training images to float tolerance. No KID: it needs every image."""
    import common.data.datasets
    import server_app.diffusion_eval as diffusion_eval
    from common.models.diffusion import to_diffusion_input
    from common.metrics.fid import gaussian_stats
    from tests.diffusion_tiny import TINY_DIFFUSION

    def no_dataset(*args, **kwargs):
        raise AssertionError("the server opened a dataset")

    monkeypatch.setattr(common.data.datasets, "load_dataset", no_dataset)
    frechet_distance = diffusion_eval.frechet_distance
    scored = []  # (generated, reference) statistics of every FID the server computed
    monkeypatch.setattr(diffusion_eval, "frechet_distance", lambda a, b: scored.append((a, b)) or frechet_distance(a, b))
    raw = site_run_config(**{**TINY_DIFFUSION, "algorithm": "fedddpm", "num-server-rounds": 2, "local-steps": 1,
                             "batch-size": 8, "warmup-steps": 1, "checkpoint-every": 1,
                             "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
                             "run-name": "run"})
    grid = InProcessGrid(3, raw, node_config=lambda i: {"dataset-path": str(sites[i].path), "name": sites[i].name})
    summary = run_federation(raw, grid)
    folder = tmp_path / "results" / "run"

    assert summary["status"] == "ok" and np.isfinite(summary["final-fid"]) and "final-kid" not in summary
    assert summary["fid-features"].startswith("random") and summary["fid-reference"] == "nodes' feature sums"
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    warmup, last = rounds[0], rounds[-1]
    assert warmup["fid-reference-nodes"] == 3 and warmup["fid-reference-bytes"] > 0 and "aux-kid" not in warmup
    assert np.isfinite(warmup["aux-fid"]) and np.isfinite(last["fid"]) and np.isfinite(last["final-fid"])
    assert "kid" not in last and "final-class-histogram" not in last
    queries = [m for m in grid.sent if m.metadata.message_type == "query.fid_stats"]
    assert len(queries) == 3 and all("fid-extractor" in q.content.array_records for q in queries)

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    images = np.concatenate([
        to_diffusion_input(load_site_data(site_spec(cfg, str(site.path)), site.name, str(tmp_path / "cache")).x_train, 8)
        for site in sites])
    pooled = gaussian_stats(diffusion_eval.run_extractor(cfg).features(images))
    assert len(scored) == 3 and warmup["fid-reference-images"] == pooled.count == sum(
        site.num_train - (0 if site.num_test else round(site.num_train * 0.2)) for site in sites)
    for generated, reference in scored:  # aux-fid, fid, final-fid
        assert frechet_distance(generated, reference) == pytest.approx(frechet_distance(generated, pooled), rel=1e-6)
    assert [frechet_distance(*pair) for pair in scored[1:]] == pytest.approx([last["fid"], last["final-fid"]])

    resumed = run_federation({**raw, "resume": True, "num-server-rounds": 3}, grid)
    assert resumed["status"] == "ok" and resumed["final-fid-round"] == 3
    assert len([m for m in grid.sent if m.metadata.message_type == "query.fid_stats"]) == 3  # kept in the checkpoint


def test_fedddpm_plus_on_the_sites_folders_shares_one_gathering_between_quicktest_and_fid(sites, tmp_path):
    """FedDDPM+'s QuickTest (quicktest-reference = clients) and FID's reference are the same sums: asked once."""
    from tests.diffusion_tiny import TINY_DIFFUSION

    raw = site_run_config(**{**TINY_DIFFUSION, "algorithm": "fedddpm+", "num-server-rounds": 1, "local-steps": 1,
                             "batch-size": 8, "warmup-steps": 1, "quicktest-reference": "clients",
                             "central-eval": True, "cache-dir": str(tmp_path / "cache"),
                             "results-dir": str(tmp_path / "results"), "run-name": "run"})
    grid = InProcessGrid(3, raw, node_config=lambda i: {"dataset-path": str(sites[i].path), "name": sites[i].name})
    summary = run_federation(raw, grid)
    rounds = [json.loads(line) for line in (tmp_path / "results" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "ok" and summary["stop-reason"] == "last-round" and np.isfinite(summary["final-fid"])
    assert rounds[0]["phase"] == "warmup" and np.isfinite(rounds[1]["quicktest-fid"])
    # asked once, by the first that needs it (round 1's QuickTest, before the auxiliary set's FID is recorded)
    assert [r["fid-reference-nodes"] for r in rounds if "fid-reference-nodes" in r] == [3]
    assert len([m for m in grid.sent if m.metadata.message_type == "query.fid_stats"]) == 3


def test_the_diffusion_task_on_the_sites_folders_needs_an_extractor_without_server_data():
    from tests.diffusion_tiny import TINY_DIFFUSION

    assert _cfg(algorithm="fedddpm", **TINY_DIFFUSION).fid_features == "random"  # auto, with partition = node
    assert _cfg(algorithm="fedddpm+", **TINY_DIFFUSION, **{"fid-features": "inception"}).fid_features == "inception"
    with pytest.raises(ConfigError, match="'fid-features' = 'classifier'.*the server.*holds none"):
        _cfg(algorithm="fedddpm", **{**TINY_DIFFUSION, "fid-features": "classifier"})
