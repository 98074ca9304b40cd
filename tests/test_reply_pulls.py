"""The deployed ServerApp retries a reply's missing objects after 0.05 s (server_app/reply_pulls.py), on Flower
1.42.0 only, and not with FEDSYNTH_ADAPTIVE_WAITS=0."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError, pull_objects

from server_app import reply_pulls
from server_app.reply_pulls import FLOWER_VERSION, SWITCH, adapt_reply_pulls


def _gap_before_second_try(pull: object) -> float:
    """Seconds between the first try of an object that is not there yet and the try that finds it."""
    tries: list[float] = []

    def pull_object(object_id: str) -> bytes:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise ObjectUnavailableError(object_id)
        return b"contents"

    assert pull(["object"], pull_object) == {"object": b"contents"}
    return tries[1] - tries[0]


def test_the_first_retry_comes_after_a_twentieth_of_a_second_not_flowers_second() -> None:
    grid_module = SimpleNamespace(pull_objects=pull_objects)
    assert _gap_before_second_try(grid_module.pull_objects) >= 0.75  # Flower's own: 1 s +-20 %
    assert adapt_reply_pulls(None, environ={}, version=FLOWER_VERSION, module=grid_module)
    assert _gap_before_second_try(grid_module.pull_objects) < 0.3
    adapted = grid_module.pull_objects
    assert adapt_reply_pulls(None, environ={}, version=FLOWER_VERSION, module=grid_module)  # once only
    assert grid_module.pull_objects is adapted


@pytest.mark.parametrize(("environ", "version"), [({}, "1.43.0"), ({SWITCH: "0"}, FLOWER_VERSION),
                                                  ({SWITCH: "off"}, FLOWER_VERSION)])
def test_another_flower_or_the_switch_leaves_flowers_retries(environ: dict[str, str], version: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    grid_module = SimpleNamespace(pull_objects=pull_objects)
    with caplog.at_level("INFO", logger="flwr"):
        assert not adapt_reply_pulls(None, environ=environ, version=version, module=grid_module)
    assert grid_module.pull_objects is pull_objects
    assert len([r for r in caplog.records if "Flower" in r.getMessage()]) == 1  # says so in one line


def test_only_a_deployed_grid_is_concerned(monkeypatch: pytest.MonkeyPatch) -> None:
    import flwr.superlink.grid.http_grid as http_grid
    from flwr.superlink.grid import InMemoryGrid

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored after the test
    monkeypatch.delenv(SWITCH, raising=False)
    assert not adapt_reply_pulls(object.__new__(InMemoryGrid))
    assert http_grid.pull_objects is pull_objects
    assert adapt_reply_pulls(object.__new__(http_grid.HttpGrid)) is (reply_pulls.flower_version() == FLOWER_VERSION)
