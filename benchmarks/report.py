"""A benchmark's report: its markdown lines and its rows, written side by side and printed.

Imported by the scripts that end the same way (app_work.py, scaling.py): the table goes to `out`, the rows it
was made from to `out` with the suffix `.json` (for a later script to read), and the table to stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, lines: list[str], rows: Any) -> None:
    """Write `lines` to `out` (its folder made), `rows` as JSON beside it (`out.with_suffix(".json")`), and print
    `lines`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
