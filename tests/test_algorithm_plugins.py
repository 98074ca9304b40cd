"""A user's algorithm as a plugin (issue 52): `algorithm = "package.module:Name"` runs FedNova, which fedsynth
does not ship, from a package outside the tree, in simulation and on a loopback deployment.

The package is tests/plugin_fednova/fednova, copied to a temporary folder that only `sys.path` (this process:
the in-process engine) or `PYTHONPATH` (the SuperLink's and SuperNodes' processes) names, as a user's package
would be: nothing in fedsynth is edited. docs/architecture.md's "An algorithm" checklist is what this test does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from common.errors import ConfigError
from common.imports import ENV_VAR
from common.run.config import parse_run_config
from server_app.registry import SERVER_STRATEGIES
from tests.plugin_packages import forget, installed_package, permitted_imports

PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugin_fednova" / "fednova"
NOVA = "fednova:FEDNOVA"


@pytest.fixture(scope="module", autouse=True)
def permitted_plugins() -> Iterator[None]:
    """This host permits the test's plugin packages (common/imports.py: the documented environment variable; the
    loopback deployment's SuperLink and SuperNodes inherit it)."""
    yield from permitted_imports("fednova badplugins nosuchpackage")


@pytest.fixture(scope="module")
def plugin_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder outside the tree holding the `fednova` package, on this process's sys.path."""
    yield from installed_package(PLUGIN_SOURCE, tmp_path_factory)


# ----- FedNova's server math, by hand -------------------------------------------------------------------


def test_fednova_step_against_a_hand_computed_value(plugin_root: Path) -> None:
    from fednova.server import fednova_step

    # p = (1/4, 3/4); d_1 = (w - w_1)/1 = (1, 0), d_2 = (w - w_2)/4 = (0, 0.5); tau_eff = 1/4 + 3 = 3.25;
    # w - tau_eff * (0.25, 0.375) = (1 - 0.8125, 2 - 1.21875)
    new = fednova_step({"w": np.array([1.0, 2.0], np.float32)},
                       [{"w": np.array([0.0, 2.0], np.float32)}, {"w": np.array([1.0, 0.0], np.float32)}],
                       taus=[1.0, 4.0], num_examples=[10, 30])
    np.testing.assert_allclose(new["w"], [0.1875, 0.78125], rtol=1e-7)
    assert new["w"].dtype == np.float32
    # FedAvg's weighted mean of the same models would be (0.75, 0.5): the normalisation matters
    halved = fednova_step({"w": np.array([1.0, 2.0])}, [{"w": np.array([0.0, 2.0])}, {"w": np.array([1.0, 0.0])}],
                          taus=[1.0, 4.0], num_examples=[10, 30], server_lr=0.5)
    np.testing.assert_allclose(halved["w"], [1 - 0.40625, 2 - 0.609375])


def test_fednova_with_equal_steps_is_fedavgs_weighted_mean(plugin_root: Path) -> None:
    from fednova.server import fednova_step

    rng = np.random.default_rng(0)
    global_weights = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)}
    local = [{k: v + rng.normal(size=v.shape).astype(np.float32) for k, v in global_weights.items()} for _ in range(3)]
    counts = [5, 17, 8]
    new = fednova_step(global_weights, local, taus=[7.0, 7.0, 7.0], num_examples=counts)
    for name in global_weights:
        mean = sum(n * w[name] for n, w in zip(counts, local)) / sum(counts)
        np.testing.assert_allclose(new[name], mean, rtol=1e-5, atol=1e-6)


# ----- the contract: loaded and checked up front --------------------------------------------------------


def test_the_plugin_resolves_on_both_sides(plugin_root: Path) -> None:
    from client_app.registry import client_update
    from fednova.client import fednova_update
    from fednova.server import FedNova
    from server_app.registry import build_strategy, strategy_class

    cfg = parse_run_config({"algorithm": NOVA}, SERVER_STRATEGIES)
    assert strategy_class(NOVA) is FedNova and client_update(cfg) is fednova_update
    strategy = build_strategy(cfg, [])
    assert type(strategy) is FedNova and strategy.server_lr == cfg.server_lr
    assert "stat-fednova-tau" in strategy._reply_contract()  # a first round of broken replies names it
    with pytest.raises(ConfigError, match="'cog'"):
        parse_run_config({"algorithm": NOVA, "cog": True}, SERVER_STRATEGIES)


