"""`dataset = "hf:<repo>"`: Hugging Face datasets through flwr-datasets, from a local copy (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from common.run.config import ConfigError, parse_run_config
from common.data.datasets import DatasetMissingError, dataset_info, load_dataset
from common.data.hf_datasets import HfSource, find_columns
from common.data.partition import PartitionSpec, load_client_data
from tests.hf_tiny import NUM_CLASSES, SIDE, tiny_image_dataset, write_parquet, write_saved

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def hf_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data-dir with the tiny dataset saved twice: `saved` (save_to_disk) and `pq` (parquet files)."""
    root = tmp_path_factory.mktemp("hf-data")
    write_saved(root / "saved")
    write_parquet(root / "pq")
    return root


def test_columns_are_found_from_features_or_taken_from_keys():
    features = tiny_image_dataset(num_train=4, num_test=2)["train"].features
    assert find_columns(features) == ("picture", "digit")
    assert find_columns(features, "picture", "digit") == ("picture", "digit")
    with pytest.raises(ValueError, match="hf-label-column"):
        find_columns(features, label_column="nope")


def test_palette_and_alpha_images_become_rgb_and_mixed_sizes_are_refused():
    from PIL import Image

    from common.data.hf_datasets import to_arrays

    palette = Image.new("P", (5, 4), color=3)
    rgba = Image.new("RGBA", (5, 4), color=(10, 20, 30, 40))
    x, y = to_arrays({"im": [palette, rgba], "lab": [1, 0]}, "im", "lab")
    assert x.shape == (2, 4, 5, 3) and x.dtype == np.uint8 and y.tolist() == [1, 0]
    assert x[1, 0, 0].tolist() == [10, 20, 30]
    with pytest.raises(ValueError, match="several shapes"):
        to_arrays({"im": [rgba, Image.new("RGB", (6, 4))], "lab": [0, 0]}, "im", "lab")


@pytest.mark.parametrize("repo", ["saved", "pq"])
def test_local_copy_loads_as_arrays_with_its_shape_and_classes(hf_data_dir, repo):
    info = dataset_info(f"hf:{repo}", hf_data_dir)
    assert (info.channels, info.height, info.width, info.num_classes) == (1, SIDE, SIDE, NUM_CLASSES)
    data = load_dataset(f"hf:{repo}", hf_data_dir)
    expected = tiny_image_dataset()
    assert data.x_train.shape == (240, SIDE, SIDE, 1) and data.x_train.dtype == np.uint8
    assert data.x_test.shape == (80, SIDE, SIDE, 1)
    np.testing.assert_array_equal(data.y_train, expected["train"]["digit"])
    np.testing.assert_array_equal(data.x_test[5, :, :, 0], np.asarray(expected["test"][5]["picture"]))


def test_partitions_come_from_federated_dataset_cover_the_train_split_and_are_cached(hf_data_dir, tmp_path):
    spec = PartitionSpec(dataset="hf:saved", partition="pathological", num_partitions=4, seed=3,
                         classes_per_client=2)
    clients = [load_client_data(spec, pid, str(hf_data_dir), str(tmp_path)) for pid in range(4)]
    assert sum(len(c.y_train) + len(c.y_test) for c in clients) == 240
    for client in clients:  # pathological with 2 classes per client
        assert len(set(client.y_train.tolist()) | set(client.y_test.tolist())) <= 2
    (folder,) = tmp_path.iterdir()
    assert sorted(p.name for p in folder.glob("client-*.npz")) == [f"client-{i}.npz" for i in range(4)]
    assert json.loads((folder / "spec.json").read_text())["dataset"] == "hf:saved"
    again = load_client_data(spec, 2, str(hf_data_dir), str(tmp_path))  # from the cache
    np.testing.assert_array_equal(again.x_train, clients[2].x_train)


def test_a_missing_dataset_offline_names_where_it_was_looked_for(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetMissingError) as err:
        load_dataset("hf:nobody/no-such-dataset", tmp_path)
    assert str(tmp_path / "nobody/no-such-dataset") in str(err.value) and "save_to_disk" in str(err.value)


def test_config_accepts_hf_names_and_the_column_keys():
    cfg = parse_run_config({"dataset": "hf:uoft-cs/cifar10", "hf-image-column": "img"}, ["fedavg"])
    assert cfg.hf_image_column == "img" and HfSource.from_name(cfg.dataset).repo == "uoft-cs/cifar10"
    with pytest.raises(ConfigError, match="hf:<repo>"):
        parse_run_config({"dataset": "hf:"}, ["fedavg"])


def test_the_default_run_name_of_an_hf_dataset_is_one_folder():
    from common.run.results import default_run_name

    name = default_run_name(parse_run_config({"dataset": "hf:uoft-cs/cifar10"}, ["fedavg"]))
    assert name.startswith("fedavg-hf-uoft-cs-cifar10-dirichlet-") and "/" not in name and ":" not in name


def _run_config(tmp_path: Path, data_dir: Path) -> dict:
    return {"dataset": '"hf:saved"', "model": '"mlp"', "data-dir": f'"{data_dir}"',
            "cache-dir": f'"{tmp_path / "cache"}"', "results-dir": f'"{tmp_path / "results"}"',
            "run-name": '"run"', "num-server-rounds": 2, "local-steps": 3, "batch-size": 16,
            "node-wait-timeout": 600.0}


def _check_run(folder: Path, nodes: int, logs: str = "") -> None:
    assert (folder / "summary.json").is_file(), logs
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r["answered"] == nodes for r in rounds[1:]), logs
    assert 0.0 <= rounds[-1]["central-accuracy"] <= 1.0
    assert json.loads((folder / "config.json").read_text())["dataset"] == "hf:saved"


@pytest.mark.slow
def test_a_federation_runs_from_a_local_hf_dataset_in_process(tmp_path, hf_data_dir):
    """`fedsynth run --engine inprocess`: the ClientApp code that reads the dataset is the same in every engine,
    and the loopback deployment below reads it in separate processes; Flower's simulation engine runs plain
    FedAvg in test_cli_reliability.py and the tiny study, without another Ray start-up here."""
    from fedsynth.cli import main

    values = _run_config(tmp_path, hf_data_dir)
    code = main(["run", "--app-dir", str(REPO), "--num-supernodes", "3", "--engine", "inprocess",
                 "--run-config", " ".join(f"{k}={v}" for k, v in values.items())])
    assert code == 0
    _check_run(tmp_path / "results" / "run", 3)


@pytest.mark.slow
def test_a_federation_runs_from_a_local_hf_dataset_in_the_loopback_deployment(tmp_path, hf_data_dir, flower_app,
                                                                             two_node_federation):
    values = {**_run_config(tmp_path, hf_data_dir), "node-wait-timeout": 120.0}
    result = two_node_federation.run(flower_app, " ".join(f"{k}={v}" for k, v in values.items()))
    logs = result.stdout[-3000:] + result.stderr[-2000:] + two_node_federation.log_tails()
    _check_run(tmp_path / "results" / "run", 2, logs)
