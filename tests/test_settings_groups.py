"""A strategy class's settings group (issue 63): `settings = Group` is the class's constructor, checks,
attributes and train-message config, and the node reads the same group back (server_app/strategies/parameters.py
`with_settings`, common/run/client_settings.py `rule_settings`).

A class defined here, outside fedsynth's table, declares a group of its own: it gets one keyword parameter per
field before its parent's, visible in `inspect.signature` and `help()`, each value checked by the group's checks
and kept as an attribute; the group's NODE fields travel in every train message under their keys, and the node
refuses a bad one naming the key. No built-in class writes a constructor that re-declares its parent's.
"""

from __future__ import annotations

import inspect
import math
import pydoc
from dataclasses import dataclass

import pytest

import fedsynth.strategies as public
from common.errors import ConfigError
from common.keys import NODE, SERVER, key, require
from common.run.client_settings import rule_settings
from server_app.strategies.catalog import STRATEGY_CLASSES
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.parameters import declared_parameters, documented
from server_app.strategies.relay import DecentralizedRelay


@dataclass(frozen=True)
class NovaSettings:
    """A test algorithm's settings: a radius its nodes read, and a server-side count."""

    nova_rho: float = key(0.1, "Nova's radius.", side=NODE)
    nova_rounds: int = key(2, "Nova's server rounds.", side=SERVER)

    def check(self) -> None:
        require(self.nova_rho >= 0, "nova-rho", self.nova_rho, "a number >= 0")
        require(self.nova_rounds >= 1, "nova-rounds", self.nova_rounds, "an integer >= 1")


@documented
class Nova(FedAvg):
    """Nova: FedAvg's server; its nodes read its radius."""

    settings = NovaSettings

    def __post_init__(self) -> None:
        self.nova_state: dict[int, float] = {}


def test_the_group_is_the_constructor_the_signature_and_help() -> None:
    parameters = list(inspect.signature(Nova).parameters)
    assert parameters[:2] == ["nova_rho", "nova_rounds"]
    assert parameters[2:] == list(inspect.signature(FedAvg).parameters)
    assert inspect.signature(Nova).parameters["nova_rho"].default == 0.1
    text = pydoc.render_doc(Nova, renderer=pydoc.plaintext)
    assert "nova_rho : float (default: 0.1)" in text and "Nova's radius" in text
    assert 'Sent to the nodes as "nova-rho"' in text
    assert "nova_rounds : int (default: 2)" in text and 'as "nova-rounds"' not in text


def test_values_are_checked_kept_and_sent() -> None:
    strategy = Nova(nova_rho=0.3, server_lr=0.5)
    assert (strategy.nova_rho, strategy.nova_rounds, strategy.server_lr, strategy.nova_state) == (0.3, 2, 0.5, {})
    sent = strategy.client_config()
    # a class outside the table is a plugin: its own keys travel under its name (common/run/own_settings.py)
    assert sent["nova.nova-rho"] == 0.3 and not any("nova-rounds" in key for key in sent)  # only NODE/BOTH fields
    assert isinstance(Nova(nova_rho=1).nova_rho, float)  # coerced as the run config coerces its key
    with pytest.raises(ConfigError, match=r"Nova: run config key 'nova-rho' = -1.0 is invalid"):
        Nova(nova_rho=-1)
    with pytest.raises(ConfigError, match=r"Nova: run config key 'nova-rho': expected a finite number"):
        Nova(nova_rho=math.nan)
    with pytest.raises(ConfigError, match=r"Nova: run config key 'nova-rounds': expected an integer"):
        Nova(nova_rounds="two")
    with pytest.raises(TypeError, match=r"Nova: unknown parameter 'nova_rhoo'; did you mean 'nova_rho'"):
        Nova(nova_rhoo=1.0)
    with pytest.raises(ConfigError, match="overrides what the strategy sends"):
        Nova(nova_rho=0.3, wiring=public.AppWiring(node_settings={"nova-rho": 0.4}))


def test_the_node_reads_the_group_back_and_refuses_a_bad_value_naming_the_key() -> None:
    # as a built-in's group travels: under its bare keys (a plugin's node reads its own under "<name>.<key>")
    config = {"nova-rho": 0.25}
    assert rule_settings(config, NovaSettings) == NovaSettings(nova_rho=0.25)
    with pytest.raises(ValueError, match="lacks 'nova-rho'"):
        rule_settings({}, NovaSettings)
    for value in ("abc", math.inf, -0.5, [1.0]):
        with pytest.raises(ConfigError, match="'nova-rho'"):
            rule_settings({"nova-rho": value}, NovaSettings)


def test_the_app_fills_the_declared_parameters() -> None:
    assert declared_parameters(Nova)[:2] == ["nova_rho", "nova_rounds"]
    assert set(declared_parameters(Nova)) == set(inspect.signature(Nova).parameters)
    assert "correction_epochs" not in declared_parameters(public.FedDDPMPlus)  # its parent's, fixed
    for cls in STRATEGY_CLASSES.values():
        assert set(declared_parameters(cls)) == set(inspect.signature(cls).parameters), cls


def test_a_constructor_that_hides_its_parameters_is_refused_naming_the_class() -> None:
    class Forwarding(FedAvg):
        def __init__(self, *, nova_rho: float = 0.1, **kwargs) -> None:
            super().__init__(**kwargs)

    with pytest.raises(TypeError, match="Forwarding's constructor takes"):
        declared_parameters(Forwarding)


def test_no_built_in_class_writes_a_constructor_that_forwards_its_parents() -> None:
    """Only the two bases write theirs (FedAvg's round machinery, the relay's); every algorithm's class is its
    docstring, its settings group and its overrides."""
    written = {klass.__name__ for cls in STRATEGY_CLASSES.values() for klass in cls.__mro__
               if "__init__" in klass.__dict__ and not hasattr(klass.__dict__["__init__"], "settings_group")
               and issubclass(klass, (FedAvg, DecentralizedRelay))}
    assert written == {"FedAvg", "DecentralizedRelay"}, written
