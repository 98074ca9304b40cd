"""Run-config and node-config validation (common/run/config.py, client_app/app.py:node_settings)."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from client_app.app import node_settings
from client_app.registry import CLIENT_UPDATES
from common.run.config import (
    ConfigError,
    RunConfig,
    config_fields,
    key_name,
    parse_overrides,
    parse_run_config,
)
from server_app.registry import SERVER_STRATEGIES, decayed_lr

ROOT = Path(__file__).resolve().parents[1]

# (raw config, offending key). Each must raise ConfigError naming the key.
BAD_CONFIGS = [
    ({"algorithm": "fedsgd"}, "algorithm"),
    ({"algorithm": ""}, "algorithm"),
    ({"alpha": -0.5}, "alpha"),
    ({"alpha": 0}, "alpha"),
    ({"alpha": 0.0}, "alpha"),
    ({"fraction-train": 0}, "fraction-train"),
    ({"fraction-train": 0.0}, "fraction-train"),
    ({"fraction-train": 1.5}, "fraction-train"),
    ({"classes-per-client": 0}, "classes-per-client"),
    ({"classes-per-client": 11}, "classes-per-client"),
    ({"dataset": "cifar100", "classes-per-client": 101}, "classes-per-client"),
    ({"dataset": "cifar10", "model": "mlp"}, "model"),
    ({"dataset": "cifar100", "model": "mlp"}, "model"),
    ({"dataset": "imagenet"}, "dataset"),
    ({"partition": "quantity-skew"}, "partition"),
    ({"model": "vgg16"}, "model"),
    ({"batch-size": 0}, "batch-size"),
    ({"batch-size": -32}, "batch-size"),
    ({"lr": -1}, "lr"),
    ({"lr": 0}, "lr"),
    ({"momentum": 1.0}, "momentum"),
    ({"momentum": -0.1}, "momentum"),
    ({"local-test-fraction": 1.0}, "local-test-fraction"),
    ({"local-test-fraction": -0.1}, "local-test-fraction"),
    ({"num-server-rounds": 0}, "num-server-rounds"),
    ({"min-nodes": 0}, "min-nodes"),
    ({"device": "tpu"}, "device"),
    ({"device": "cuda:x"}, "device"),
    ({"device": "cuda:"}, "device"),
    ({"num-server-rounds": "ten"}, "num-server-rounds"),
    ({"batch-size": "32"}, "batch-size"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"lr": True}, "lr"),
    ({"alpha": "0.3"}, "alpha"),
    ({"central-eval": 1}, "central-eval"),
    ({"central-eval": "yes"}, "central-eval"),
    ({"dataset": 10}, "dataset"),
    ({"aggregation": "mean"}, "aggregation"),
    ({"lr-decay": 0}, "lr-decay"),
    ({"lr-decay": 1.01}, "lr-decay"),
    ({"run-name": "a/b"}, "run-name"),
    ({"run-name": ".."}, "run-name"),
    ({"server-lr": 0}, "server-lr"),
    ({"server-momentum": 1.0}, "server-momentum"),
    ({"weight-decay": -1e-4}, "weight-decay"),
    ({"proximal-mu": -0.01}, "proximal-mu"),
    ({"moon-mu": -1}, "moon-mu"),
    ({"moon-tau": 0}, "moon-tau"),
    ({"moon-projection-dim": 0}, "moon-projection-dim"),
    ({"sam-rho": -0.05}, "sam-rho"),
    ({"mofedsam-alpha": 1.5}, "mofedsam-alpha"),
    ({"local-epochs": 0}, "local-epochs"),
    ({"local-steps": -1}, "local-steps"),
    ({"max-failed-rounds": 0}, "max-failed-rounds"),
    ({"round-timeout": 0}, "round-timeout"),
    ({"node-wait-timeout": -5}, "node-wait-timeout"),
    ({"eval-every": -1}, "eval-every"),
    ({"alpha": float("nan")}, "alpha"),
    ({"fraction-train": float("nan")}, "fraction-train"),
    ({"gn-groups": 3}, "gn-groups"),
    ({"gn-groups": 0}, "gn-groups"),
    ({"matching-loss": "unnormalized"}, "matching-loss"),
    ({"topology": "random-push"}, "topology"),
    # the hostile probe's finds (benchmarks/results/hostile-probe.md): accepted before, then built or sized from
    ({"algorithm": "fedddpm", "aux-fraction": 1e300}, "aux-fraction"),
    ({"algorithm": "fedddpm", "diffusion-timesteps": 10**12}, "diffusion-timesteps"),
    ({"algorithm": "fedddpm", "image-size": 10**12}, "image-size"),
    ({"partition": "node", "dataset": "own", "image-channels": 1, "image-size": 16, "num-classes": 10**12},
     "num-classes"),
    ({"class-names": "cat,dog,cat"}, "class-names"),
]


@pytest.mark.parametrize("raw,key", BAD_CONFIGS, ids=[f"{k}={v!r}" for (r, k) in BAD_CONFIGS for v in [r.get(k)]])
def test_bad_config_names_the_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_run_config(raw, SERVER_STRATEGIES)
    assert f"'{key}'" in str(info.value), str(info.value)


def test_bad_config_table_is_large() -> None:
    assert len(BAD_CONFIGS) >= 20
    assert len({k for _, k in BAD_CONFIGS}) >= 20


def test_unknown_algorithm_lists_known_algorithms() -> None:
    with pytest.raises(ConfigError) as info:
        parse_run_config({"algorithm": "fedsgd"}, SERVER_STRATEGIES)
    for name in SERVER_STRATEGIES:
        assert name in str(info.value)
    assert "fedsgd" in str(info.value)


def test_bad_value_message_names_the_value_and_accepted_values() -> None:
    with pytest.raises(ConfigError) as info:
        parse_run_config({"aggregation": "mean"}, SERVER_STRATEGIES)
    message = str(info.value)
    assert "mean" in message and "weighted" in message and "median" in message


@pytest.mark.parametrize("unknown", [["bogus-key"], ["lr_decay"], ["zeta", "alpha2"]])
def test_unknown_key_is_listed(unknown: list[str]) -> None:
    raw = {key: 1 for key in unknown}
    with pytest.raises(ConfigError) as info:
        parse_run_config({**raw, "lr": 0.1}, SERVER_STRATEGIES)
    message = str(info.value)
    assert "unknown" in message
    for key in unknown:
        assert key in message
    assert "'lr'" not in message.split("known keys")[0]


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("key", ["lr", "weight-decay", "server-lr", "proximal-mu", "sam-rho"])
def test_infinite_values_are_rejected(key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        parse_run_config({key: float("inf")}, SERVER_STRATEGIES)


# ----- good configs ------------------------------------------------------------------


def test_defaults_parse() -> None:
    cfg = parse_run_config({}, SERVER_STRATEGIES)
    assert cfg == RunConfig()
    assert cfg.algorithm == "fedavg" and cfg.dataset == "fashion-mnist"
    assert parse_run_config({}, CLIENT_UPDATES) == cfg


def test_client_and_server_know_the_same_algorithms() -> None:
    assert set(SERVER_STRATEGIES) == set(CLIENT_UPDATES)
    for name in SERVER_STRATEGIES:
        task = {"model": "unet-small"} if "ddpm" in name else {}  # FedDDPM (issue 5) trains DDPMs only
        assert parse_run_config({"algorithm": name, **task}, CLIENT_UPDATES).algorithm == name


def test_ints_are_accepted_for_float_keys() -> None:
    cfg = parse_run_config({"lr": 1, "alpha": 2, "round-timeout": 30, "fraction-train": 1}, SERVER_STRATEGIES)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.alpha == 2.0 and isinstance(cfg.alpha, float)
    assert isinstance(cfg.round_timeout, float) and isinstance(cfg.fraction_train, float)


def test_integral_floats_are_accepted_for_int_keys_and_bool_strings() -> None:
    cfg = parse_run_config({"num-server-rounds": 5.0, "central-eval": "false", "save-model": "True"},
                           SERVER_STRATEGIES)
    assert cfg.num_server_rounds == 5 and isinstance(cfg.num_server_rounds, int)
    assert cfg.central_eval is False and cfg.save_model is True


def test_good_non_default_values() -> None:
    cfg = parse_run_config({
        "algorithm": "scaffold", "dataset": "cifar100", "model": "resnet18", "partition": "pathological",
        "classes-per-client": 100, "device": "cuda:1", "fraction-train": 0.1, "aggregation": "uniform",
        "local-test-fraction": 0.0, "momentum": 0.0, "lr-decay": 0.998, "run-name": "my-run",
    }, SERVER_STRATEGIES)
    assert cfg.classes_per_client == 100 and cfg.device == "cuda:1"
    assert decayed_lr(cfg.lr, cfg.lr_decay, 1) == pytest.approx(cfg.lr)
    assert decayed_lr(cfg.lr, cfg.lr_decay, 3) == pytest.approx(cfg.lr * 0.998**2)


def test_as_dict_round_trips() -> None:
    cfg = parse_run_config({"lr": 0.1, "algorithm": "moon"}, SERVER_STRATEGIES)
    again = parse_run_config(cfg.as_dict(), SERVER_STRATEGIES)
    assert again == cfg
    assert "num-server-rounds" in cfg.as_dict() and key_name("num_server_rounds") == "num-server-rounds"


def test_parse_overrides() -> None:
    assert parse_overrides('a=1 b="x" c=0.5 d=true') == {"a": 1, "b": "x", "c": 0.5, "d": True}
    assert parse_overrides("algorithm='fedprox' lr=0.01") == {"algorithm": "fedprox", "lr": 0.01}
    assert parse_overrides("dataset=cifar10") == {"dataset": "cifar10"}
    assert parse_overrides("") == {}
    with pytest.raises(ConfigError):
        parse_overrides("lr")


def test_parsed_overrides_validate() -> None:
    raw = parse_overrides("num-server-rounds=3 lr=1 aggregation='uniform' central-eval=false")
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    assert cfg.num_server_rounds == 3 and cfg.lr == 1.0 and cfg.aggregation == "uniform" and not cfg.central_eval


# ----- pyproject and README ----------------------------------------------------------


def _pyproject_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["tool"]["flwr"]["app"]["config"]


def test_pyproject_config_matches_runconfig_defaults() -> None:
    toml_config = _pyproject_config()
    defaults = {key_name(f.name): f.default for f in config_fields()}
    assert set(toml_config) == set(defaults), (
        f"only in pyproject: {sorted(set(toml_config) - set(defaults))}; "
        f"only in RunConfig: {sorted(set(defaults) - set(toml_config))}"
    )
    for key, default in defaults.items():
        assert toml_config[key] == default, key
        assert type(toml_config[key]) is type(default), f"{key}: {type(toml_config[key])} vs {type(default)}"
    assert parse_run_config(toml_config, SERVER_STRATEGIES) == RunConfig()


def test_every_field_has_a_default_and_meaning() -> None:
    for f in dataclasses.fields(RunConfig):
        assert f.default is not dataclasses.MISSING, f.name
        assert f.metadata.get("meaning"), f.name


def test_readme_mentions_every_key() -> None:
    readme = ROOT / "README.md"
    if not readme.is_file():
        pytest.skip("README.md not written yet")
    # the README's run-config table, or a docs/ page (docs/fedsynsam.md documents the FedSynSAM keys)
    text = readme.read_text() + "".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))
    missing = [key_name(f.name) for f in config_fields() if f"`{key_name(f.name)}`" not in text]
    assert not missing, f"README.md and docs/ lack `{missing}`"


# ----- node config -------------------------------------------------------------------


def context_with(node_config: dict) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


CPU_CFG = RunConfig(device="cpu")


def test_node_settings_good() -> None:
    node = node_settings(context_with({"partition-id": 2, "num-partitions": 3, "data-dir": "/data"}), CPU_CFG)
    assert node.partition_id == 2 and node.num_partitions == 3
    assert node.data_dir == "/data" and node.cache_dir == ""
    assert node.device.type == "cpu"


@pytest.mark.parametrize("node_config,key", [
    ({"num-partitions": 3}, "partition-id"),
    ({"partition-id": 0}, "num-partitions"),
    ({"partition-id": 3, "num-partitions": 3}, "partition-id"),
    ({"partition-id": 7, "num-partitions": 3}, "partition-id"),
    ({"partition-id": -1, "num-partitions": 3}, "partition-id"),
    ({"partition-id": "1", "num-partitions": 3}, "partition-id"),
    ({"partition-id": 1.0, "num-partitions": 3}, "partition-id"),
    ({"partition-id": True, "num-partitions": 3}, "partition-id"),
    ({"partition-id": 0, "num-partitions": "3"}, "num-partitions"),
    ({"partition-id": 0, "num-partitions": 0}, "num-partitions"),
])
def test_bad_node_config_names_the_key(node_config: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        node_settings(context_with(node_config), CPU_CFG)
    assert key in str(info.value)
