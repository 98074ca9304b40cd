"""A run started without a run-name can be resumed: it prints its folder and the run config that continues it.

With the default `checkpoint-every` (1) a server killed after round 1 leaves a
checkpoint, and `run-name='<printed name>' resume=true` finishes the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedsynth.inprocess import InProcessGrid, run_federation

REPO = Path(__file__).resolve().parent.parent
HINT = re.compile(r"results folder: (\S+) \(to resume this run: --run-config \"run-name='([^']+)' resume=true\"")


def test_a_run_without_run_name_resumes_by_the_name_it_printed(tmp_path, tiny_data_dir):
    raw = {"data-dir": str(tiny_data_dir), "cache-dir": str(tmp_path / "cache"), "results-dir": str(tmp_path / "r"),
           "num-server-rounds": 3, "local-steps": 2, "batch-size": 16}  # no run-name, default checkpoint-every
    process = subprocess.Popen([sys.executable, "-m", "fedsynth.inprocess", json.dumps(raw), "2", "1.0"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "FLWR_LOG_LEVEL": "INFO"})
    try:
        match = None
        for line in process.stdout:
            match = match or HINT.search(line)
            if match and "[round 1/3]" in line:  # round 1 is checkpointed before its progress line
                break
        assert match is not None, "the run did not print its results folder and resume config"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
    folder, name = Path(match.group(1)), match.group(2)
    assert folder == tmp_path / "r" / name and (folder / "checkpoint.safetensors").is_file()

    resumed = {**raw, "run-name": name, "resume": True}
    start = time.monotonic()
    run_federation(resumed, InProcessGrid(2, resumed))
    rounds = [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rounds[-3:] == [1, 2, 3] and (folder / "summary.json").is_file(), time.monotonic() - start
