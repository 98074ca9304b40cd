"""Hostile run-config keys for a plugin's own settings ("<name>.<key>", common/run/own_settings.py), on both sides.

FedAdam (tests/plugin_fedadam, the plugin of tests/test_plugin_own_settings_and_state.py) declares `eta`, `beta-1`,
`beta-2`, `tau` and the node's `local-lr-scale`. A run config or a train message may still carry anything: a value
too large for a float, a key nested deeper than "<name>.<key>", a key of odd characters or of a million of them,
a list or a table for a number, a hundred thousand keys, a key spelled like one of fedsynth's own. Each is
refused with a ConfigError that names the key in a message of a few lines, in well under the time a hang would
take, or accepted where it is harmless (a large but finite eta); never an OverflowError or a traceback of
fedsynth's. The node's check (`check_message`) is driven directly here; the ClientApp's own path is
tests/test_plugin_own_settings_and_state.py's `test_the_node_refuses_a_bad_message_setting_naming_the_key`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.errors import ConfigError
from common.run.config import coerce_value, parse_run_config
from common.run.own_settings import check_message
from server_app.registry import SERVER_STRATEGIES
from tests.plugin_packages import installed_package, permitted_imports

PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugin_fedadam" / "fedadam"
ADAM = "fedadam:FEDADAM"
SECONDS = 10.0  # far above what a refusal takes (well under a second), far below a hang
LONGEST_MESSAGE = 4_000  # characters, whatever the run config holds (fedsynth's known keys, listed, are 1,800)


@pytest.fixture(scope="module", autouse=True)
def permitted_plugins() -> Iterator[None]:
    yield from permitted_imports("fedadam")


@pytest.fixture(scope="module", autouse=True)
def plugin_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from installed_package(PLUGIN_SOURCE, tmp_path_factory)


def _refused(raw: dict) -> str:
    """parse_run_config's ConfigError for `raw`, checked to come fast and short."""
    start = time.monotonic()
    with pytest.raises(ConfigError) as refusal:
        parse_run_config(raw, SERVER_STRATEGIES)
    assert time.monotonic() - start < SECONDS
    message = str(refusal.value)
    assert len(message) < LONGEST_MESSAGE, message[:300]
    return message


HOSTILE_VALUES = {
    "an integer beyond a float's range": (10**400, "expected a finite number, got 1000"),
    "a megabyte of text": ("x" * 10**6, "expected a number, got 'xxx"),
    "a list": ([0.1, 0.2], r"expected a number, got [0.1, 0.2]"),
    "a table": ({"a": 1}, "expected a number, got {'a': 1}"),
    "nothing": (None, "expected a number, got None"),
    "bytes": (b"0.1", "expected a number, got b'0.1'"),
    "true": (True, "expected a number, got True"),
    "not a number": (float("nan"), "expected a finite number, got nan"),
}


@pytest.mark.parametrize("case", list(HOSTILE_VALUES))
def test_a_hostile_value_of_a_plugin_key_is_refused_naming_the_key(case: str) -> None:
    value, said = HOSTILE_VALUES[case]
    message = _refused({"algorithm": ADAM, "fedadam.eta": value})
    assert message.startswith("run config key 'fedadam.eta': ") and said in message, message


def test_a_large_but_finite_value_is_harmless_and_accepted() -> None:
    cfg = parse_run_config({"algorithm": ADAM, "fedadam.eta": 1e308, "fedadam.tau": 10**300}, SERVER_STRATEGIES)
    assert (cfg.own_settings.eta, cfg.own_settings.tau) == (1e308, float(10**300))


HOSTILE_KEYS = {
    "nested deeper than <name>.<key>": ("fedadam.eta.x.y", "'fedadam.eta.x.y' (did you mean 'fedadam.eta'?)"),
    "a.b.c.d": ("a.b.c.d", "'a.b.c.d'"),
    "odd characters": ("fedadam.e\x00t\na\u202e", r"'fedadam.e\x00t\na\u202e'"),
    "no name": (".eta", "'.eta'"),
    "no key": ("fedadam.", "'fedadam.'"),
    "another case": ("FedAdam.eta", "'FedAdam.eta' (did you mean 'fedadam.eta'?)"),
    "a built-in key under the plugin's name": ("fedadam.lr", "'fedadam.lr'"),
    "a built-in key under the plugin's name (2)": ("fedadam.algorithm", "'fedadam.algorithm'"),
    "a built-in algorithm's name": ("fedavg.lr", "'fedavg.lr'"),
    "a million characters": ("fedadam." + "k" * 10**6, "'fedadam.kkk"),
}


@pytest.mark.parametrize("case", list(HOSTILE_KEYS))
def test_a_hostile_key_is_refused_naming_it_and_the_plugins_keys(case: str) -> None:
    key, named = HOSTILE_KEYS[case]
    message = _refused({"algorithm": ADAM, key: 0.1})
    assert message.startswith("unknown run config key(s): ") and named in message, message
    assert "the settings of algorithm 'fedadam:FEDADAM' are 'fedadam.eta'" in message, message


def test_a_key_of_a_million_characters_is_cut_in_the_message() -> None:
    message = _refused({"algorithm": ADAM, "fedadam." + "k" * 10**6: 0.1})
    assert "(1000010 characters)" in message, message[:300]


def test_a_dotted_key_on_a_built_in_algorithm_is_refused_naming_it() -> None:
    message = _refused({"algorithm": "fedavg", "fedavg.lr": 0.1})
    assert "'fedavg.lr'" in message and "algorithm 'fedavg' declares no settings of its own" in message, message


@pytest.mark.parametrize("prefix", ["fedadam.k", "k"])  # a plugin's keys, and keys of fedsynth's form
def test_a_hundred_thousand_unknown_keys_are_refused_at_once_naming_the_first(prefix: str) -> None:
    keys = {f"{prefix}{i}": i for i in range(100_000)}
    message = _refused({"algorithm": ADAM, **keys})
    first = sorted(keys)[:10]
    assert all(f"'{key}'" in message for key in first) and "and 99990 more" in message, message[:400]


# ----- the node's check of the train message ------------------------------------------------------------


def _node_settings():
    return parse_run_config({"algorithm": ADAM}, SERVER_STRATEGIES).own_settings


@pytest.mark.parametrize("case", list(HOSTILE_VALUES))
def test_the_node_refuses_a_hostile_message_value_naming_the_key(case: str) -> None:
    value, said = HOSTILE_VALUES[case]
    start = time.monotonic()
    with pytest.raises(ConfigError) as refusal:
        check_message({"fedadam.local-lr-scale": value}, ADAM, _node_settings(), coerce_value)
    assert time.monotonic() - start < SECONDS
    message = str(refusal.value)
    assert message.startswith("train message refused: run config key 'fedadam.local-lr-scale': "), message
    assert said in message and len(message) < LONGEST_MESSAGE, message[:300]


def test_the_node_reads_only_its_keys_of_a_hostile_message() -> None:
    """Extra keys (a hundred thousand, nested, odd) beside the plugin's are not the plugin's check's business:
    the node reads the keys its group sends and nothing else; the value it reads is the message's."""
    hostile = {f"fedadam.k{i}.x": [i] for i in range(100_000)} | {"fedadam.e\x00ta": None, "fedadam.eta": "x"}
    settings = check_message({**hostile, "fedadam.local-lr-scale": 0.25}, ADAM, _node_settings(), coerce_value)
    assert settings.local_lr_scale == 0.25
