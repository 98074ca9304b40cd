"""A plugin with its own settings and its own server state (issue 63): FedAdam, which fedsynth does not ship.

The package is tests/plugin_fedadam/fedadam, copied outside the tree as tests/test_algorithm_plugins.py copies
FedNova. Its strategy class declares a settings group (`settings = FedAdamSettings`: `eta`, `beta_1`, `beta_2`,
`tau` for the server, `local_lr_scale` for the nodes) and its server state (`server_state = ("m", "v")`, Adam's
moments). Nothing in fedsynth names FedAdam; the test checks that

- its keys are run-config keys under its name ("fedadam.eta", ...), from the app's pyproject table or an
  override, refused naming the key when unknown, mistyped or out of range, on the server and on the node;
- they reach the strategy (its constructor parameters) and, for the node's key, the client rule, which reports
  the factor it trained with;
- it runs in fedsynth's in-process engine and on a loopback deployment;
- a 4-round run and a 2-round run resumed from its checkpoint for 2 more end with the same model bytes and the
  same moments (the checkpoint keeps them; without them the resumed Adam steps would differ).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from safetensors.numpy import load_file

from common.errors import ConfigError
from common.imports import ENV_VAR
from common.run.config import parse_run_config
from server_app.checkpoint import CHECKPOINT_FILE
from server_app.registry import SERVER_STRATEGIES
from tests.plugin_packages import forget, installed_package, permitted_imports

PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugin_fedadam" / "fedadam"
ADAM = "fedadam:FEDADAM"
SCALE_METRIC = "stat-fedadam-local-lr-scale"
# the app's pyproject table of the plugin's keys, as a user writes it (Flower flattens it to "fedadam.eta", ...)
PYPROJECT_TABLE = "\n[tool.flwr.app.config.fedadam]\neta = 0.05\nbeta-1 = 0.8\nlocal-lr-scale = 0.5\n"


@pytest.fixture(scope="module", autouse=True)
def permitted_plugins() -> Iterator[None]:
    """This host permits the plugin's package (common/imports.py; the loopback processes inherit it)."""
    yield from permitted_imports("fedadam")


@pytest.fixture(scope="module")
def plugin_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder outside the tree holding the `fedadam` package, on this process's sys.path."""
    yield from installed_package(PLUGIN_SOURCE, tmp_path_factory)


