"""A site imports only the packages it permits (common/imports.py): a run config's `algorithm` and `model` import
paths outside fedsynth's own packages, the run's Flower app and the site's list are refused before any import, on
the server and on a node, naming the site, the key and the path; a permitted module that raises SystemExit or
KeyboardInterrupt on import is refused naming its path, and `fedsynth run` says so (docs/own-data.md, "Which
packages a site imports")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict

from common.errors import ConfigError
from common.imports import ENV_VAR, NODE_KEY, SiteImports, import_attribute, node_imports, permitted, site_imports
from common.run.config import parse_run_config
from server_app.registry import SERVER_STRATEGIES

# a module whose import is the side effect: it writes a marker file, then (optionally) raises
MARKER_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
{tail}
X = 1
"""


def _forget(name: str) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


@pytest.fixture()
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder on sys.path (not a Flower app) holding modules that write a marker when imported; yields
    `make(name, tail="") -> marker path`."""
    root = tmp_path / "site-packages-of-someone"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(ENV_VAR, raising=False)
    made: list[str] = []

    def make(name: str, tail: str = "") -> Path:
        marker = tmp_path / f"{name}.imported"
        (root / f"{name}.py").write_text(MARKER_MODULE.format(marker=str(marker), tail=tail))
        made.append(name)
        return marker

    yield make
    for name in made:
        _forget(name)


def test_antigravity_is_refused_before_it_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    _forget("antigravity")
    with pytest.raises(ConfigError) as caught:
        parse_run_config({"algorithm": "antigravity:X"}, SERVER_STRATEGIES)
    text = str(caught.value)
    assert "this host" in text and "'algorithm'" in text and "'antigravity:X'" in text, text
    assert "not one this site permits" in text and NODE_KEY in text and ENV_VAR in text, text
    assert "antigravity" not in sys.modules


def test_the_server_refuses_a_module_outside_its_list_without_importing_it(packages) -> None:
    from server_app.app import main

    marker = packages("evilplugin")
    for key, path in (("algorithm", "evilplugin:X"), ("model", "evilplugin:make")):
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={key: path})
        with pytest.raises(ConfigError) as caught:
            main(None, context)  # refused while the run config is parsed: before the grid is used
        text = str(caught.value)
        assert text.startswith("the ServerApp: ") and f"'{key}'" in text and repr(path) in text, text
    assert not marker.exists() and "evilplugin" not in sys.modules


def _handshake(node_config: dict, run_config: dict) -> Message:
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import app

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config)
    return app(Message(RecordDict(), dst_node_id=7, message_type="query.handshake"), context)


def test_a_node_refuses_a_module_outside_its_list_without_importing_it(packages) -> None:
    marker = packages("evilplugin")
    for key, path in (("algorithm", "evilplugin:X"), ("model", "evilplugin:make")):
        with pytest.raises(ConfigError) as caught:
            _handshake({"partition-id": 0, "num-partitions": 2, "name": "site-a"}, {key: path})
        text = str(caught.value)
        assert text.startswith("node 7 (site-a): ") and f"'{key}'" in text and repr(path) in text, text
    assert not marker.exists() and "evilplugin" not in sys.modules


def test_another_nodes_list_does_not_permit_it_on_this_node(packages) -> None:
    """The list is the node's own: one node's `allowed-imports` leaves the next node's refusal standing."""
    marker = packages("plainmodule", tail="raise RuntimeError('imported on purpose')")
    with pytest.raises(ConfigError, match="cannot import module 'plainmodule'.*imported on purpose"):
        _handshake({"partition-id": 0, "num-partitions": 2, NODE_KEY: "plainmodule"}, {"model": "plainmodule:X"})
    marker.unlink()
    with pytest.raises(ConfigError, match="node 7: .*not one this site permits"):
        _handshake({"partition-id": 0, "num-partitions": 2}, {"model": "plainmodule:X"})
    assert not marker.exists()


