"""deploy/supernode-waits.py against a stand-in for Flower's SuperNode loop, and its version guard and switch.

The stand-in is Flower 1.42.0's loop as flwr/supernode/start_client_internal.py writes it (pull; after an empty pull
`time.sleep(3)`; else push the reply, looking for it every 0.5 s), on a clock the test advances: the launcher's
waits are read off that clock, not measured on a loaded machine.
"""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def load_launcher() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("supernode_waits", DEPLOY / "supernode-waits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


waits = load_launcher()


class Clock:
    """A clock that only `sleep` moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.flower_sleeps: list[float] = []  # the stand-in loop's own `time.sleep(3)`

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def flower_sleep(self, seconds: float) -> None:
        self.flower_sleeps.append(seconds)
        self.now += seconds


def stand_in_loop(clock: Clock, messages_at: list[float], pulls: list[float], pushes: list[float]) -> types.ModuleType:
    """A module with Flower 1.42.0's SuperNode loop (its globals `_pull_and_store_message`, `_push_messages`,
    `pull_objects`, looked up at call time); a message becomes available at each time of `messages_at`."""
    loop = types.ModuleType("stand_in_start_client_internal")
    pending = list(messages_at)

    def _pull_and_store_message(**_: object) -> int | None:
        pulls.append(clock.now)
        if pending and pending[0] <= clock.now:
            pending.pop(0)
            return 7  # a run id
        return None

    def _push_messages(**_: object) -> None:
        pushes.append(clock.now)

    def pull_objects(object_ids: list[str], pull_object_fn: object, initial_backoff: float = 1.0) -> float:
        return initial_backoff

    def start_client_internal(rounds: int) -> None:
        for _ in range(rounds):  # Flower's `while True`, bounded for the test
            run_id = loop._pull_and_store_message(state=None)
            if run_id is None:
                clock.flower_sleep(3)
                continue
            loop._push_messages(state=None)

    loop._pull_and_store_message = _pull_and_store_message
    loop._push_messages = _push_messages
    loop.pull_objects = pull_objects
    loop.start_client_internal = start_client_internal
    return loop


class StandInState:
    def store_message(self, message: object) -> None:
        self.message = message


class StandInStore:
    def put(self, object_id: str, content: bytes) -> None:
        self.content = content


def test_backoff_grows_from_the_first_wait_to_flowers_three_seconds_and_a_message_resets_it() -> None:
    backoff = waits.Backoff(first=0.05, growth=1.5, last=3.0)
    series = [backoff.next_wait() for _ in range(12)]
    assert series[:4] == pytest.approx([0.05, 0.075, 0.1125, 0.16875])
    assert series[-1] == 3.0 and max(series) == 3.0 and series == sorted(series)
    backoff.reset()
    assert backoff.next_wait() == 0.05
    with pytest.raises(ValueError, match="backoff needs"):
        waits.Backoff(first=0, growth=1.5, last=3)
    with pytest.raises(ValueError, match="backoff needs"):
        waits.Backoff(first=0.05, growth=0.5, last=3)


def test_empty_pulls_back_off_and_a_message_is_picked_up_within_the_first_interval() -> None:
    clock, pulls, pushes = Clock(), [], []
    # the reply was pushed at 0; the server's next message is there 0.01 s later, and then again after 100 s idle
    loop = stand_in_loop(clock, [0.01, 100.0], pulls, pushes)
    backoff = waits.Backoff()
    loop._pull_and_store_message = waits.pull_until_message(loop._pull_and_store_message, backoff, clock.sleep)
    loop.start_client_internal(rounds=2)
    # first message: one empty pull, then the first interval (0.05 s), not Flower's 3 s
    assert pulls[:2] == [0.0, pytest.approx(0.05)] and pushes[0] == pytest.approx(0.05)
    # idle: the waits grow to Flower's 3 s and stay there, so an idle node pulls no more often than Flower's
    idle = clock.sleeps[1:]  # the waits after the first message's push
    assert idle[0] == 0.05 and idle == sorted(idle) and max(idle) == 3.0
    assert all(wait == 3.0 for wait in idle[12:])  # a ramp of a few pulls, then Flower's wait
    flower_pulls = int((100.0 - 0.05) // 3) + 1  # Flower's loop over the same 100 s: one pull per 3 s
    assert len(pulls) - 2 <= flower_pulls + 12  # the ramp's few extra pulls after each message, then Flower's rate
    assert len(pushes) == 2 and pushes[1] - 100.0 <= 3.0  # the idle node's next message, within Flower's 3 s
    assert clock.flower_sleeps == []  # Flower's own sleep(3) after an empty pull never ran


def test_install_replaces_the_loops_waits_and_keeps_the_rest() -> None:
    clock, pulls, pushes = Clock(), [], []
    loop = stand_in_loop(clock, [0.0], pulls, pushes)
    original_push = loop._push_messages
    waits.install(loop, StandInState, StandInStore)
    assert loop.pull_objects(["a"], None) == waits.OBJECT_FIRST_RETRY  # the object pull's first retry
    # the state and the store tell when they change
    state, store = StandInState(), StandInStore()
    state.store_message("m")
    store.put("x", b"1")
    assert state.message == "m" and store.content == b"1"
    assert StandInState.store_message.__wrapped__ is not None and loop._push_messages is not original_push


def test_the_reply_is_pushed_as_soon_as_it_is_stored() -> None:
    changes = waits.Changes()
    stored = threading.Event()
    pushed: list[float] = []

    def ready(state: object, store: object) -> bool:
        return stored.is_set()

    push = waits.push_when_ready(lambda *a: pushed.append(time.monotonic()), ready, changes, look=60.0)
    started = time.monotonic()

    def client_app() -> None:  # the ClientApp's reply lands in the node's store 0.05 s later
        time.sleep(0.05)
        stored.set()
        changes.changed()

    threading.Thread(target=client_app).start()
    push(None, None, None, None)
    # woken by the change, not by the 60 s look: well under the look on any machine
    assert pushed and pushed[0] - started < 10.0


def test_a_reply_whose_objects_never_complete_goes_to_flowers_push_after_its_look() -> None:
    clock = Clock()
    calls: list[float] = []
    changes = waits.Changes()
    push = waits.push_when_ready(lambda *a: calls.append(clock.now), lambda s, o: None, changes, look=0.5,
                                 clock=lambda: clock.now)
    changes.wait = lambda since, timeout: clock.sleep(timeout)  # type: ignore[method-assign]
    push(None, None, None, None)
    assert calls == [pytest.approx(0.5)]  # Flower's own push (and its 0.5 s look) takes over


def test_reply_ready_reads_flowers_node_state_without_marking_the_reply_retrieved(monkeypatch) -> None:
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_object_tree
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    store = InMemoryObjectStore()
    state = InMemoryNodeState(store)
    assert waits.reply_ready(state, store) is False
    for name in ("_run_id", "_task_id", "_node_id"):  # a message is made inside a task (Flower's own tests do this)
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)
    request = Message(RecordDict(), dst_node_id=5, message_type="train")
    request.metadata.__dict__["_message_id"] = request.object_id
    import numpy as np

    reply = Message(RecordDict({"arrays": ArrayRecord([np.arange(3.0)])}), reply_to=request)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    state.store_message(reply)
    store.preregister(reply.metadata.run_id, get_object_tree(reply))
    assert waits.reply_ready(state, store) is None  # stored, its contents still coming
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    for object_id, obj in get_all_nested_objects(reply).items():
        store.put(object_id, obj.deflate())
    assert waits.reply_ready(state, store) is True
    assert len(state.get_messages_legacy(is_reply=True)) == 1  # still there for Flower's own push


def test_the_version_guard_and_the_switch_run_flower_unchanged(capsys) -> None:
    assert waits.choose({}, "1.42.0") is True
    assert waits.choose({"FEDSYNTH_ADAPTIVE_WAITS": "1"}, "1.42.0") is True
    for environ, version in (({}, "1.43.0"), ({}, "1.42.1"), ({"FEDSYNTH_ADAPTIVE_WAITS": "0"}, "1.42.0"),
                             ({"FEDSYNTH_ADAPTIVE_WAITS": "Off"}, "1.42.0")):
        capsys.readouterr()
        assert waits.choose(environ, version) is False
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("supernode-waits.py: "), lines
    assert "1.43.0 is not 1.42.0" in (waits.choose({}, "1.43.0"), capsys.readouterr().err)[1]


def test_on_another_flower_version_the_launcher_installs_nothing(monkeypatch) -> None:
    monkeypatch.setattr(waits, "flower_version", lambda: "1.43.0")
    installed = []
    monkeypatch.setattr(waits, "install", lambda: installed.append(True))
    monkeypatch.setattr("flwr.supernode.cli.flower_supernode", lambda: 0)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the launcher sets Flower's argv: restored after the test
    with pytest.raises(SystemExit) as done:
        waits.main(["--", "flower-supernode", "--insecure"])
    # Flower's console script (found on PATH, run in this process) or its entry point, with the arguments after it
    assert done.value.code == 0 and installed == [] and Path(sys.argv[0]).name == "flower-supernode"
    assert sys.argv[1:] == ["--insecure"]


def test_the_installed_flower_is_the_one_the_waits_were_written_for() -> None:
    """Flower 1.42.0's loop as the launcher replaces it: its names, and the waits it has in place of ours."""
    import flwr.supernode.start_client_internal as loop

    assert waits.flower_version() == waits.FLOWER_VERSION
    source = inspect.getsource(loop)
    assert "time.sleep(3)" in source and "_pull_and_store_message(" in source and "_push_messages(" in source
    assert "pull_objects(" in source and inspect.signature(loop.pull_objects).parameters["initial_backoff"]


