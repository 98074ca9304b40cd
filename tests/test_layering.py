"""The package layering: `common/` is shared by both apps and imports neither; drivers live in `fedsynth/`."""

import ast
from pathlib import Path

import networkx

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
    for path in sorted((ROOT / "common").rglob("*.py")):
        bad = {m for m in _imported_modules(path) if m.split(".")[0] in ("server_app", "client_app", "fedsynth")}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_the_apps_do_not_import_the_drivers():
    offenders = {}
    for app in ("server_app", "client_app"):
        for path in sorted((ROOT / app).rglob("*.py")):
            bad = {m for m in _imported_modules(path) if m.split(".")[0] == "fedsynth"}
            if bad:
                offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


PACKAGES = ("common", "client_app", "server_app", "fedsynth")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> networkx.DiGraph:
    """Every module of the four packages and the modules of them it imports, at any depth of its code.

    Imports inside functions and under `if TYPE_CHECKING:` count: a lazy import hides a circle from
    Python, not from a reader, and a type-only one still ties the lower module to the higher.
    `from pkg import mod` counts as an import of `pkg.mod` when that is a module.
    """
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = networkx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph.add_edges_from((name, target) for target in targets if target in modules and target != name)
    return graph


def test_the_import_graph_has_no_circle():
    circles = sorted(sorted(component) for component in networkx.strongly_connected_components(import_graph())
                     if len(component) > 1)
    assert circles == [], f"modules that import each other, directly or through others: {circles}"


def test_the_circle_check_sees_a_lazy_circle(tmp_path, monkeypatch):
    """The check above would fail on a circle made only of imports inside functions."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "common" / "low.py").write_text("def f():\n    from common.high import g\n")
    (tmp_path / "common" / "high.py").write_text("from common import low\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    components = [c for c in networkx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert components == [{"common.low", "common.high"}]


# common/'s floors, lowest first: a package imports only the base modules (common/*.py) and the packages below it.
COMMON_FLOORS = ("data", "algorithms", "uplink", "models", "run", "metrics")


def _floor(module: str) -> int:
    parts = module.split(".")
    return COMMON_FLOORS.index(parts[1]) + 1 if parts[1] in COMMON_FLOORS else 0  # 0: a base module


def test_common_packages_import_only_downward():
    graph = import_graph()
    upward = sorted(f"{a} -> {b}" for a, b in graph.edges
                    if a.startswith("common.") and b.startswith("common.") and _floor(b) > _floor(a))
    assert upward == [], f"imports from a lower floor of common/ to a higher one ({COMMON_FLOORS}): {upward}"


def test_every_common_module_is_in_a_floor_or_a_base_module():
    """A new module goes into the package of what it holds; the base holds only what every floor needs."""
    base = sorted(p.stem for p in (ROOT / "common").glob("*.py") if p.stem != "__init__")
    assert base == ["algorithm_table", "errors", "imports", "keys", "protocol", "records"]
    assert sorted(p.name for p in (ROOT / "common").iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(
        COMMON_FLOORS)
