"""Adding a built-in algorithm is its modules and its row, nothing else (issue 63, Deliver 4).

In a scratch copy of the tree (the files git knows, tracked or not ignored; no .venv) this adds FedProx-half, a
FedProx variant whose nodes pull towards the global model at half the message's "proximal-mu": its strategy class
(a module of server_app/strategies/), its client rule (a module of client_app/) and its row in
common/algorithm_table.py, which names its settings group and declares its paper's rule (`PaperRule`), then runs
what a developer runs, `python -m fedsynth.algorithm_docs --write`, and the suite's checks derived from the table,
in that copy, with this interpreter: the docs' generated sections (tests/test_algorithm_docs.py,
test_derived_lists.py), the table's resolution on both sides (test_algorithms.py), the paper rules and the
defaults (test_paper_rule_defaults.py), the strategy listing and sizes (test_strategy_size.py), the public names
(test_public_names.py), the server families the start() tests run (test_flower_start.py), each class's typed and
documented parameters (test_flower_conventions.py) and the layering of common/ (test_layering.py's checks of
common/ and the apps; its circle check is left out while server_app/strategies' collaborators import their owner
class under TYPE_CHECKING, which it counts). They pass with no other edit. Without `--write` the docs check names
the stale pages, a row whose modules are missing fails the resolution test naming the module, and a row without
its paper rule fails the paper-rule test naming the row, so the checks can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DERIVED_CHECKS = ["tests/test_algorithm_docs.py", "tests/test_derived_lists.py", "tests/test_algorithms.py",
                  "tests/test_paper_rule_defaults.py", "tests/test_strategy_size.py", "tests/test_public_names.py",
                  "tests/test_layering.py::test_common_imports_neither_app_nor_the_drivers",
                  "tests/test_layering.py::test_the_apps_do_not_import_the_drivers",
                  "tests/test_layering.py::test_common_packages_import_only_downward",
                  "tests/test_layering.py::test_every_common_module_is_in_a_floor_or_a_base_module",
                  "tests/test_flower_start.py::test_the_cases_cover_every_server_rule",
                  "tests/test_flower_conventions.py::"
                  "test_every_parameter_of_every_public_strategy_is_typed_and_documented"]

SERVER_MODULE = '''"""FedProx-half: FedProx's server; its nodes take half the proximal weight (a scratch algorithm)."""

from server_app.strategies.node_rules import FedProx
from server_app.strategies.parameters import documented


@documented
class FedProxHalf(FedProx):
    """FedProx-half: FedAvg on the server; nodes add the proximal term mu/4 ||w - w_t||^2, reading mu from the
    train config's "proximal-mu".
    """
'''

CLIENT_MODULE = '''"""FedProx-half's client rule: FedProx's local steps at half the message's proximal weight."""

from client_app.rules import train_fedprox
from client_app.training import LocalJob, LocalResult


def fedprox_half_update(job: LocalJob) -> LocalResult:
    """FedProx-half client: cross-entropy + (mu/4)||w - w_global||^2, mu the train config's "proximal-mu"."""
    result = train_fedprox(job.model, job.batches(), mu=0.5 * float(job.setting("proximal-mu")),
                           optimizer=job.optimizer, loss_fn=job.loss_fn)
    return LocalResult(result.train_loss, result.num_steps, metrics=result.metrics)
'''

ROW_WITHOUT_RULE = ('    "fedprox-half": Algorithm("fedavg", settings=_G + "FedProxSettings",\n'
                    '                              strategy=_S + "fedprox_half:FedProxHalf",\n'
                    '                              client="client_app.fedprox_half:fedprox_half_update"),\n')
# its paper's rule: what its settings group does not say (the server step, where its mean comes from, the source)
ROW = ROW_WITHOUT_RULE.removesuffix("),\n") + (
    ',\n                              rule=PaperRule(_FEDAVG_STEP, _SAMPLE_WEIGHTS, "Li et al., 2020, with mu / 2 on '
    'the nodes (a scratch variant)")),\n')


def scratch_copy(target: Path) -> Path:
    """The tree's files (git ls-files: tracked, and untracked ones not ignored) copied under `target`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not name.startswith(".venv/"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def add_row(tree: Path, row: str = ROW) -> None:
    """`row`, last in the table's built-in rows (`_ROWS`)."""
    table = tree / "common" / "algorithm_table.py"
    lines = table.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("_ROWS: dict[str, Algorithm] = {"))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}\n")
    table.write_text("".join(lines[:end] + [row] + lines[end:]))


def add_modules(tree: Path) -> None:
    (tree / "server_app" / "strategies" / "fedprox_half.py").write_text(SERVER_MODULE)
    (tree / "client_app" / "fedprox_half.py").write_text(CLIENT_MODULE)


def run_in(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """`python *args` in `tree`, importing fedsynth from it (this venv's packages beside it)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=600)


def pytest_in(tree: Path, *files: str) -> subprocess.CompletedProcess:
    return run_in(tree, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", *files)


def test_a_builtin_added_as_its_modules_and_its_row_passes_the_derived_checks(tmp_path) -> None:
    tree = scratch_copy(tmp_path / "tree")
    add_modules(tree)
    add_row(tree)
    listed = run_in(tree, "-c", "from fedsynth import strategies; from server_app.registry import SERVER_STRATEGIES; "
                    "print(SERVER_STRATEGIES['fedprox-half'].__name__, 'FedProxHalf' in strategies.__all__)")
    assert listed.stdout.split() == ["FedProxHalf", "True"], listed.stderr
    stale = run_in(tree, "-m", "fedsynth.algorithm_docs", "--check")  # the row, before the developer's --write
    assert stale.returncode == 1 and {"README.md", "docs/algorithms.md", "docs/library.md"} <= {
        line.split(":")[0] for line in stale.stderr.splitlines()}, stale.stderr
    assert run_in(tree, "-m", "fedsynth.algorithm_docs", "--write").returncode == 0
    assert "`fedprox-half`" in (tree / "README.md").read_text()
    assert "| `FedProxHalf` | `fedprox-half` |" in (tree / "docs" / "library.md").read_text()
    rules = (tree / "docs" / "algorithms.md").read_text()  # its paper rule, its default from its settings group
    assert "| `fedprox-half` | weighted (McMahan et al., 2017" in rules, rules[-3000:]
    assert "`proximal-mu` = 0.01 | Li et al., 2020, with mu / 2" in rules
    done = pytest_in(tree, *DERIVED_CHECKS)
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_row_without_its_modules_fails_the_derived_checks(tmp_path) -> None:
    tree = scratch_copy(tmp_path / "tree")
    add_row(tree)
    done = pytest_in(tree, "tests/test_algorithms.py")
    assert done.returncode != 0
    assert "fedprox_half" in done.stdout + done.stderr


def test_the_row_without_its_paper_rule_fails_the_paper_rule_check(tmp_path) -> None:
    tree = scratch_copy(tmp_path / "tree")
    add_modules(tree)
    add_row(tree, ROW_WITHOUT_RULE)
    done = pytest_in(tree, "tests/test_paper_rule_defaults.py")
    assert done.returncode != 0
    assert "fedprox-half" in done.stdout + done.stderr
