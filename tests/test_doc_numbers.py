"""The numbers the method pages and docs/reliability.md quote from the committed studies are the ledgers' numbers
(benchmarks/doc_numbers.py): a page whose marked number differs from what the script computes fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.doc_numbers import MARKER, PAGES, compute, page_numbers, rewrite

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_marked_number_of_a_page_is_the_ledgers(page):
    # Regenerate with: python benchmarks/doc_numbers.py --write
    stale = [(spec, shown, computed) for spec, shown, computed in page_numbers(page.read_text()) if shown != computed]
    assert not stale, f"{page.name}: numbers that differ from the ledgers (python benchmarks/doc_numbers.py --write): {stale}"


def test_the_pages_that_quote_the_studies_mark_their_numbers():
    counts = {page.name: len(MARKER.findall(page.read_text())) for page in PAGES}
    for name in ("fedsynsam.md", "fedcog.md", "fedddpm.md", "oledfl.md", "reliability.md"):
        assert counts[name] >= 3, counts


def test_a_number_edited_by_hand_is_found_and_rewritten():
    page = (ROOT / "docs" / "fedcog.md").read_text()
    spec = "interaction fedcog-bounded-influence fedavg+cog fedavg fedavg+cog-bounded fedavg-bounded"
    marker = f"<!-- n:{spec} -->"
    assert marker in page
    edited = page.replace(marker + compute(spec), marker + "+2.00 [+1.00, +3.00]")
    assert [(s, shown) for s, shown, computed in page_numbers(edited) if shown != computed] == \
        [(spec, "+2.00 [+1.00, +3.00]")]
    assert rewrite(edited) == page


def test_the_numbers_the_review_computed_by_hand():
    """The issue's reviewer's own numbers from the same ledgers (last-5 accuracy in points; FID)."""
    bounded = "fedcog-bounded-influence"
    # plain gain − bounded gain: the reviewer's −1.19 [−5.54, +3.16] was bounded − plain
    assert compute(f"interaction {bounded} fedavg+cog fedavg fedavg+cog-bounded fedavg-bounded") == "+1.19 [−3.16, +5.54]"
    assert compute(f"swing {bounded} fedavg") == "6.6" and compute(f"swing {bounded} fedavg-bounded") == "5.8"
    assert compute(f"spans {bounded} fedavg").split(", ")[1:] == ["10.7", "11.1", "3.0", "9.4"]
    assert compute("beats-pairs fedddpm-cpu fedddpm fedavg,fedprox,scaffold,mofedsam") == "159 of 160"
    assert compute("diff fedsynsam-confound fedsynsam-normalized fedsynsam") == "+0.07 [−0.05, +0.19]"  # +0.068
    assert compute("claim fedsynsam-confound fedsynsam-oracle>fedsynsam") == "−0.02 [−0.14, +0.09]"
    assert compute("sweep oledfl-long oledfl-sgd-b0.99<dfedavg") == "+30.0 to +110.3 rounds over targets 0.8-0.86"
    assert compute(f"pairs {bounded} fedavg>fedavg-bounded") == "5" and compute("pairs fedcog-paper fedavg+cog>fedavg") == "2"


def test_an_unknown_kind_or_name_is_refused_naming_it():
    with pytest.raises(KeyError, match="unknown kind 'median'"):
        compute("median fedcog-bounded-influence fedavg")
    with pytest.raises(KeyError, match="no report runs of arm 'fedavgx'"):
        compute("swing fedcog-bounded-influence fedavgx")
    with pytest.raises(KeyError, match="no claim 'a>b'"):
        compute("claim fedcog-bounded-influence a>b")
