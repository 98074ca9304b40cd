"""The package layering: `common/` is shared by both apps and imports neither; drivers live in `fedsynth/`."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_common_imports_neither_app_nor_the_drivers():
    offenders = {}
    for path in sorted((ROOT / "common").glob("*.py")):
        bad = {m for m in _imported_modules(path) if m.split(".")[0] in ("server_app", "client_app", "fedsynth")}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_apps_do_not_import_the_drivers():
    offenders = {}
    for app in ("server_app", "client_app"):
        for path in sorted((ROOT / app).rglob("*.py")):
            bad = {m for m in _imported_modules(path) if m.split(".")[0] == "fedsynth"}
            if bad:
                offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}
