"""What a warm task runs (fedsynth/warm_clientapp/task.py): Flower's `flwr-clientapp`, without re-extracting an
installed FAB, and with Flower's own install for anything new.

The FABs are real ones, built by Flower from small app folders, and installed by Flower's own
`install_from_fab` into a `FLWR_HOME` of the test's own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk, get_fab_filename
from flwr.cli.install import install_from_fab
from flwr.common.config import get_fab_config

ROOT = Path(__file__).resolve().parent.parent
TASK_PY = ROOT / "fedsynth" / "warm_clientapp" / "task.py"
SERVER_PY = ROOT / "fedsynth" / "warm_clientapp" / "server.py"


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


task = load(TASK_PY, "warm_task_under_test")


def make_fab(folder: Path, version: str, body: str) -> bytes:
    """A Flower app folder with one module, built into a FAB by Flower."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "tinyapp"
        version = "{version}"

        [tool.flwr.app]
        publisher = "tests"

        [tool.flwr.app.components]
        serverapp = "tinyapp.server:app"
        clientapp = "tinyapp.client:app"

        [tool.flwr.app.config]
        rounds = 1
    """))
    (folder / "tinyapp").mkdir()
    (folder / "tinyapp" / "__init__.py").write_text("")
    (folder / "tinyapp" / "client.py").write_text(body)
    return build_fab_from_disk(folder)


@pytest.fixture
def flwr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flwr-home"
    monkeypatch.setenv("FLWR_HOME", str(home))
    return home


class CountingInstall:
    """Flower's `install_from_fab`, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fab_file, install_dir=None, skip_prompt=False):
        self.calls += 1
        return install_from_fab(fab_file, install_dir=install_dir, skip_prompt=skip_prompt)


def test_an_app_not_installed_yet_is_installed_by_flowers_own_function(tmp_path, flwr_home):
    fab = make_fab(tmp_path / "app", "1.0.0", "VERSION = 1\n")
    assert task.installed_app_dir(fab) is None
    flower = CountingInstall()
    folder = task.install_once(flower)(fab, skip_prompt=True)
    assert flower.calls == 1
    assert folder.parent == flwr_home / "apps" and (folder / "tinyapp" / "client.py").read_text() == "VERSION = 1\n"


def test_an_installed_app_is_the_folder_flower_returns_without_calling_flower_again(tmp_path, flwr_home):
    fab = make_fab(tmp_path / "app", "1.0.0", "VERSION = 1\n")
    flowers_folder = install_from_fab(fab, skip_prompt=True)
    assert task.installed_app_dir(fab) == flowers_folder
    flower = CountingInstall()
    install = task.install_once(flower)
    assert install(fab, skip_prompt=True) == flowers_folder == install_from_fab(fab, skip_prompt=True)
    assert flower.calls == 0


def test_a_changed_app_or_a_new_version_is_installed_fresh_next_to_the_old_one(tmp_path, flwr_home):
    old = make_fab(tmp_path / "old", "1.0.0", "VERSION = 1\n")
    changed = make_fab(tmp_path / "changed", "1.0.0", "VERSION = 2\n")  # same version, other bytes: other hash
    newer = make_fab(tmp_path / "newer", "1.1.0", "VERSION = 3\n")
    flower = CountingInstall()
    install = task.install_once(flower)
    folders = [install(fab, skip_prompt=True) for fab in (old, changed, newer, old)]
    assert flower.calls == 3  # the last `old` was installed already
    assert len(set(folders[:3])) == 3 and folders[3] == folders[0]
    assert [(f / "tinyapp" / "client.py").read_text() for f in folders[:3]] == [f"VERSION = {v}\n" for v in (1, 2, 3)]


def test_calls_other_than_run_clientapps_go_to_flower_unchanged(tmp_path, flwr_home):
    """`flwr install` (a FAB file, asking before a reinstall) and another install folder are never short-cut."""
    fab = make_fab(tmp_path / "app", "1.0.0", "VERSION = 1\n")
    installed = install_from_fab(fab, skip_prompt=True)
    flower = CountingInstall()
    install = task.install_once(flower)
    elsewhere = install(fab, install_dir=tmp_path / "elsewhere", skip_prompt=True)
    fab_path = tmp_path / get_fab_filename(get_fab_config(fab), hashlib.sha256(fab).hexdigest())
    fab_path.write_bytes(fab)
    from_file = install(fab_path, skip_prompt=True)
    assert flower.calls == 2
    assert elsewhere.parent == tmp_path / "elsewhere" / "apps" and from_file == installed


def test_the_warm_server_runs_the_task_module_under_a_name_no_app_module_can_shadow():
    """A FAB may have a top-level `task` module (Flower's templates name one so); ours must not be it."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SERVER_PY.parent)!r})
        sys.argv[0] = {str(SERVER_PY)!r}
        import importlib.util
        spec = importlib.util.spec_from_file_location("server_under_test", {str(SERVER_PY)!r})
        server = importlib.util.module_from_spec(spec); spec.loader.exec_module(server)
        server.load_task_module()
        module, _, function = server.ENTRY.partition(":")
        assert callable(getattr(sys.modules[module], function)), server.ENTRY
        assert "task" not in sys.modules and module != "task", module
        print(server.ENTRY)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fedsynth_warm_clientapp_task:run"
