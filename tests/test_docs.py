"""The documentation stays short, linked and true to the code (issue 21)."""

from __future__ import annotations

import re
from pathlib import Path

from common.run.config import config_fields
from common.run.config_docs import configuration_page
from common.keys import key_name
from fedsynth.algorithm_docs import paper_rules_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Pages written by the issue-21 helpers in parallel; each must be linked from the README even before it exists here.
DOCS_PAGES = ("algorithms", "configuration", "data", "deployment", "fedcog", "fedddpm", "fedsynsam", "oledfl",
              "performance", "reliability", "results", "studies")


def readme_links() -> set[str]:
    return set(re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()))


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move detail into docs/"


def test_every_docs_page_is_linked_from_the_readme():
    pages = {f"docs/{name}.md" for name in DOCS_PAGES} | {
        f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")
    }
    missing = sorted(pages - readme_links())
    assert not missing, f"README.md does not link {missing}"


def test_readme_links_to_files_that_exist():
    expected_later = {f"docs/{name}.md" for name in DOCS_PAGES}
    local = {link for link in readme_links() if not link.startswith(("http://", "https://"))}
    broken = sorted(link for link in local - expected_later if not (ROOT / link).exists())
    assert not broken, f"README.md links missing files {broken}"


def test_the_readmes_two_commands_are_make_targets():
    text = README.read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"Makefile has no '{target}' target"


def test_configuration_page_is_generated_from_common_config():
    # Regenerate with: python -m common.run.config_docs --markdown > docs/configuration.md
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == configuration_page(), (
        "docs/configuration.md is out of date: run python -m common.run.config_docs --markdown > docs/configuration.md")
    assert all(f"| `{key_name(f.name)}` |" in page for f in config_fields())


def test_algorithms_page_table_is_generated_from_the_paper_rules():
    # Regenerate with: python -m fedsynth.algorithm_docs --write
    page = (ROOT / "docs" / "algorithms.md").read_text()
    assert paper_rules_table() in page, (
        "docs/algorithms.md's paper-rule table is out of date: run python -m fedsynth.algorithm_docs --write")


def test_docs_links_between_pages_resolve():
    expected_later = {f"{name}.md" for name in DOCS_PAGES}
    broken = []
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if link.startswith(("http://", "https://")) or link in expected_later:
                continue
            if not (page.parent / link).exists():
                broken.append(f"{page.name} -> {link}")
    assert not broken, broken


def test_no_issue_numbers_in_the_docs_or_the_readme():
    # An issue number means nothing to a user; the investigation history lives in benchmarks/results/notebooks/.
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{page.name}: {match.group(0)}" for page in pages
             for match in re.finditer(r"\bissues? ?#?\d+", page.read_text(), re.IGNORECASE)]
    assert not found, found