BROKEN = {
    "missing_module": ("nosuchpackage.algo:X", "cannot import module 'nosuchpackage.algo' "
                                               r"\(ModuleNotFoundError"),
    "no_colon_half": ("badplugins:", "is not an import path"),
    "missing_name": ("badplugins:NOPE", "module 'badplugins' has no attribute 'NOPE'"),
    "wrong_type": ("badplugins:NOT_AN_ALGORITHM", "'NOT_AN_ALGORITHM' is a dict, not a fedsynth.algorithm.Algorithm"),
    "strategy_object": ("badplugins:OBJECT_STRATEGY", "its strategy must be an import path"),
    "strategy_missing": ("badplugins:MISSING_STRATEGY", "its strategy: module 'badplugins' has no attribute 'Nope'"),
    "strategy_not_a_class": ("badplugins:FUNCTION_STRATEGY", "is not a strategy class"),
    "client_not_callable": ("badplugins:CONSTANT_CLIENT", "its client 'badplugins:CONSTANT' is not a function"),
    "client_signature": ("badplugins:TWO_ARGUMENT_CLIENT", "must take one argument, the LocalJob"),
    "unknown_key": ("badplugins:UNKNOWN_KEY", "client_keys are run-config keys"),
    "forwarding": ("badplugins:FORWARDING", r"its strategy 'badplugins:Forwarding': Forwarding's constructor takes "
                   r"\*\*kwargs; .* would keep its parent's defaults"),
}


@pytest.fixture(scope="module")
def broken_plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = tmp_path_factory.mktemp("broken-plugins")
    (root / "badplugins.py").write_text(
        "from fedsynth.algorithm import Algorithm\n"
        "from fedsynth.strategies import FedAvg\n"
        "def update(job):\n    return None\n"
        "def two(job, other):\n    return None\n"
        "CONSTANT = 3\n"
        "NOT_AN_ALGORITHM = {'strategy': 'x'}\n"
        "OBJECT_STRATEGY = Algorithm(strategy=FedAvg, client='badplugins:update')\n"
        "MISSING_STRATEGY = Algorithm(strategy='badplugins:Nope', client='badplugins:update')\n"
        "FUNCTION_STRATEGY = Algorithm(strategy='badplugins:update', client='badplugins:update')\n"
        "CONSTANT_CLIENT = Algorithm(strategy='fedsynth.strategies:FedAvg', client='badplugins:CONSTANT')\n"
        "TWO_ARGUMENT_CLIENT = Algorithm(strategy='fedsynth.strategies:FedAvg', client='badplugins:two')\n"
        "UNKNOWN_KEY = Algorithm(strategy='fedsynth.strategies:FedAvg', client='badplugins:update',\n"
        "                        client_keys=('nova-rho',))\n"
        "NOT_FEDSYNTHS = Algorithm(strategy='flwr.serverapp.strategy:FedAvg', client='badplugins:update')\n"
        "class Forwarding(FedAvg):\n"
        "    def __init__(self, *, nova_rho: float = 0.1, **kwargs):\n"
        "        super().__init__(**kwargs)\n"
        "FORWARDING = Algorithm(strategy='badplugins:Forwarding', client='badplugins:update')\n"
    )
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))
    forget("badplugins")


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_plugin_is_a_config_error_naming_the_path(case: str, broken_plugins: None) -> None:
    path, message = BROKEN[case]
    with pytest.raises(ConfigError, match=f"run config key 'algorithm' = '{path}'.*{message}"):
        parse_run_config({"algorithm": path}, SERVER_STRATEGIES)