def test_the_launcher_runs_flowers_supernode_with_its_arguments() -> None:
    result = subprocess.run([sys.executable, str(DEPLOY / "supernode-waits.py"), "--", "flower-supernode",
                             "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage: flower-supernode" in result.stdout
    assert result.stderr.count("supernode-waits.py: adaptive waits on") == 1


def test_supernode_script_runs_flowers_supernode_under_the_launcher(tmp_path: Path) -> None:
    """deploy/supernode.sh runs the launcher with the Python of the flower-supernode on PATH (its shebang)."""
    from tests.test_deployment_files import record_argv, run_script

    bin_dir = tmp_path / "bin"
    out = record_argv(bin_dir, "python-of-flower")  # stands in for the Python that has Flower installed
    (bin_dir / "flower-supernode").write_text(f"#!{bin_dir / 'python-of-flower'}\n")
    (bin_dir / "flower-supernode").chmod(0o755)
    result = run_script("supernode.sh", ["--superlink", "127.0.0.1:8000", "--insecure", "--partition-id", "0",
                                         "--num-partitions", "1"], bin_dir)
    assert result.returncode == 0, result.stderr
    argv = out.read_text().split("\0")[:-1]
    # retry-activation.sh runs it under Flower's records (supernode-records.py), then the launcher, in one process
    assert argv[:6] == [str(DEPLOY / "supernode-records.py"), "--records-fd", "3", "--",
                        str(DEPLOY / "supernode-waits.py"), "--"], argv
    assert argv[6] == str(bin_dir / "flower-supernode"), argv
    assert {"--insecure", "--superlink", "127.0.0.1:8000", "--node-config"} <= set(argv)
