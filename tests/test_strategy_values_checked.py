"""A public strategy's constructor refuses what the run config refuses, with the run config's message (issue 54/52)."""

from __future__ import annotations

import inspect
import math

import pytest

import fedsynth.strategies as public
from common.errors import ConfigError
from common.run.config import parse_run_config

# (parameter, value): the list of bad calls, and a few more kinds (a choice, a bool, a family's own key)
BAD_CALLS = [
    ("aggregation", "weigthed"), ("aggregation", 0), ("aggregation", None), ("min_nodes", 0), ("fraction_train", 0), ("fraction_train", math.inf),
    ("seed", -1), ("server_lr", 0), ("max_failed_rounds", 0.5),
]

# (value object, its field, the run-config key it mirrors, a bad value): a grouped option refuses a bad value
# when it is built, with the run config's message under its own name
BAD_VALUES = [
    # (the run config's "unset" values, max-weight-share 0 and max-update-norm-ratio -1, are valid keys there; a
    # BoundedInfluence refuses them in its own words: tests/test_paper_rule_defaults.py)
    *[(public.BoundedInfluence, "weight_share", "max_weight_share", v) for v in (-1, 1.5, 2, math.nan, "0.5")],
    *[(public.BoundedInfluence, "update_norm_ratio", "max_update_norm_ratio", v) for v in (-2, math.nan, 1e-9, "1.5")],
    (public.BoundedInfluence, "update_norm", "max_update_norm", -1.0),
    (public.BoundedInfluence, "action", "update_norm_action", "drop"),
    (public.QSGD, "bits", "bits", 2.5), (public.QSGD, "bits", "bits", 1), (public.QSGD, "error_feedback", "error_feedback", 1),
    (public.QSGD, "qsgd_scope", "qsgd_scope", "layer"), (public.QSGD, "qsgd_bucket", "qsgd_bucket", 0),
    (public.QSGD, "levels", "levels", -1), (public.TopK, "topk_ratio", "topk_ratio", 0),
    (public.TopK, "error_feedback", "error_feedback", "yes"),
    (public.TrimmedMean, "fraction", "trim_fraction", 0.5), (public.Krum, "byzantine_nodes", "byzantine_nodes", -1),
]

STRATEGIES = [getattr(public, name) for name in public.__all__
              if isinstance(getattr(public, name), type) and hasattr(getattr(public, name), "start")]


def run_config_message(parameter: str, value: object) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_run_config({parameter.replace("_", "-"): value}, ["fedavg"])
    return str(refused.value)


@pytest.mark.parametrize(("parameter", "value"), BAD_CALLS, ids=[f"{p}={v!r}" for p, v in BAD_CALLS])
def test_fedavg_refuses_a_bad_value_with_the_run_configs_message(parameter, value):
    with pytest.raises(ConfigError) as refused:
        public.FedAvg(**{parameter: value})
    assert str(refused.value) == f"FedAvg: {run_config_message(parameter, value)}"


@pytest.mark.parametrize(("value_class", "field", "key", "value"), BAD_VALUES,
                         ids=[f"{c.__name__}.{f}={v!r}" for c, f, _, v in BAD_VALUES])
def test_a_grouped_option_refuses_a_bad_value_with_the_run_configs_message(value_class, field, key, value):
    with pytest.raises(ConfigError) as refused:
        value_class(**{field: value})
    assert str(refused.value) == f"{value_class.__name__}: {run_config_message(key, value)}"


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda c: c.__name__)
def test_every_public_strategy_checks_each_run_config_parameter_it_takes(strategy):
    parameters = inspect.signature(strategy).parameters
    refused = 0
    for parameter, value in BAD_CALLS:
        if parameter not in parameters:
            continue
        with pytest.raises(ConfigError, match=f"^{strategy.__name__}: run config key"):
            strategy(**{parameter: value})
        refused += 1
    assert refused >= 3  # every class takes min_nodes, max_failed_rounds and seed


