"""deploy/superlink.sh stops within its stated bound: SIGTERM is passed on to the SuperLink, and one that is still
running after --stop-timeout seconds (Flower's waits until every `flwr run --stream` client has disconnected) is
killed with its process group; the script says what it waits for and exits only once the SuperLink is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"

# stand-ins for flower-superlink: one that stops on SIGTERM, one that waits as Flower's does with a stream open
# (a child of its own keeps running too, so the kill must reach the process group)
STOPS = "#!/bin/sh\necho started\nexec sleep 60\n"
LINGERS = "#!/bin/sh\ntrap '' TERM\necho started\nsleep 60 &\necho $! > \"$PIDFILE\"\nwait\n"


def _start(tmp_path: Path, script: str, *args: str) -> subprocess.Popen:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flower-superlink").write_text(script)
    (bin_dir / "flower-superlink").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIDFILE": str(tmp_path / "pid")}
    process = subprocess.Popen([str(DEPLOY / "superlink.sh"), "--insecure", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout.readline().strip() == "started"
    return process


def _stop(process: subprocess.Popen) -> tuple[float, str, int]:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    return time.monotonic() - started, err, process.returncode


def test_sigterm_is_passed_on_and_the_script_exits_with_the_superlink(tmp_path: Path) -> None:
    seconds, err, code = _stop(_start(tmp_path, STOPS, "--stop-timeout", "5"))
    assert seconds < 3 and code == 143, err
    assert "superlink.sh: SIGTERM: stopping flower-superlink" in err and "`flwr run --stream`" in err, err
    assert "at most --stop-timeout = 5 s" in err and "flower-superlink stopped" in err, err


def test_a_superlink_that_lingers_is_killed_with_its_children_after_the_bound(tmp_path: Path) -> None:
    process = _start(tmp_path, LINGERS, "--stop-timeout", "1")
    seconds, err, code = _stop(process)
    assert 1 <= seconds < 4 and code == 143, err
    assert "still running after 1 s: killed it and its process group (SIGKILL)" in err, err
    grandchild = int((tmp_path / "pid").read_text())
    for _ in range(50):  # the killed process group's sleep is gone (reaped by init)
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the SuperLink's child {grandchild} outlived the kill")


@pytest.mark.parametrize("value", ["0", "-1", "abc", "999999", ""])
def test_a_bad_stop_timeout_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    result = subprocess.run([str(DEPLOY / "superlink.sh"), "--insecure", "--stop-timeout", value],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--stop-timeout must be a positive whole number of seconds" in result.stderr
