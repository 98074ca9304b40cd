"""The hostile probe's harness (benchmarks/hostile_probe.py): a case that hangs is killed and counted, a case that
dies is counted, and a refusal is judged by whether its message names the part at fault."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

from tests.conftest import BENCHMARKS


def load_probe():
    """benchmarks/hostile_probe.py as the module `hostile_probe` (its dataclass and its family modules look it up)."""
    spec = importlib.util.spec_from_file_location("hostile_probe", BENCHMARKS / "hostile_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_probe"] = module
    spec.loader.exec_module(module)
    return module


probe = load_probe()


def test_a_hanging_case_is_killed_at_its_timeout_and_counted_as_a_hang():
    started = time.monotonic()
    outcome, detail, _ = probe.run_isolated(probe.Case("t", "sleeps", lambda: time.sleep(60), timeout=0.5))
    assert outcome == probe.HANG and detail.startswith("no verdict within")
    assert time.monotonic() - started < 10


def test_a_case_that_dies_without_a_verdict_is_unclear():
    outcome, detail, _ = probe.run_isolated(probe.Case("t", "dies", lambda: os._exit(3), timeout=10))
    assert outcome == probe.UNCLEAR and "died without a verdict" in detail


def test_a_refusal_is_handled_only_when_it_names_the_part_at_fault():
    def refuse(text):
        raise ValueError(text)

    assert probe.refused_naming(lambda: refuse("run config key 'lr' is nan"), ("lr",))[0] == probe.HANDLED
    assert probe.refused_naming(lambda: refuse("'str' object has no attribute 'x'"), ("nodes",))[0] == probe.UNCLEAR
    assert probe.refused_naming(lambda: 5, ("lr",))[0] == probe.WRONG
    assert probe.refused_naming(lambda: 5, ("lr",), accepted_ok=True)[0] == probe.HANDLED
    verdict = probe.run_isolated(probe.Case("t", "verdict", lambda: (probe.WRONG, "accepted")))
    assert verdict[:2] == (probe.WRONG, "accepted")


def load_family(name: str):
    """A family module of the probe (it imports `hostile_probe`, loaded above), from benchmarks/."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_family_probes_the_warm_server_the_watchdog_and_the_busy_state():
    site = load_family("hostile_probe_site")
    cases = site.site_cases(None)
    families = {case.family for case in cases}
    assert families == {"warm-server", "watchdog", "state-503"}
    names = " ".join(case.name for case in cases)
    for words in ("nested", "trickling", "sends nothing", "40 MB", "4 GiB", "impostor", "symlinked", "too long",
                  "Flower's 500 line", "forges a record", "locked past --busy-limit", "text says"):
        assert words in names, words
    # a few of them, run as the probe runs them (each in a forked child, with its timeout): handled on this code
    for name in ("an impostor replaces the socket", "an owner gone at start",
                 "Flower's own record of a 500 on its pull (control: restarts)"):
        (case,) = [c for c in cases if c.name == name]
        outcome, detail, _ = probe.run_isolated(case)
        assert outcome == probe.HANDLED, (name, outcome, detail)


def test_the_import_cases_refuse_on_both_sides_without_importing(tmp_path, monkeypatch):
    """The probe's imports family: a path outside the list is refused on the server and on a node, its module never
    imported (its marker file stays absent), and a permitted module's SystemExit is a refusal naming it."""
    sys.path.insert(0, str(BENCHMARKS))
    import hostile_probe_imports

    monkeypatch.delenv("FEDSYNTH_ALLOWED_IMPORTS", raising=False)
    cases = {case.name: case for case in hostile_probe_imports.import_cases(tmp_path)}
    for name in ("server: algorithm = 'antigravity:X'", "node: model = a module outside the list (marker stays absent)",
                 "server: algorithm = a module outside the list (marker stays absent)",
                 "node: a permitted module raising SystemExit(3) on import", "node: allowed-imports = '../evil'"):
        outcome, detail, _ = probe.run_isolated(cases[name])
        assert outcome == probe.HANDLED, (name, detail)
    assert not list(tmp_path.glob("probe_marker_*.imported"))  # the permitted module that exits ran, as it may