def test_a_familys_own_parameter_is_checked_too():
    message = run_config_message("sam_rho", -0.1)
    with pytest.raises(ConfigError) as refused:
        public.FedSAM(sam_rho=-0.1)
    assert str(refused.value) == f"FedSAM: {message}"
    with pytest.raises(ConfigError, match="'synthetic-ipc'"):
        public.FedSynSAM(distillation=public.DistillationSettings(synthetic_ipc=0))
    with pytest.raises(ConfigError, match="'ole-beta'"):
        public.OledFL(ole_beta=math.nan)


@pytest.mark.parametrize(("parameter", "value"), [("fraction_evaluate", 1.5), ("fraction_evaluate", math.nan),
                                                  ("min_available_nodes", -1), ("weighted_by_key", "")])
def test_parameters_that_are_not_run_config_keys_are_checked(parameter, value):
    with pytest.raises(ConfigError, match=f"FedAvg: parameter {parameter} = .* is invalid"):
        public.FedAvg(**{parameter: value})


def test_good_values_build_and_are_kept():
    bounds = public.BoundedInfluence(weight_share=0.5, update_norm_ratio=2)
    strategy = public.FedAvg(aggregation=public.Bounded("uniform", bounds), min_nodes=2)
    assert (strategy.max_weight_share, strategy.max_update_norm_ratio, strategy.min_nodes) == (0.5, 2, 2)
    assert strategy.bounded_influence is bounds and strategy.aggregation == "uniform"
    plain = public.FedAvg(aggregation="uniform")
    assert (plain.aggregation, plain.bounded_influence, plain.max_weight_share, plain.max_update_norm_ratio) == (
        "uniform", None, 1.0, 0.0)
    robust = public.FedAvg(aggregation=public.Bounded(public.Krum(2), public.BoundedInfluence(update_norm=3.0)))
    assert (robust.aggregation, robust.byzantine_nodes, robust.max_update_norm) == ("krum", 2, 3.0)
    robust = public.FedAvg(aggregation=public.TrimmedMean(0.1))
    assert (robust.aggregation, robust.trim_fraction) == ("trimmed-mean", 0.1)
    assert public.FedAvg(codec=public.QSGD(bits=8, qsgd_scope="bucket")).client_config()["bits"] == 8
    assert public.FedSAM(sam_rho=0.1).sam_rho == 0.1
    assert "sam_rho" in inspect.signature(public.FedSAM).parameters  # the check keeps help()'s signature


def test_a_bounded_mean_is_checked_as_a_plain_one_and_bounds_alone_are_refused_naming_bounded():
    """`Bounded(mean, influence)`: its mean refused as the run config refuses the key, bounds without a mean (the
    last release's `bounded_influence` value given as `aggregation`) refused naming the form to use."""
    with pytest.raises(ConfigError) as refused:
        public.FedAvg(aggregation=public.Bounded("weigthed"))
    assert str(refused.value) == f"FedAvg: {run_config_message('aggregation', 'weigthed')}"
    with pytest.raises(ConfigError, match=r"FedAvg: parameter aggregation = BoundedInfluence\(.*\) gives bounds "
                                          r"without their mean; pass aggregation=Bounded\(mean, influence=...\)"):
        public.FedAvg(aggregation=public.BOUNDED_INFLUENCE)
    with pytest.raises(ConfigError, match="Bounded: mean = None is invalid"):
        public.Bounded(None)
    with pytest.raises(ConfigError, match="Bounded: influence = 0.4 is invalid; accepted: a BoundedInfluence"):
        public.Bounded("weighted", 0.4)
    assert public.Bounded("uniform").influence is public.BOUNDED_INFLUENCE  # `bounded-influence = true`'s bounds


@pytest.mark.parametrize(("parameter", "value"), [
    ("node_settings", "lr=1"), ("node_settings", {"lr": math.nan}), ("node_settings", {"lr": object()}),
    ("lr_schedule", 0.1), ("nodes", "all"), ("nodes", [1, 2]), ("parameter_names", "w"), ("parameter_names", [1, 2]),
])
def test_the_wiring_without_a_plain_default_is_checked_by_name(parameter, value):
    """The hostile probe's finds (benchmarks/results/hostile-probe.md): accepted, or an AttributeError from inside."""
    with pytest.raises(ConfigError, match=f"^AppWiring: parameter {parameter} = .* is invalid; accepted: "):
        public.AppWiring(**{parameter: value})


