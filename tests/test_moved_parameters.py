"""A flat parameter of the last release that is now a field of a grouped value is refused naming where it went.

`FedAvg(node_settings=...)` was a parameter; it is a field of `wiring=AppWiring(...)` now, and the relay's
`topology`, `peers` and `mixing` fields of `gossip=Gossip(...)`; `bounded_influence` is the field `influence` of
`aggregation=Bounded(...)`. Each is refused with a TypeError that names the grouped parameter and how to pass it,
found from the constructor's types alone (server_app/strategies/parameters.py `moved_parameter`), and a name that
is nowhere still gets the nearest valid parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import fedsynth.strategies as public
from server_app.strategies.parameters import moved_parameter

WIRING = ["node_settings", "nodes", "lr_schedule", "parameter_names"]
GOSSIP = ["topology", "peers", "mixing"]


@pytest.mark.parametrize("cls", [public.FedAvg, public.FedSAM, public.Scaffold, public.FedSynSAM, public.DFedAvg],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", WIRING)
def test_the_wirings_former_parameters_name_app_wiring(cls: type, name: str) -> None:
    owner = cls.__name__
    with pytest.raises(TypeError) as refused:
        cls(**{name: None})
    assert str(refused.value) == (f"{owner}: parameter {name!r} is a field of `wiring`, not a parameter of {owner}: "
                                  f"pass wiring=AppWiring({name}=...)")


@pytest.mark.parametrize("cls", [public.DFedAvg, public.DFedSAM, public.OledFL], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", GOSSIP)
def test_the_relays_former_graph_parameters_name_gossip(cls: type, name: str) -> None:
    owner = cls.__name__
    with pytest.raises(TypeError) as refused:
        cls(**{name: "ring"})
    assert str(refused.value) == (f"{owner}: parameter {name!r} is a field of `gossip`, not a parameter of {owner}: "
                                  f"pass gossip=Gossip({name}=...)")


@pytest.mark.parametrize("cls", [public.FedAvg, public.FedSynSAM, public.FedDDPMPlus], ids=lambda c: c.__name__)
def test_bounded_influence_names_the_bounded_aggregation(cls: type) -> None:
    owner = cls.__name__
    with pytest.raises(TypeError) as refused:
        cls(bounded_influence=public.BOUNDED_INFLUENCE)
    assert str(refused.value) == (f"{owner}: parameter 'bounded_influence' is the field `influence` of `aggregation`, "
                                  f"not a parameter of {owner}: pass aggregation=Bounded(mean=..., influence=...)")
    # the form it names builds, with the bounds the old parameter gave
    built = cls(aggregation=public.Bounded("weighted", public.BOUNDED_INFLUENCE))
    assert (built.max_weight_share, built.max_update_norm_ratio) == (0.4, 1.5)


def test_the_relay_keeps_its_bounds_parameter() -> None:
    assert public.DFedAvg(bounded_influence=public.BOUNDED_INFLUENCE).max_weight_share == 0.4


@pytest.mark.parametrize(("cls", "name", "nearest"), [(public.FedAvg, "server_lrr", "server_lr"),
                                                      (public.FedProx, "proximal_mue", "proximal_mu"),
                                                      (public.DFedAvg, "gosip", "gossip")])
def test_a_name_that_is_nowhere_still_gets_the_nearest_parameter(cls: type, name: str, nearest: str) -> None:
    with pytest.raises(TypeError, match=rf"{cls.__name__}: unknown parameter {name!r}; did you mean {nearest!r}\?"):
        cls(**{name: 1})


@dataclass(frozen=True)
class Schedule:
    warmup_rounds: int = 0
    ramp: float = 1.0


@dataclass(frozen=True)
class Staged:
    stages: int
    timing: Schedule = Schedule()


def test_a_new_grouped_value_is_found_from_the_types_alone() -> None:
    """No list of moved names: a field of any dataclass a parameter takes (through `X | None`), or a field named
    after its type's class, is found; a name that is neither is not."""
    types = {"seed": int, "staging": Staged | None}
    assert moved_parameter("stages", types) == ("a field of `staging`", "staging=Staged(stages=...)")
    assert moved_parameter("schedule", types) == ("the field `timing` of `staging`",
                                                  "staging=Staged(stages=..., timing=...)")
    assert moved_parameter("warmup_rounds", {"timing": Schedule}) == ("a field of `timing`",
                                                                      "timing=Schedule(warmup_rounds=...)")
    assert moved_parameter("seed", types) is None and moved_parameter("ramp", types) is None
