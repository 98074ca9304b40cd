"""The README's table of claims: short rows, one per claim, and the numbers of the committed studies."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.claims_figure import BEGIN, END, ROWS, replace_readme_table, table_markdown

ROOT = Path(__file__).resolve().parents[1]


def claims_table() -> list[list[str]]:
    """The README table's body rows, split into cells."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip().splitlines()
    assert block[0].startswith("| paper | claim") and set(block[1]) <= set("|- ")
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in block[2:]]


def test_the_readme_has_one_short_row_per_claim():
    rows = claims_table()
    assert 1 <= len(rows) <= 25
    assert all(len(cells) == 8 for cells in rows)
    long = [cell[:60] for cells in rows for cell in cells if len(cell) > 300]
    assert not long, f"cells over 300 characters: {long}"
    claims = [(cells[1], cells[7]) for cells in rows]
    assert len(set(claims)) == len(claims), "a claim of a report has two rows"
    assert {cells[0] for cells in rows} == {"FedSynSAM", "FedDDPM", "OledFL", "FedCOG"}
    for cells in rows:
        assert re.fullmatch(r"holds|not resolved|\*\*holds\*\*|\*\*reversed\*\*", cells[4]), cells[4]
        assert cells[3] == "not recorded" or cells[3].startswith("aggregation ") or "(stated; " in cells[3], cells[3]
        link = re.fullmatch(r"\[[^]]+\]\(([^)]+)\)", cells[7])
        assert link and (ROOT / link.group(1)).is_file(), cells[7]


def test_the_readme_table_is_the_committed_studies_numbers():
    # Regenerate with: python benchmarks/claims_figure.py --readme
    assert len(claims_table()) == len(ROWS)
    text = (ROOT / "README.md").read_text()
    assert replace_readme_table(text, table_markdown()) == text, \
        "README.md's claims table is out of date: run python benchmarks/claims_figure.py --readme"


def test_the_table_is_replaced_between_its_markers_only():
    text = f"before\n{BEGIN}\nold | table\n{END}\nafter\n"
    assert replace_readme_table(text, "| new |") == f"before\n{BEGIN}\n| new |\n{END}\nafter\n"