@pytest.mark.parametrize(("parameter", "value"), [("wiring", {"nodes": None}), ("gossip", "ring")])
def test_the_grouped_values_are_checked_by_type(parameter, value):
    cls = public.FedAvg if parameter == "wiring" else public.DFedAvg
    with pytest.raises(ConfigError, match=f"^{cls.__name__}: parameter {parameter} = .* is invalid; accepted: None or"):
        cls(**{parameter: value})
    with pytest.raises(ConfigError, match="^Gossip: run config key 'peers'"):
        public.Gossip(peers=0)


def test_oledfl_s_sam_switch_takes_a_bool_only():
    with pytest.raises(ConfigError, match="OledFL: parameter sam = 1 is invalid; accepted: true or false"):
        public.OledFL(sam=1)
    public.OledFL(sam=True)


def test_the_codec_is_one_value_from_the_parameter_to_the_train_message():
    """The codec entries a strategy sends are its codec's fields under their keys, in the group's order; a codec
    that is no checked CodecSettings is refused naming the parameter or the key."""
    sent = public.FedAvg(codec=public.QSGD(bits=8, qsgd_scope="bucket", error_feedback=True)).client_config()
    assert list(sent.items())[:7] == [("compression", "qsgd"), ("bits", 8), ("levels", 0), ("qsgd-scope", "bucket"),
                                      ("qsgd-bucket", 512), ("topk-ratio", 0.1), ("error-feedback", True)]
    # a field the method does not read is sent at its default, as from a run config
    assert public.FedAvg(codec=public.CodecSettings("topk", bits=8)).codec == public.TopK()
    with pytest.raises(ConfigError, match="^FedAvg: parameter codec = 'qsgd' is invalid; accepted: None or an uplink"):
        public.FedAvg(codec="qsgd")
    with pytest.raises(ConfigError, match="^run config key 'bits' = 1 is invalid"):
        public.FedAvg(codec=public.CodecSettings("qsgd", bits=1))
    with pytest.raises(ConfigError, match="^QSGD: run config key 'bits' = 4.0 is invalid"):
        public.QSGD(bits=4.0)


def test_node_settings_cannot_override_a_setting_the_class_sends_from_its_own_parameter():
    with pytest.raises(ConfigError, match=r"^FedAvg: node_settings key 'bits' = 8 overrides what the strategy sends its "
                                          r"nodes from its parameter codec = CodecSettings\(compression='qsgd', "
                                          r"bits=4.*\); set codec instead"):
        public.FedAvg(codec=public.QSGD(bits=4), wiring=public.AppWiring(node_settings={"bits": 8}))
    with pytest.raises(ConfigError, match="node_settings key 'compression' = 'qsgd' overrides .* codec = None"):
        public.FedAvg(wiring=public.AppWiring(node_settings={"compression": "qsgd"}))  # the nodes would compress, the server not decode
    with pytest.raises(ConfigError, match="node_settings key 'sam-rho' = 0.2 overrides .* sam_rho = 0.1; set sam_rho"):
        public.FedSAM(sam_rho=0.1, wiring=public.AppWiring(node_settings={"sam-rho": 0.2}))
    # the same value, and your own
    public.FedSAM(sam_rho=0.1, wiring=public.AppWiring(node_settings={"sam-rho": 0.1, "my-setting": [1, 2]}))


def test_the_relay_refuses_parameter_names_it_would_not_use():
    """The relay forwards whole models: the centralized classes' trainable names would silently do nothing."""
    with pytest.raises(ConfigError, match="^DFedAvg: wiring.parameter_names is the centralized strategies'"):
        public.DFedAvg(wiring=public.AppWiring(parameter_names=["w"]))
    relay = public.DFedAvg(gossip=public.Gossip(topology="full", relay_mixing=True),
                           wiring=public.AppWiring(node_settings={"my-setting": 1}))
    assert (relay.gossip.topology, relay.gossip.relay_mixing, relay.client_config()) == ("full", True,
                                                                                       {"my-setting": 1})
