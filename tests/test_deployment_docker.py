"""The image of deploy/Dockerfile and the compose deployment, where a Docker engine runs.

No registry is reachable from the machines this project is tested on, so the image is built on a
base made locally by `sudo deploy/build-local-base.sh` (debootstrap + docker import; about 10
minutes, once per machine). Without a running engine or without that base the tests skip and
say why. The full compose quick start (deploy/compose-smoke.sh: SuperLink, SuperNodes, executors,
registration, a 2-round run, results on the host) takes minutes and runs only when
FEDSYNTH_COMPOSE_SMOKE=1. Where .ci/run builds the base in the background while the suite runs,
FEDSYNTH_BASE_BUILD_STATUS names the file the build writes its outcome to ("ok", or why it failed):
these tests then run last (tests/conftest.py) and wait for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BASE = os.environ.get("FEDSYNTH_BASE_IMAGE", "fedsynth-base:local")


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def why_no_base_build(timeout: float = 1800) -> str:
    """Empty once a background base build (.ci/run) has succeeded or none was started; else why it is not there."""
    status = os.environ.get("FEDSYNTH_BASE_BUILD_STATUS")
    if not status:
        return ""
    deadline = time.monotonic() + timeout
    while not os.path.exists(status):
        if time.monotonic() > deadline:
            return f"the background base build (deploy/build-local-base.sh) did not end in {timeout:.0f} s"
        time.sleep(5)
    outcome = Path(status).read_text().strip()
    return "" if outcome == "ok" else f"no base image {BASE}: {outcome}"


def why_no_docker() -> str:
    """Empty when an engine runs and the base image is there; else the reason to skip."""
    build = why_no_base_build()
    if build:
        return build
    if shutil.which("docker") is None:
        return "no docker CLI installed (Debian: apt-get install docker.io)"
    info = docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    if info.returncode != 0:
        return f"no Docker engine running ({(info.stderr or info.stdout).strip().splitlines()[-1]}); start dockerd as root"
    if docker("image", "inspect", BASE, timeout=30).returncode != 0:
        return (f"no base image {BASE}: no registry is reachable here, so make it once with "
                f"`sudo deploy/build-local-base.sh` (debootstrap + docker import, ~10 min), or set "
                f"FEDSYNTH_BASE_IMAGE to a local python:3.11 image with the dependencies")
    return ""


@pytest.fixture(scope="module")
def image() -> str:
    reason = why_no_docker()
    if reason:
        pytest.skip(reason)
    tag = f"fedsynth:test-{os.getpid()}"
    build = docker("build", "--build-arg", f"BASE_IMAGE={BASE}", "-f", str(REPO / "deploy" / "Dockerfile"),
                   "-t", tag, str(REPO), timeout=900)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    yield tag
    docker("rmi", tag)


def test_image_runs_flower_and_the_app_unprivileged(image: str) -> None:
    script = ("id -u; flower-superlink --version; flower-superexec --version; flwr --version; "
              "python -c 'import server_app.app, client_app.app; print(\"app imports\")'")
    result = docker("run", "--rm", "--network", "none", image, "sh", "-c", script, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "49999"
    assert result.stdout.count("1.42.0") == 3
    assert "app imports" in result.stdout
    env = docker("image", "inspect", "--format", "{{json .Config.Env}}", image).stdout
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in env


def test_image_works_as_any_uid_compose_sets(image: str) -> None:
    # docker-compose.yml runs services as the host user (FEDSYNTH_UID), who must be able to
    # write FLWR_HOME, the results root, the partition cache and the SuperLink state.
    script = ("flwr config list >/dev/null && test -w /fedsynth/results && test -w /cache "
              "&& test -w /state && test -w /home/app/.cache && echo writable")
    result = docker("run", "--rm", "--network", "none", "--user", "1234:1234", image, "sh", "-c", script,
                    timeout=300)
    assert result.returncode == 0 and "writable" in result.stdout, result.stdout + result.stderr


def test_compose_quick_start_end_to_end() -> None:
    if os.environ.get("FEDSYNTH_COMPOSE_SMOKE") != "1":
        pytest.skip("the compose quick start takes minutes: run deploy/compose-smoke.sh, "
                    "or set FEDSYNTH_COMPOSE_SMOKE=1")
    reason = why_no_docker()
    if reason:
        pytest.skip(reason)
    result = subprocess.run([str(REPO / "deploy" / "compose-smoke.sh")], capture_output=True, text=True,
                            timeout=1800, env={**os.environ, "FEDSYNTH_BASE_IMAGE": BASE})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    assert "compose-smoke.sh: OK" in result.stdout