@pytest.fixture(scope="module")
def adam_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fedsynth's Flower app as `flwr run` ships it, its pyproject declaring the plugin's table of keys."""
    from fedsynth.loopback import app_copy

    app = app_copy(Path(__file__).resolve().parent.parent, tmp_path_factory.mktemp("adam-app") / "app")
    with open(app / "pyproject.toml", "a") as handle:
        handle.write(PYPROJECT_TABLE)
    return app


def _keys(tmp_path: Path, data_dir: Path, name: str, **extra: object) -> dict:
    return {"data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "results"),
            "run-name": name, "num-server-rounds": 2, "local-steps": 2, "batch-size": 16, "model": "mlp",
            "alpha": 0.3, "local-test-fraction": 0.0, "central-eval": False, "algorithm": ADAM, **extra}


def _rounds(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


# ----- the server's math, by hand ------------------------------------------------------------------------


def test_adam_step_against_a_hand_computed_value(plugin_root: Path) -> None:
    from fedadam.server import adam_step

    # m = 0.5*0 + 0.5*2 = 1, v = 0.75*0 + 0.25*4 = 1, w = 1 + 0.1 * 1 / (1 + 0) ... tau = 1: 1 + 0.1 * 1/2
    new, m, v = adam_step({"w": np.array([1.0], np.float32)}, {"w": np.array([2.0], np.float32)},
                          {"w": np.zeros(1, np.float32)}, {"w": np.zeros(1, np.float32)},
                          eta=0.1, beta_1=0.5, beta_2=0.75, tau=1.0)
    assert (float(m["w"][0]), float(v["w"][0])) == (1.0, 1.0)
    np.testing.assert_allclose(new["w"], [1.05], rtol=1e-7)
    assert new["w"].dtype == m["w"].dtype == v["w"].dtype == np.float32
    # a second step moves along the decayed moments: m = 0.5, v = 0.75 for a zero update
    _, m2, v2 = adam_step(new, {"w": np.zeros(1, np.float32)}, m, v, eta=0.1, beta_1=0.5, beta_2=0.75, tau=1.0)
    assert (float(m2["w"][0]), float(v2["w"][0])) == (0.5, 0.75)


# ----- declared server state: checkpointed and restored bitwise with no code in the class -----------------


def _moments_class() -> type:
    from fedsynth.strategies import FedAvg

    class Moments(FedAvg):
        server_state = ("m", "v", "unused")

    return Moments


def test_declared_state_goes_through_a_checkpoint_bitwise(tmp_path: Path) -> None:
    from server_app.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

    moments = _moments_class()
    rng = np.random.default_rng(0)
    strategy = moments()
    strategy.m = {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": np.array(rng.normal()),
                  "h": rng.normal(size=4).astype(np.float16)}
    strategy.v = {"w": np.asfortranarray(rng.random((3, 2)).astype(np.float32))}  # not C-ordered in memory
    state = strategy.state_dict()
    assert sorted(state["arrays"]) == ["server-state.m", "server-state.v"]
    cfg = parse_run_config({}, SERVER_STRATEGIES)
    save_checkpoint(tmp_path, cfg, Checkpoint(1, {"x": np.zeros(2, np.float32)}, state["arrays"], state["meta"], []))
    ckpt = load_checkpoint(tmp_path, cfg, {"x": np.zeros(2, np.float32)})
    restored = moments()
    restored.unused = {"stale": np.ones(1)}  # restored to what was saved: None
    restored.load_state_dict({"arrays": ckpt.state_arrays, "meta": ckpt.state_meta, "completed-rounds": 1})
    for name in ("m", "v"):
        before, after = getattr(strategy, name), getattr(restored, name)
        assert before.keys() == after.keys()
        for key, value in before.items():
            assert (after[key].dtype, after[key].shape, after[key].tobytes()) == (value.dtype, value.shape,
                                                                                 np.ascontiguousarray(value).tobytes())
    assert restored.unused is None and restored.completed_rounds == 1


def test_a_state_without_the_declared_names_is_refused_naming_them() -> None:
    from fedsynth.strategies import FedAvg

    declared = r"holds server state \[\] but Moments.server_state declares \['m', 'unused', 'v'\]"
    with pytest.raises(ValueError, match=declared):
        _moments_class()().load_state_dict(FedAvg().state_dict())
    strategy = _moments_class()()
    strategy.m = [np.zeros(2)]
    with pytest.raises(TypeError, match=r"Moments.m is declared in server_state, so it must hold a dict"):
        strategy.state_dict()


# ----- its settings: run-config keys under its name, checked on both sides --------------------------------


def test_its_keys_are_run_config_keys_under_its_name_and_reach_the_strategy(plugin_root: Path) -> None:
    from fedadam.server import FedAdam
    from server_app.registry import build_strategy

    cfg = parse_run_config({"algorithm": ADAM, "fedadam.eta": 0.03, "fedadam.tau": 0.01}, SERVER_STRATEGIES)
    assert (cfg.own_settings.eta, cfg.own_settings.tau, cfg.own_settings.beta_2) == (0.03, 0.01, 0.99)
    assert {"fedadam.eta": 0.03, "fedadam.local-lr-scale": 1.0}.items() <= cfg.as_dict().items()  # config.json
    strategy = build_strategy(cfg, [])
    assert type(strategy) is FedAdam and (strategy.eta, strategy.tau) == (0.03, 0.01)
    assert strategy.m is None and strategy.v is None
    # its node key travels under its whole key; the server's keys do not travel
    sent = strategy.client_config()
    assert sent["fedadam.local-lr-scale"] == 1.0 and not any(k in sent for k in ("fedadam.eta", "eta"))


BAD_SERVER_VALUES = {
    "unknown": ({"fedadam.etaa": 0.1}, r"unknown run config key\(s\): 'fedadam.etaa' \(did you mean 'fedadam.eta'\?\)"),
    "mistyped": ({"fedadam.eta": "fast"}, r"run config key 'fedadam.eta': expected a number, got 'fast'"),
    "nan": ({"fedadam.tau": math.nan}, r"run config key 'fedadam.tau': expected a finite number"),
    "range": ({"fedadam.beta-1": 1.5}, r"run config key 'fedadam.beta-1' = 1.5 is invalid; accepted: a number in"),
    "node-range": ({"fedadam.local-lr-scale": 0.0}, r"run config key 'fedadam.local-lr-scale' = 0.0 is invalid"),
}


@pytest.mark.parametrize("case", list(BAD_SERVER_VALUES))
def test_a_bad_setting_is_refused_when_the_run_config_is_parsed_naming_the_key(plugin_root: Path, case: str) -> None:
    keys, message = BAD_SERVER_VALUES[case]
    with pytest.raises(ConfigError, match=message):
        parse_run_config({"algorithm": ADAM, **keys}, SERVER_STRATEGIES)


def test_a_plugins_key_without_its_algorithm_is_refused() -> None:
    with pytest.raises(ConfigError, match="'fedadam.eta'.* algorithm 'fedavg' declares no settings of its own"):
        parse_run_config({"fedadam.eta": 0.1}, SERVER_STRATEGIES)


def test_its_keys_are_documented_by_the_config_docs(plugin_root: Path) -> None:
    from common.run.config_docs import own_settings_markdown

    table = own_settings_markdown(ADAM)
    assert table.startswith("## FedAdam: the server's Adam step on the mean update, and the nodes' learning-rate "
                            "factor (fedadam:FEDADAM)")
    for key in ("fedadam.eta", "fedadam.beta-1", "fedadam.beta-2", "fedadam.tau", "fedadam.local-lr-scale"):
        assert f"| `{key}` |" in table, key
    assert own_settings_markdown("fedavg") == "fedavg declares no settings of its own\n"


def test_its_paper_rule_is_checked_and_shown_as_a_built_ins(plugin_root: Path) -> None:
    """FedAdam declares its paper's rule with the type the built-in rows use; the config docs show it as
    docs/algorithms.md's paper-rule table shows a built-in's, its own keys with their declared defaults."""
    import common.algorithm_table
    import fedsynth.algorithm
    from common.run.config_docs import PAPER_RULE_HEADER, paper_rule_markdown
    from fedsynth.algorithm_docs import paper_rules_table

    assert fedsynth.algorithm.PaperRule is common.algorithm_table.PaperRule
    assert "PaperRule" in fedsynth.algorithm.__all__
    parse_run_config({"algorithm": ADAM}, SERVER_STRATEGIES)  # its rule passes the checks
    shown = paper_rule_markdown(ADAM)
    assert paper_rules_table().startswith(PAPER_RULE_HEADER + "\n")  # the built-ins' table, the same columns
    assert shown == (
        f"## Its paper's rule ({ADAM})\n\n{PAPER_RULE_HEADER}\n"
        "| `fedadam:FEDADAM` | weighted (FedAvg's sample-weighted mean, the paper's Delta_t) | m <- beta-1 m + "
        "(1 - beta-1) mean update, v <- beta-2 v + (1 - beta-2) its square; w + eta m / (sqrt(v) + tau) | "
        "`fedadam.eta` = 0.1, `fedadam.beta-1` = 0.9, `fedadam.beta-2` = 0.99, `fedadam.tau` = 0.001, "
        "`fedadam.local-lr-scale` = 1 | Reddi et al., 2021, Algorithm 2 (no bias correction) | the shared defaults |\n")


BAD_RULES = {
    "no key": ("PaperRule('step', 'weights', 'paper', ('server_lr',))",
               r"its rule's key 'server_lr' is no run-config key \(did you mean 'server-lr'\?\)"),
    "own key": ("PaperRule('step', 'weights', 'paper', ('fedadam.eta',))",
                r"its rule's key 'fedadam.eta' is a key of its own settings"),
    "keys as text": ("PaperRule('step', 'weights', 'paper', 'server-lr')", r"its rule's keys must be a tuple"),
    "no step": ("PaperRule('', 'weights', 'paper')", r"its rule's server_step must be non-empty text"),
    "not a rule": ("'Adam on the mean'", r"its rule must be a fedsynth.algorithm.PaperRule"),
}


def _rule_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str) -> str:
    """A module outside the tree whose row is FedAdam's halves with `rule` (Python source)."""
    (tmp_path / "ruledadam.py").write_text(
        "from fedsynth.algorithm import Algorithm, PaperRule\n"
        f"ROW = Algorithm(strategy='fedadam.server:FedAdam', client='fedadam.client:fedadam_update', rule={rule})\n")
    forget("ruledadam")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "fedadam ruledadam")
    return "ruledadam:ROW"


