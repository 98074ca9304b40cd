"""What docs/deployment.md and deploy/README.md promise an operator, checked against what they get.

- Every message of our scripts that the docs quote (`superlink.sh: …`, `supernode.sh: …`; `…`
  stands for a path or value) is what the script prints in a case that produces it.
- `central-eval=false`: the server reads no dataset, so the SuperLink host needs no data.
(Flower's own messages that the docs quote are checked where they occur, in
tests/test_deployment_multihost.py.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import supernode_standin

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
DOCS = [REPO / "docs" / "deployment.md", DEPLOY / "README.md"]
QUOTED = re.compile(r"`((?:superlink|supernode|pki|connection|register-supernodes|compose-init|compose-nodes|"
                    r"build-local-base|compose-smoke|fetch-fashion-mnist|retry-activation)\.sh: [^`]+)`")


def quoted_script_messages() -> list[str]:
    return sorted({m for doc in DOCS for m in QUOTED.findall(doc.read_text())})


def as_pattern(quote: str) -> re.Pattern[str]:
    """The quote as a regex: `…` matches any text on the line."""
    return re.compile(".*".join(re.escape(part.strip()) for part in quote.split("…")))


def script(name: str, *args: str, user: bool = False) -> str:
    """stderr of deploy/NAME with ARGS (as an unprivileged user when asked and we are root)."""
    argv = [str(DEPLOY / name), *args]
    if user and os.geteuid() == 0:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    env = {**os.environ, "PATH": f"/nonexistent-bin{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env).stderr



def without_flower_records(text: str) -> str:
    """`text` without the records the stand-in SuperNodes log through Flower's logger, which prints them itself in
    its format (its coloured level, and the exit record's lines) once deploy/supernode-waits.py has imported Flower:
    Flower's output, not a script's message."""
    exit_lines = {"Failed to initialize the connection to the SuperLink.", "[code: 3] Failed to activate SuperNode."}
    return "\n".join(line for line in text.splitlines()
                     if not line.startswith("\x1b[") and line not in exit_lines)

@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Everything the scripts print in the failure cases the docs describe."""
    tmp = tmp_path_factory.mktemp("script-errors")
    blocker = tmp / "a-file"
    blocker.write_text("")
    # a directory an unprivileged user can reach but not write (pytest's own tmp is private to us)
    shared = Path(tempfile.mkdtemp(prefix="fedsynth-docs-", dir="/var/tmp"))
    shared.chmod(0o755)
    locked = shared / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    ca = tmp / "ca.crt"
    ca.write_text("")
    node = ["--superlink", "127.0.0.1:8000", "--partition-id", "0", "--num-partitions", "2"]
    out = [
        script("superlink.sh"),
        script("superlink.sh", "--insecure", "--database", str(blocker / "state.db")),
        script("supernode.sh", *node),
        script("supernode.sh", *node, "--ca", str(ca)),
        script("supernode.sh", *node, "--insecure", "--supernodes-per-host", "0"),
        script("supernode.sh", *node, "--insecure", "--activation-wait"),
        script("superlink.sh", "--insecure", "--database"),
        script("retry-activation.sh", "--activation-wait"),
    ]
    if os.geteuid() != 0 or shutil.which("setpriv"):
        out.append(script("superlink.sh", "--insecure", "--database", str(locked / "state.db"), user=True))
    # A SuperNode the SuperLink refuses to activate (a stand-in flower-supernode refused as Flower refuses):
    # retried, then given up on.
    refused = tmp / "refused-bin"
    supernode_standin.write(refused, supernode_standin.REFUSED)
    out.append(without_flower_records(subprocess.run(
        [str(DEPLOY / "retry-activation.sh"), "--retry-every", "1", "--activation-wait", "2", "--", "flower-supernode"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{refused}{os.pathsep}{os.environ['PATH']}"}).stderr))
    # A SuperNode that Flower deactivated after an unretried HTTP error but left running: stopped, started again.
    stalled = tmp / "stalled-bin"
    supernode_standin.write(stalled, "if CALL > 1:\n    sys.exit(0)\n"
                            + supernode_standin.left_offline("https://x:1/v1/fleet/pull-messages") + "time.sleep(30)\n")
    out.append(without_flower_records(subprocess.run(
        [str(DEPLOY / "retry-activation.sh"), "--retry-every", "1", "--", "flower-supernode"], capture_output=True,
        text=True, timeout=60, env={**os.environ, "PATH": f"{stalled}{os.pathsep}{os.environ['PATH']}"}).stderr))
    shutil.rmtree(shared)
    return "\n".join(out)


def test_the_docs_quote_script_messages():
    assert len(quoted_script_messages()) >= 5, quoted_script_messages()


@pytest.mark.parametrize("quote", quoted_script_messages())
def test_each_quoted_script_message_is_what_the_script_prints(captured: str, quote: str):
    lines = [line for line in captured.splitlines() if as_pattern(quote).search(line)]
    assert lines, f"docs quote `{quote}`, but no script prints it; they print:\n{captured}"


def test_every_script_failure_is_one_line(captured: str):
    errors = [line for line in captured.splitlines() if line and "WARNING" not in line]
    bad = [line for line in errors if not re.match(r"^((superlink|supernode|retry-activation)\.sh|supernode-waits\.py): ", line)]
    assert not bad, bad


@pytest.mark.parametrize(("name", "option"), [("supernode.sh", "--activation-wait"), ("superlink.sh", "--database"),
                                              ("retry-activation.sh", "--activation-wait")])
def test_an_option_without_its_value_is_a_usage_error_naming_it(captured: str, name: str, option: str):
    assert f"{name}: {option} needs a value (see --help)" in captured.splitlines()
    assert "unbound variable" not in captured


def test_without_central_evaluation_the_server_reads_no_data(tmp_path, tiny_data_dir):
    from fedsynth.inprocess import InProcessGrid, run_federation

    raw = {"data-dir": str(tmp_path / "no-data-here"), "cache-dir": str(tmp_path / "cache"),
           "results-dir": str(tmp_path / "r"), "run-name": "run", "num-server-rounds": 1, "local-steps": 2,
           "batch-size": 16, "central-eval": False}
    grid = InProcessGrid(2, raw, node_config=lambda pid: {"partition-id": pid, "num-partitions": 2,
                                                         "data-dir": str(tiny_data_dir)})
    run_federation(raw, grid)
    summary = json.loads((tmp_path / "r" / "run" / "summary.json").read_text())
    assert "final-central-accuracy" not in summary and 0 < summary["final-local-test-accuracy"] <= 1
    assert not (tmp_path / "no-data-here").exists()


def test_the_resume_line_the_docs_show_is_the_one_a_run_prints():
    from common.run.results import resume_hint

    doc = (REPO / "docs" / "deployment.md").read_text()
    shown = [line for line in doc.splitlines() if line.startswith("results folder: ")]
    assert shown, "docs/deployment.md shows no results-folder line"
    folder = Path(shown[0].split(" ", 3)[2])
    assert shown[0] == resume_hint(folder)


def test_the_systemd_unit_the_docs_show_starts_the_supernode_script_and_stops_restarting_on_its_refusals(tmp_path):
    doc = (REPO / "docs" / "deployment.md").read_text()
    (unit,) = re.findall(r"```ini\n(# /etc/systemd/system/fedsynth-supernode\.service\n.*?)```", doc, re.S)
    service = dict(line.split("=", 1) for line in unit.split("[Service]")[1].split("[Install]")[0].splitlines()
                   if "=" in line and not line.startswith("#"))
    argv = service["ExecStart"].split()
    assert argv[0] == "/opt/fedsynth/deploy/supernode.sh"
    # The unit's command, with its files made here: supernode.sh accepts every option and starts Flower.
    for name in ("ca.crt", "site-a"):
        (tmp_path / name).write_text("")
    argv = [str(DEPLOY / "supernode.sh")] + [a.replace("/etc/fedsynth", str(tmp_path)) for a in argv[1:]]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flower-supernode").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{tmp_path}/argv'\n")
    (bin_dir / "flower-supernode").chmod(0o755)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert "--auth-supernode-private-key" in (tmp_path / "argv").read_text().split()
    # Restarted after a crash, not after the scripts' refusals: 78 (retry-activation.sh gave up), 2 (bad option).
    assert service["Restart"] == "on-failure" and service["KillMode"] == "control-group"
    assert set(service["RestartPreventExitStatus"].split()) == {"78", "2"}
    assert "exit 78" in (DEPLOY / "retry-activation.sh").read_text()
    assert 'exit 2; }' in (DEPLOY / "supernode.sh").read_text()
    # What the unit needs exists: the user's writable home (Flower keeps apps in ~/.flwr), made by the page's
    # useradd line, and the cache folder, which systemd makes for the user (CacheDirectory= under /var/cache).
    environment = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("Environment=")]
    (home,) = [value.split("=", 1)[1] for value in environment if value.startswith("HOME=")]
    (useradd,) = [line for line in doc.splitlines() if line.startswith("sudo useradd")]
    assert f"--create-home --home-dir {home} " in useradd and useradd.endswith(f" {service['User']}")
    assert f"--cache-dir /var/cache/{service['CacheDirectory']}" in service["ExecStart"]
