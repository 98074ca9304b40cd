"""Several `fedsynth study` processes on one study folder (issue 37): every run done once, the ledger valid, and a
ledger line torn by a kill repaired on the next start without losing an entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedsynth.study.ledger import Ledger
from fedsynth.study.runner import StudyPaths, run_study
from fedsynth.study.claims import Claims
from tests.test_study import TINY, tiny_study

ROOT = Path(__file__).resolve().parent.parent


def fake_executor(calls: list, seconds: float = 0.0):
    """A study run that leaves a scoreable metrics.jsonl at once (the study machinery, not the method, is tested)."""
    import time

    from fedsynth.study.runner import RunOutcome

    def execute(spec, overrides, log_path):
        calls.append(spec.key)
        time.sleep(seconds)
        folder = Path(overrides["results-dir"]) / overrides["run-name"]
        folder.mkdir(parents=True, exist_ok=True)
        rows = [{"round": r, "central-accuracy": 0.1 * r, "local-test-accuracy": 0.1 * r} for r in (1, 2, 3)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return RunOutcome(0, seconds)

    return execute


def test_a_torn_last_line_is_set_aside_and_the_next_entry_is_not_glued_to_it(tmp_path):
    # the file's mechanics alone: entries without the fields their keys digest (check_keys=False)
    path = tmp_path / "ledger.jsonl"
    Ledger(path, check_keys=False).append({"key": "a", "v": 1})
    with open(path, "a") as handle:
        handle.write('{"key": "b", "v"')  # a process killed mid-write
    ledger = Ledger(path, check_keys=False)
    ledger.append({"key": "c", "v": 3})  # before the repair, this line would have joined the fragment: c lost
    lines = path.read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["a", "c"]
    assert Ledger(path, check_keys=False).get("c") == {"key": "c", "v": 3}
    assert (tmp_path / "ledger.jsonl.torn").read_text() == '{"key": "b", "v"\n'


def test_a_whole_last_entry_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"key": "a", "v": 1}\n{"key": "b", "v": 2}')  # killed between the entry and its newline
    ledger = Ledger(path, check_keys=False)
    with ledger.locked():
        assert "newline" in ledger.repair()
        assert ledger.repair() is None  # intact now
    ledger.append({"key": "c"})
    assert sorted(Ledger(path, check_keys=False).entries) == ["a", "b", "c"] and not (tmp_path / "ledger.jsonl.torn").exists()


def test_a_study_repairs_its_torn_ledger_on_start_and_loses_no_finished_run(tmp_path, tiny_data_dir):
    study = tiny_study(tmp_path, tiny_data_dir)
    paths = StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs")
    run_study(study, paths, fake_executor([]), max_runs=1, write=lambda line: None)
    with open(paths.ledger, "a") as handle:
        handle.write('{"key": "half a line')
    lines: list[str] = []
    calls: list = []
    ledger = run_study(study, paths, fake_executor(calls), max_runs=1, write=lines.append)
    assert any("cut short by a kill" in line for line in lines)
    assert len(calls) == 1 and len(ledger.entries) == 2
    assert all(json.loads(line) for line in paths.ledger.read_text().splitlines())


def test_a_run_claimed_by_another_process_is_skipped_and_free_again_when_it_dies(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl", check_keys=False)  # the claims' mechanics: a bare entry
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from fedsynth.study.ledger import Ledger
        from fedsynth.study.claims import Claims
        claim = Claims(Ledger({str(tmp_path / "ledger.jsonl")!r}), {str(tmp_path / "claims")!r}).claim("k", None)
        print("claimed" if claim else "refused", flush=True)
        time.sleep(60)
        """)], cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert other.stdout.readline().strip() == "claimed"
        claims = Claims(ledger, tmp_path / "claims")
        assert claims.claim("k", None) is None  # under way in the other process
        assert json.loads((tmp_path / "claims" / "k.claim").read_text())["pid"] == other.pid
    finally:
        other.kill()
        other.wait()
    claim = claims.claim("k", None)  # its process died, and its claim with it
    assert claim is not None
    claims.record(claim, {"key": "k", "exit-code": 0})
    assert claims.claim("k", None) is None  # finished: the ledger has it
    assert not (tmp_path / "claims" / "k.claim").exists()


STUDY_PROCESS = """
import sys, time
from pathlib import Path
from fedsynth.study.runner import StudyPaths, run_study
from fedsynth.study.studyfile import load_study
from tests.test_study_shared import fake_executor

study_file, out, executions, ready, me = sys.argv[1:6]


class SharedLog(list):
    def append(self, key):  # each run started, in a log both processes write
        with open(executions, "a") as log:
            log.write(key + "\\n")


Path(ready, me).touch()
while len(list(Path(ready).iterdir())) < 2:  # both processes start their study together
    time.sleep(0.01)
run_study(load_study(Path(study_file)), StudyPaths(out=Path(out), runs=Path(out) / "runs"),
          fake_executor(SharedLog(), seconds=0.2), jobs=2, write=lambda line: print(line, flush=True))
"""


@pytest.mark.slow
def test_two_study_processes_on_one_folder_run_every_run_once(tmp_path):
    study_file = tmp_path / "tiny.toml"
    study_file.write_text(TINY.format(data=tmp_path / "data", cache=tmp_path / "cache")
                          .replace("report-seeds = [0, 1]", "report-seeds = [0, 1, 2, 3]"))
    out, executions, ready = tmp_path / "out", tmp_path / "executions.log", tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [subprocess.Popen([sys.executable, "-c", STUDY_PROCESS, str(study_file), str(out), str(executions),
                                   str(ready), name], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for name in ("a", "b")]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], "\n".join(outputs)[-3000:]
    ran = executions.read_text().split()
    assert len(ran) == 10 and len(set(ran)) == 10  # 2 tuning + 2 arms x 4 seeds, each run once
    lines = (out / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 10 and {json.loads(line)["key"] for line in lines} == set(ran)  # every line whole
    assert all("skipped: finished or under way in another" in output for output in outputs)  # both shared the work
    assert "10 of 10 runs finished" in (out / "report.md").read_text()  # the last to finish wrote it whole
    assert list((out / "claims").iterdir()) == []