@pytest.mark.parametrize("case", sorted(BAD_RULES))
def test_a_bad_paper_rule_is_refused_when_the_run_config_is_parsed(plugin_root: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    rule, message = BAD_RULES[case]
    path = _rule_plugin(tmp_path, monkeypatch, rule)
    with pytest.raises(ConfigError, match=r"run config key 'algorithm' = 'ruledadam:ROW': " + message):
        parse_run_config({"algorithm": path}, SERVER_STRATEGIES)
    forget("ruledadam")


def test_a_paper_rules_shared_key_is_shown_with_its_declared_default(plugin_root: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from common.run.config_docs import paper_rule_markdown

    path = _rule_plugin(tmp_path, monkeypatch, "PaperRule('step', 'weights', 'paper', ('server-lr',))")
    parse_run_config({"algorithm": path}, SERVER_STRATEGIES)
    assert "| `server-lr` = 1, `fedadam.eta` = 0.1," in paper_rule_markdown(path)
    forget("ruledadam")
    path = _rule_plugin(tmp_path, monkeypatch, "None")  # a rule is optional
    parse_run_config({"algorithm": path}, SERVER_STRATEGIES)
    assert paper_rule_markdown(path) == "ruledadam:ROW declares no paper rule\n"
    forget("ruledadam")


def test_a_constructor_that_forwards_kwargs_is_refused_naming_the_class(plugin_root: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The `**kwargs` trap with a settings group: a hand-written constructor that forwards the rest is refused
    when the run config is parsed; the constructor fedsynth generates from the group names every parameter."""
    (tmp_path / "forwardingadam.py").write_text(
        "from fedsynth.algorithm import Algorithm\n"
        "from fedadam.server import FedAdam\n"
        "class ForwardingAdam(FedAdam):\n"
        "    def __init__(self, *, eta: float = 0.1, **kwargs):\n"
        "        super().__init__(eta=eta, **kwargs)\n"
        "ROW = Algorithm(strategy='forwardingadam:ForwardingAdam', client='fedadam.client:fedadam_update')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "fedadam forwardingadam")
    with pytest.raises(ConfigError, match=r"ForwardingAdam's constructor takes \*\*kwargs"):
        parse_run_config({"algorithm": "forwardingadam:ROW"}, SERVER_STRATEGIES)
    forget("forwardingadam")


def test_a_constructor_that_leaves_out_a_setting_is_refused_naming_it(plugin_root: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-written constructor that does not take a field of the group would run at its default whatever the
    run config says: refused when the run config is parsed, naming the class and the fields."""
    (tmp_path / "partialadam.py").write_text(
        "from fedsynth.algorithm import Algorithm\n"
        "from fedsynth.strategies import FedAvg\n"
        "from fedadam.settings import FedAdamSettings\n"
        "class PartialAdam(FedAvg):\n"
        "    settings = FedAdamSettings\n"
        "    def __init__(self, *, eta: float = 0.1, server_lr: float = 1.0):\n"
        "        super().__init__(server_lr=server_lr)\n"
        "        self.eta = eta\n"
        "ROW = Algorithm(strategy='partialadam:PartialAdam', client='fedadam.client:fedadam_update')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "fedadam partialadam")
    with pytest.raises(ConfigError, match=r"PartialAdam's constructor does not take beta_1, beta_2, tau, "
                                          r"local_lr_scale of its settings group FedAdamSettings"):
        parse_run_config({"algorithm": "partialadam:ROW", "partialadam.eta": 0.2}, SERVER_STRATEGIES)
    forget("partialadam")


def _node_train(raw: dict, config: dict) -> Message:
    """fedsynth's ClientApp on one train message (the run's seeded model, `config`) on partition 0 of 2."""
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import app as client_app
    from common.records import model_weights, to_record
    from common.run.task import make_model

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    content = RecordDict({"arrays": to_record(model_weights(make_model(cfg, seeded=True))),
                          "config": ConfigRecord(config)})
    context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, "num-partitions": 2},
                      state=RecordDict(), run_config=dict(raw))
    return client_app(Message(content, dst_node_id=1000, message_type=MessageType.TRAIN), context)


@pytest.mark.parametrize(("value", "error", "message"), [
    (-1.0, ConfigError, r"train message refused: run config key 'fedadam.local-lr-scale' = -1.0 is invalid"),
    ("abc", ConfigError, r"train message refused: run config key 'fedadam.local-lr-scale': expected a number"),
    (math.inf, ConfigError, r"train message refused: run config key 'fedadam.local-lr-scale': expected a finite"),
    (math.nan, ConfigError, r"train message refused: run config key 'fedadam.local-lr-scale': expected a finite"),
    # hostile values (tests/test_hostile_own_settings.py has the run config's): refused naming the key, no crash
    (10**400, ConfigError, r"run config key 'fedadam.local-lr-scale': expected a finite number, got 1000.*characters"),
    ([0.5], ConfigError, r"run config key 'fedadam.local-lr-scale': expected a number, got \[0\.5\]"),
    (b"0.5", ConfigError, r"run config key 'fedadam.local-lr-scale': expected a number, got b'0\.5'"),
    (None, ValueError, r"lacks 'fedadam.local-lr-scale'"),
])
def test_the_node_refuses_a_bad_message_setting_naming_the_key(plugin_root: Path, tmp_path: Path,
                                                               tiny_data_dir: Path, value, error, message) -> None:
    from server_app.registry import train_config_of

    raw = _keys(tmp_path, tiny_data_dir, "node")
    config = train_config_of(parse_run_config(raw, SERVER_STRATEGIES), 1)
    assert config["fedadam.local-lr-scale"] == 1.0
    reply = _node_train(raw, {**config, "fedadam.local-lr-scale": 0.25})  # the message's factor, not the run's
    assert reply.content.metric_records["metrics"][SCALE_METRIC] == 0.25
    if value is None:
        del config["fedadam.local-lr-scale"]
    else:
        config["fedadam.local-lr-scale"] = value
    with pytest.raises(error, match=message):
        _node_train(raw, config)


# ----- the whole app: in-process engine, resume, loopback deployment -------------------------------------


def test_fedadam_runs_in_the_in_process_engine_with_its_pyproject_keys(plugin_root: Path, adam_app: Path,
                                                                       tmp_path: Path, tiny_data_dir: Path) -> None:
    from fedsynth.simulation import run_simulation

    keys = _keys(tmp_path, tiny_data_dir, "adam", **{"fedadam.eta": 0.04})  # an override of a key of the table
    folder = run_simulation(adam_app, keys, num_supernodes=2, cpus_per_client=1.0, engine="inprocess")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["algorithm"] == ADAM and summary["status"] == "ok", summary
    config = json.loads((folder / "config.json").read_text())
    assert {"fedadam.eta": 0.04, "fedadam.beta-1": 0.8, "fedadam.beta-2": 0.99,
            "fedadam.local-lr-scale": 0.5}.items() <= config.items()
    rounds = [r for r in _rounds(folder) if r.get("answered")]
    assert [r["answered"] for r in rounds] == [2, 2]
    assert all(r[SCALE_METRIC] == 0.5 for r in rounds)  # the table's node key reached both nodes' client rule


def _checkpoint_state(folder: Path) -> dict[str, np.ndarray]:
    arrays = load_file(str(folder / CHECKPOINT_FILE))
    return {k: v for k, v in arrays.items() if k.startswith("state/server-state.")}


def test_a_resumed_run_continues_adams_moments_bitwise(plugin_root: Path, tmp_path: Path,
                                                       tiny_data_dir: Path) -> None:
    """4 rounds in one go, and 2 rounds then a resume for 2 more: the same model bytes and the same m and v."""
    from fedsynth.inprocess import InProcessGrid, run_federation

    settings = {"fedadam.eta": 0.05, "fedadam.local-lr-scale": 0.5, "checkpoint-every": 1}
    full = _keys(tmp_path, tiny_data_dir, "full", **{**settings, "num-server-rounds": 4})
    run_federation(full, InProcessGrid(2, full))
    half = _keys(tmp_path, tiny_data_dir, "half", **settings)
    run_federation(half, InProcessGrid(2, half))
    after_two = _checkpoint_state(tmp_path / "results" / "half")
    assert sorted({k.split("/")[1] for k in after_two}) == ["server-state.m", "server-state.v"]
    resumed = {**half, "num-server-rounds": 4, "resume": True}
    run_federation(resumed, InProcessGrid(2, resumed))  # a fresh grid and a fresh strategy, from the checkpoint

    full_folder, resumed_folder = tmp_path / "results" / "full", tmp_path / "results" / "half"
    assert (full_folder / "model.safetensors").read_bytes() == (resumed_folder / "model.safetensors").read_bytes()
    expected, got = _checkpoint_state(full_folder), _checkpoint_state(resumed_folder)
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert value.dtype == got[name].dtype and value.tobytes() == got[name].tobytes(), name
    # the moments moved on after the resume: they are not the checkpoint's of round 2
    assert any(after_two[k].tobytes() != got[k].tobytes() for k in after_two)
    assert [r["round"] for r in _rounds(resumed_folder)][-4:] == [1, 2, 3, 4]


def test_a_resume_with_another_setting_of_the_plugin_is_refused(plugin_root: Path, tmp_path: Path,
                                                                tiny_data_dir: Path) -> None:
    from fedsynth.inprocess import InProcessGrid, run_federation
    from server_app.checkpoint import CheckpointError

    raw = _keys(tmp_path, tiny_data_dir, "changed", **{"checkpoint-every": 1, "num-server-rounds": 1})
    run_federation(raw, InProcessGrid(2, raw))
    changed = {**raw, "num-server-rounds": 2, "resume": True, "fedadam.eta": 0.5}
    with pytest.raises(CheckpointError, match="'fedadam.eta' is 0.1 in the checkpoint but 0.5 now"):
        run_federation(changed, InProcessGrid(2, changed))


@pytest.mark.slow
def test_fedadam_runs_on_a_loopback_deployment(plugin_root: Path, adam_app: Path, tmp_path: Path,
                                               tiny_data_dir: Path) -> None:
    """The SuperLink and SuperNodes find the package on their PYTHONPATH; Flower fuses the app's pyproject table
    ("fedadam.eta", ...) with the override `--run-config "fedadam.eta=0.04"`, which it takes because the table
    declares the key."""
    from fedsynth.loopback import LoopbackFederation

    keys = _keys(tmp_path, tiny_data_dir, "run", **{"node-wait-timeout": 120.0, "fedadam.eta": 0.04})
    config = " ".join(f"{key}={json.dumps(value) if isinstance(value, str) else str(value).lower()}"
                      for key, value in keys.items())
    env = {"OMP_NUM_THREADS": "1", ENV_VAR: "fedadam",
           "PYTHONPATH": os.pathsep.join([str(plugin_root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with LoopbackFederation(tmp_path / "federation", num_nodes=2, extra_env=env) as federation:
        result = federation.run(adam_app, config, timeout=300)
        logs = result.stdout[-3000:] + result.stderr[-2000:] + federation.log_tails()
    folder = tmp_path / "results" / "run"
    assert (folder / "summary.json").is_file(), logs
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["algorithm"] == ADAM and summary["status"] == "ok", logs
    assert json.loads((folder / "config.json").read_text())["fedadam.eta"] == 0.04, logs
    rounds = [r for r in _rounds(folder) if r.get("answered")]
    assert [r["answered"] for r in rounds] == [2, 2] and all(r[SCALE_METRIC] == 0.5 for r in rounds), logs
