"""What the docs' generated algorithm lists say, checked against the algorithm table.

The README's and docs/algorithms.md's families tables and docs/library.md's "What each strategy sends and
expects" are written by fedsynth/algorithm_docs.py (tests/test_algorithm_docs.py fails when a page's section is
not what it writes). Here: those tables name every row of common/algorithm_table.py and only rows, and library.md
has each strategy class's row naming the settings its nodes read (the rows' `rule_keys`) and the records and
metrics its reply carries (the class's `reply_records` and `reply_metrics`). The class count is the table's.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from common.algorithm_table import ALGORITHMS, COG_BASES
from common.algorithms.plugins import rule_keys
from common.algorithms.topology import TOPOLOGIES
from fedsynth import client, strategies
from fedsynth.algorithm_docs import SERVER_INPUTS, SHARED_PARAMETERS, client_functions, strategy_classes

ROOT = Path(__file__).resolve().parent.parent
STRATEGY_NAMES = sorted({row.strategy_name for row in ALGORITHMS.values()})
BASE_ROWS = [name for name, row in ALGORITHMS.items() if not (row.with_cog and name.endswith("+cog"))]


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])])  # an escaped \| stays
    return rows


def _names(cell: str) -> set[str]:
    """The algorithm-like names a cell writes in backticks (topologies and the `X+cog` pattern left out)."""
    tokens = set(re.findall(r"`([a-z][a-z0-9+-]*)`", cell))
    return {token for token in tokens if token not in TOPOLOGIES and token != "X+cog"}


@pytest.mark.parametrize("page", ["README.md", "docs/algorithms.md"])
def test_the_algorithm_tables_name_every_row_and_only_rows(page) -> None:
    text = (ROOT / page).read_text()
    rows = _table(text, "| family | algorithms |")
    named = set().union(*(_names(row[1]) for row in rows))
    assert set(BASE_ROWS) <= named, sorted(set(BASE_ROWS) - named)
    assert named <= set(ALGORITHMS), sorted(named - set(ALGORITHMS))
    cog_cell = next(row[1] for row in rows if "fedcog" in row[1])
    spelled = {name for name in ALGORITHMS if name.endswith("+cog")} <= named
    assert spelled or re.search(r"`X\+cog` for X in " + ", ".join(f"`{base}`" for base in COG_BASES), cog_cell), cog_cell


def test_librarys_table_has_a_row_per_strategy_class_naming_what_it_sends_and_expects() -> None:
    rows = _table((ROOT / "docs/library.md").read_text(), "| class | `algorithm` |")
    by_class: dict[str, list[str]] = {}
    for row in rows:
        for name in re.findall(r"`(\w+)`", row[0]):
            by_class[name] = row
    assert sorted(by_class) == STRATEGY_NAMES
    assert sorted(name for row in rows for name in re.findall(r"`([a-z][\w+-]*)`", row[1])) == sorted(ALGORITHMS)
    for name in STRATEGY_NAMES:
        row, cls = by_class[name], getattr(strategies, name)
        keys = {key for algorithm in ALGORITHMS.values() if algorithm.strategy_name == name
                for key in rule_keys(algorithm)}
        assert keys <= set(re.findall(r"`([a-z][\w-]*)`", row[3])), (name, keys, row[3])
        replies = set(getattr(cls, "reply_records", {})) | set(getattr(cls, "reply_metrics", {}))
        assert replies <= set(re.findall(r"`([a-z][\w-]*)`", row[4])), (name, replies, row[4])


def test_fedsynth_strategies_exports_one_class_per_table_strategy() -> None:
    classes = [name for name in strategies.__all__
               if isinstance(getattr(strategies, name), type) and hasattr(getattr(strategies, name), "configure_train")]
    assert sorted(classes) == STRATEGY_NAMES


def test_librarys_replies_per_family_place_every_strategy_class_once() -> None:
    rows = _table((ROOT / "docs/library.md").read_text(), "| family | strategies | the reply |")
    named = [name for row in rows for name in re.findall(r"`([A-Z]\w*)`", row[1])]
    assert sorted(set(named) & set(STRATEGY_NAMES)) == STRATEGY_NAMES
    assert len([name for name in named if name in STRATEGY_NAMES]) == len(STRATEGY_NAMES)  # each in one family
    scaffold_row = next(row for row in rows if row[0] == "SCAFFOLD's")
    assert {"Scaffold", "FedGamma", "FedLESAMS"} <= set(re.findall(r"`(\w+)`", scaffold_row[1]))


def test_librarys_client_function_table_has_a_row_per_exported_train_function() -> None:
    exported = {name for name in client.__all__ if name.startswith("train_")} - {"train_steps", "train_reply"}
    assert set(client_functions()) == exported
    rows = _table((ROOT / "docs/library.md").read_text(), "| function | what it runs |")
    by_name = {row[0].strip("`"): row for row in rows}
    assert list(by_name) == list(client_functions())
    for name, function in client_functions().items():
        own = [p for p in inspect.signature(function).parameters if p not in SHARED_PARAMETERS]
        assert set(own) <= set(re.findall(r"`(\w+)`", by_name[name][2])), (name, own, by_name[name][2])
        needs = {SERVER_INPUTS[p] for p in own if p in SERVER_INPUTS}
        assert needs == set(re.findall(r"`([a-z][\w-]*)`", by_name[name][3])), (name, needs, by_name[name][3])


def test_own_datas_table_has_a_row_per_strategy_class_naming_what_its_nodes_send() -> None:
    rows = _table((ROOT / "docs/own-data.md").read_text(), "| class | `algorithm` | sent with every update")
    assert [row[0].strip("`") for row in rows] == [cls.__name__ for cls in strategy_classes()]
    assert sorted(name for row in rows for name in re.findall(r"`([a-z][\w+-]*)`", row[1])) == sorted(ALGORITHMS)
    for row, cls in zip(rows, strategy_classes()):
        replies = set(getattr(cls, "reply_records", {})) | set(getattr(cls, "reply_metrics", {}))
        assert replies <= set(re.findall(r"`([a-z][\w-]*)`", row[2])), (cls.__name__, replies, row[2])


@pytest.mark.parametrize("page", ["fedsynsam.md", "oledfl.md"])
def test_a_family_pages_rule_table_names_the_rows_it_documents_and_their_settings(page) -> None:
    rows = _table((ROOT / "docs" / page).read_text(), "| algorithm | client rule (`client` of its row) |")
    assert [row[0].strip("`") for row in rows] == [name for name, row in ALGORITHMS.items() if row.page == page]
    for row in rows:
        keys = set(rule_keys(ALGORITHMS[row[0].strip("`")]))
        assert keys == set(re.findall(r"`([a-z][\w-]*)`", row[2])), (row[0], keys, row[2])
