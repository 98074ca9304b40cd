"""The docs' generated algorithm lists (fedsynth/algorithm_docs.py) are what the generator writes from the table.

README.md's and docs/algorithms.md's families tables, docs/algorithms.md's paper-rule table, docs/library.md's
"What each strategy sends and expects", replies per family and client functions, docs/own-data.md's "What a node
sends the server" and the rule tables of docs/fedsynsam.md and docs/oledfl.md stand between marker comments (every
section of `SECTIONS`: a row lost by hand in any of them fails here); a page whose section differs from what
`python -m fedsynth.algorithm_docs --write` would write fails here, so a new row of common/algorithm_table.py
cannot leave a list stale (tests/test_derived_lists.py checks what the sections say).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedsynth import algorithm_docs
from fedsynth.algorithm_docs import SECTIONS, begin_mark, end_mark, pages, stale_pages, with_section

ROOT = Path(__file__).resolve().parent.parent


def test_every_generated_section_is_what_the_generator_writes() -> None:
    assert stale_pages() == [], f"run {algorithm_docs.COMMAND}"


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: f"{s.page}:{s.name}")
def test_each_section_stands_once_between_its_marks(section) -> None:
    text = (ROOT / section.page).read_text()
    assert text.count(begin_mark(section.name)) == 1 and text.count(end_mark(section.name)) == 1
    assert text.index(begin_mark(section.name)) < text.index(end_mark(section.name))


def _copy_pages(tmp_path: Path) -> Path:
    for page in pages():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    return tmp_path


def test_the_check_names_a_page_whose_section_was_edited_by_hand(tmp_path) -> None:
    root = _copy_pages(tmp_path)
    library = root / "docs/library.md"
    row = next(line for line in library.read_text().splitlines() if line.startswith("| `FedProx` |"))
    library.write_text(library.read_text().replace(row + "\n", ""))  # a row lost by hand
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("`fedsam`, ", "", 1))  # a name lost by hand
    assert stale_pages(root) == ["README.md", "docs/library.md"]


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: f"{s.page}:{s.name}")
def test_a_row_lost_by_hand_in_any_section_makes_its_page_stale(tmp_path, section) -> None:
    root = _copy_pages(tmp_path)
    page = root / section.page
    text = page.read_text()
    body = text[text.index(begin_mark(section.name)):text.index(end_mark(section.name))]
    last_row = body.rstrip("\n").splitlines()[-1]
    assert last_row.startswith("| "), last_row
    page.write_text(text.replace(body, body.replace(last_row + "\n", "", 1)))
    assert stale_pages(root) == [section.page]


def test_a_page_without_its_marks_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks the marks"):
        with_section("# a page\n| family | algorithms | page |\n", "algorithm families", "| x |")


def test_the_command_line_check_passes_on_the_tree_and_write_changes_nothing() -> None:
    before = {page: (ROOT / page).read_text() for page in pages()}
    done = subprocess.run([sys.executable, "-m", "fedsynth.algorithm_docs", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {page: algorithm_docs.generated(page, text) for page, text in before.items()} == before