@pytest.mark.parametrize("raised", ["SystemExit(3)", "KeyboardInterrupt()", "SystemExit(0)"])
def test_a_permitted_module_that_ends_the_process_on_import_is_refused_naming_it(packages, raised: str) -> None:
    packages("exitingplugin", tail=f"raise {raised}")
    for node_config in ({"partition-id": 0, "num-partitions": 2, NODE_KEY: "exitingplugin"},):
        with pytest.raises(ConfigError) as caught:
            _handshake(node_config, {"algorithm": "exitingplugin:X"})
        text = str(caught.value)
        assert "'exitingplugin:X'" in text and "cannot import module 'exitingplugin'" in text, text
        assert raised.split("(")[0] in text, text
    with site_imports(SiteImports("the ServerApp", ("exitingplugin",))):
        with pytest.raises(ConfigError, match=r"'exitingplugin:X'.*cannot import module 'exitingplugin' \("
                                              + raised.split("(")[0]):
            parse_run_config({"algorithm": "exitingplugin:X"}, SERVER_STRATEGIES)


def test_fedsynth_run_says_why_a_module_that_exits_on_import_stopped_it(packages, monkeypatch, capsys,
                                                                        tmp_path: Path) -> None:
    from fedsynth.cli import main
    from fedsynth.exit_codes import EXIT_BAD_INPUT

    marker = packages("exitingplugin", tail="raise SystemExit(3)")
    monkeypatch.setenv(ENV_VAR, "exitingplugin")
    repo = Path(__file__).resolve().parent.parent
    code = main(["run", "--engine", "inprocess", "--app-dir", str(repo), "--num-supernodes", "1", "--run-config",
                 f"algorithm='exitingplugin:X' results-dir='{tmp_path / 'results'}'"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "exitingplugin:X" in err and "SystemExit" in err, err
    assert marker.exists()  # permitted by the environment variable: imported, and its exit became a refusal


def test_the_environment_variable_and_the_node_config_list_packages_and_their_submodules(monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "mylab.models, other")
    site = node_imports(3, {NODE_KEY: "sitepkg  extra"})
    assert site.listed == ("sitepkg", "extra", "mylab.models", "other")
    assert permitted("sitepkg.nets", site) and permitted("mylab.models.small", site) and permitted("other", site)
    assert not permitted("mylab", site) and not permitted("mylab.other", site) and not permitted("sitepkgx", site)
    assert permitted("common.models.classifiers", site) and permitted("fedsynth.algorithm", SiteImports("x"))


@pytest.mark.parametrize("value, words", [
    ("../evil", "'../evil' is not a package name"),
    ("os;rm -rf", "'os;rm' is not a package name"),
    ("a" * 20000, "characters long"),
    (" ".join(f"p{i}" for i in range(300)), "lists 300 packages"),
    (5, "must be text"),
    ("mylab.", "'mylab.' is not a package name"),
])
def test_a_malformed_list_is_refused_naming_the_setting(monkeypatch, value, words: str) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match=f"node 3: node config key '{NODE_KEY}'") as caught:
        node_imports(3, {NODE_KEY: value})
    assert words in str(caught.value)
    if isinstance(value, str):
        monkeypatch.setenv(ENV_VAR, value)
        with pytest.raises(ConfigError, match=f"environment variable {ENV_VAR}"):
            node_imports(3, {})


@pytest.mark.parametrize("path", [".relative:X", "a/b:X", "os.path:join", "mod:a.b", "mod: X", "os:", ":X"])
def test_paths_that_are_no_import_path_or_leave_the_permitted_packages_are_refused(monkeypatch, path: str) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match="not an import path|not one this site permits"):
        import_attribute(path, "run config key 'model' = " + repr(path))


def test_a_package_inside_the_runs_flower_app_is_permitted_by_default(tmp_path: Path, monkeypatch) -> None:
    """Flower puts the app it installed from the FAB on sys.path; a package shipped inside it needs no setting,
    and the same package anywhere else does."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    app_dir, elsewhere = tmp_path / "app", tmp_path / "elsewhere"
    for folder in (app_dir, elsewhere):
        (folder / "shippedmodels").mkdir(parents=True)
        (folder / "shippedmodels" / "__init__.py").write_text("def make(**kwargs):\n    return 1\n")
    (app_dir / "pyproject.toml").write_text('[tool.flwr.app.components]\nserverapp = "server_app.app:app"\n')
    (elsewhere / "pyproject.toml").write_text('[project]\nname = "not-a-flower-app"\n')
    monkeypatch.syspath_prepend(str(elsewhere))
    with pytest.raises(ConfigError, match="not one this site permits"):
        import_attribute("shippedmodels:make", "run config key 'model'")
    monkeypatch.syspath_prepend(str(app_dir))
    try:
        assert import_attribute("shippedmodels:make", "run config key 'model'")() == 1
    finally:
        _forget("shippedmodels")