def test_a_flower_strategy_that_is_not_fedsynths_is_refused_before_the_run(broken_plugins: None,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from server_app.registry import build_strategy

    from server_app.app import serve

    with pytest.raises(ConfigError, match="'flwr' is not one this site permits"):  # flwr is not on this site's list
        parse_run_config({"algorithm": "badplugins:NOT_FEDSYNTHS"}, SERVER_STRATEGIES)
    monkeypatch.setenv(ENV_VAR, "badplugins flwr.serverapp.strategy")
    cfg = parse_run_config({"algorithm": "badplugins:NOT_FEDSYNTHS"}, SERVER_STRATEGIES)  # a Flower strategy class
    with pytest.raises(ConfigError, match="must subclass one of fedsynth.strategies' classes"):
        build_strategy(cfg, [])
    with pytest.raises(ConfigError, match="must subclass"):  # before the results folder or the grid is touched
        serve(None, cfg)  # type: ignore[arg-type]


def test_an_unknown_name_lists_the_plugin_form() -> None:
    with pytest.raises(ConfigError, match="package.module:Name"):
        parse_run_config({"algorithm": "fednova"}, SERVER_STRATEGIES)


# ----- the whole app: simulation and deployment ---------------------------------------------------------


def _keys(tmp_path: Path, data_dir: Path, name: str, **extra: object) -> dict:
    return {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
            "run-name": name, "num-server-rounds": 1, "batch-size": 32, "model": "mlp", "alpha": 0.3,
            "local-test-fraction": 0.0, "central-eval": False, **extra}


def _simulate(tmp_path: Path, data_dir: Path, name: str, **extra: object) -> Path:
    from fedsynth.simulation import find_app_dir, run_simulation

    return run_simulation(find_app_dir(), _keys(tmp_path, data_dir, name, **extra), num_supernodes=2,
                          cpus_per_client=1.0, engine="inprocess")


def _model(folder: Path) -> dict[str, np.ndarray]:
    return load_file(str(folder / "model.safetensors"))


def _rounds(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_fednova_runs_in_simulation(plugin_root: Path, tmp_path: Path, tiny_data_dir: Path) -> None:
    """One epoch per node on unequal partitions: unequal tau_i, reported by the plugin's client rule, so the plugin's
    server step gives another model than FedAvg's."""
    nova = _simulate(tmp_path, tiny_data_dir, "nova", algorithm=NOVA, **{"local-steps": 0, "local-epochs": 1})
    avg = _simulate(tmp_path, tiny_data_dir, "avg", algorithm="fedavg", **{"local-steps": 0, "local-epochs": 1})
    summary = json.loads((nova / "summary.json").read_text())
    assert summary["algorithm"] == NOVA and summary["status"] == "ok", summary
    nodes = json.loads((nova / "nodes.json").read_text())
    counts = [node["num-train-examples"] for node in (nodes if isinstance(nodes, list) else nodes["nodes"])]
    taus = [-(-n // 32) for n in counts]
    assert len(set(taus)) == 2, counts  # the partitions differ, so the nodes' step counts do
    (round_1,) = [r for r in _rounds(nova) if r["round"] == 1]
    assert round_1["answered"] == 2
    assert (round_1["stat-fednova-tau"], round_1["stat-fednova-tau-max"]) == (np.mean(taus), max(taus))
    # the same local models (the same seeded batches, plain SGD), aggregated differently; with equal tau_i the two
    # agree (test_fednova_with_equal_steps_is_fedavgs_weighted_mean)
    assert any(not np.allclose(_model(nova)[k], _model(avg)[k], atol=1e-4) for k in _model(avg))


@pytest.mark.slow
def test_fednova_runs_on_a_loopback_deployment(plugin_root: Path, tmp_path: Path, tiny_data_dir: Path,
                                               flower_app: Path) -> None:
    """The SuperLink's and SuperNodes' processes find the package on their PYTHONPATH, as a host that has it
    installed would, and each host permits it (`FEDSYNTH_ALLOWED_IMPORTS`, common/imports.py); the app that `flwr run` ships is fedsynth's, unedited."""
    from fedsynth.loopback import LoopbackFederation

    keys = _keys(tmp_path, tiny_data_dir, "run", algorithm=NOVA, **{"local-steps": 0, "local-epochs": 1,
                                                                    "node-wait-timeout": 120.0})
    config = " ".join(f"{key}={json.dumps(value) if isinstance(value, str) else str(value).lower()}"
                      for key, value in keys.items())
    env = {"OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(plugin_root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env[ENV_VAR] = "fednova"  # the hosts' setting: the SuperLink's and the SuperNodes' processes inherit it
    with LoopbackFederation(tmp_path / "federation", num_nodes=2, extra_env=env) as federation:
        result = federation.run(flower_app, config, timeout=300)
        logs = result.stdout[-3000:] + result.stderr[-2000:] + federation.log_tails()
    folder = tmp_path / "results" / "run"
    assert (folder / "summary.json").is_file(), logs
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["algorithm"] == NOVA and summary["status"] == "ok", logs
    (round_1,) = [r for r in _rounds(folder) if r["round"] == 1]
    assert round_1["answered"] == 2 and round_1["stat-fednova-tau"] > 0, logs
