"""A user's plugin package as the plugin tests install it: outside the tree, permitted, forgotten afterwards.

tests/test_algorithm_plugins.py (FedNova) and tests/test_plugin_own_settings_and_state.py (FedAdam) each copy a
package of tests/ to a temporary folder that only `sys.path` names, as a user's package would be, and permit it
on this host (common/imports.py's environment variable, which the loopback deployments' processes inherit). Their
module-scoped fixtures `yield from` these generators.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.imports import ENV_VAR


def forget(prefix: str) -> None:
    """Drop package `prefix` and its submodules from `sys.modules`, so the next import reads them anew."""
    for name in [name for name in sys.modules if name == prefix or name.startswith(prefix + ".")]:
        del sys.modules[name]


def permitted_imports(packages: str) -> Iterator[None]:
    """While suspended, this host permits `packages` (space-separated); afterwards the variable is as before."""
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = packages
    yield
    if before is None:
        del os.environ[ENV_VAR]
    else:
        os.environ[ENV_VAR] = before


def installed_package(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """While suspended, package folder `source` is copied into a fresh folder outside the tree, on `sys.path`;
    yields that folder. Afterwards the folder leaves `sys.path` and the package `sys.modules`."""
    root = tmp_path_factory.mktemp("user-packages")
    shutil.copytree(source, root / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    forget(source.name)
