"""A node checks every setting its train message carries, with the run config's own schema and checks.

The schema is the run config's: each key that the node reads from its message is declared once, in its part
(common/algorithms/*_settings.py ...), with `side` NODE or BOTH (common/keys.py), and `MESSAGE_KEYS` lists them.
The cases below are derived from that list, so a key added to it is covered with no edit here: for each key, a
message that lacks it, carries a value of the wrong type, NaN or infinity, or a value the run config refuses, is
refused by the node's check (common/run/client_settings.py `check_train_settings`) naming the key, and the node
accepts exactly the values the run config accepts.
"""

from __future__ import annotations

import math

import pytest

from common.algorithm_table import ALGORITHMS, COG_BASES
from common.algorithms.local_training_settings import ROUND_LR_KEY, LocalTrainingSettings, recipe_fields
from common.errors import ConfigError
from common.keys import NODE, node_fields, sent_to_nodes
from common.run.client_settings import (
    MESSAGE_KEYS, MESSAGE_ONLY_SETTINGS, RECIPE_KEYS, ROUND_KEYS, check_train_settings, client_keys, rule_settings,
)
from common.run.config import RunConfig, config_fields, parse_run_config
from server_app.registry import SERVER_STRATEGIES, train_config_of

_FIELDS = {f.name.replace("_", "-"): f for f in config_fields()}
# a good message: every key of the schema at the run config's default, in a round
_DEFAULTS = {key: _FIELDS[key].default for key in MESSAGE_KEYS}
_GOOD = {**_DEFAULTS, "server-round": 1}


def _kind(key: str) -> type:
    return type(_FIELDS[key].default)


def _wrong_types(key: str) -> list[object]:
    """Values of another type than the key's (as a ConfigRecord can carry them: text, numbers, lists, bytes)."""
    kind = _kind(key)
    wrong: list[object] = [b"\x00\x01", [1, 2]]
    if kind is bool:
        return wrong + ["maybe", 2]
    if kind in (int, float):
        wrong += ["abc", "", True]
        return wrong + [1.5] if kind is int else wrong
    return wrong + [3, 0.5, False]


# values each key is tried with: the node must refuse those the run config refuses and accept the others
_CANDIDATES: dict[type, list[object]] = {
    float: [-10.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 10.0, 1e12],
    int: [-10, -1, 0, 1, 2, 9, 10, 65536, 10**9],
    str: ["no-such-choice", "x" * 10_000, "a\x00b"],
    bool: [True, False, "true", "false"],
}


def _refused_by_the_run_config(key: str, value: object) -> bool:
    try:
        parse_run_config({key: value}, SERVER_STRATEGIES)
    except ConfigError:
        return True
    return False


def _refusal(config: dict, required=()) -> str | None:
    try:
        check_train_settings(config, required)
    except ValueError as err:  # ConfigError too
        return str(err)
    return None


def test_the_message_schema_is_the_run_configs_node_side_keys() -> None:
    """What any strategy of the app sends, every rule's keys and the recipe are declared keys of the schema."""
    assert set(RECIPE_KEYS) | {"lr"} <= set(MESSAGE_KEYS) and ROUND_LR_KEY == "lr" and "lr" not in RECIPE_KEYS
    assert all(_FIELDS[key].metadata["side"] == NODE for key in RECIPE_KEYS)
    # the recipe and the round's rate are the local training group's keys that travel, and nothing else
    assert {f.name for f in recipe_fields()} | {"lr"} == {f.name for f in node_fields(LocalTrainingSettings)}
    for name, row in ALGORITHMS.items():
        assert set(client_keys(name, row.decentralized, row.with_cog)) <= set(MESSAGE_KEYS), name
    runs = [{"algorithm": name, "model": "unet-small" if row.ddpm_only else "cnn"} for name, row in ALGORITHMS.items()]
    for raw in runs + [{"algorithm": base, "cog": True} for base in COG_BASES]:
        sent = train_config_of(parse_run_config(raw, SERVER_STRATEGIES), 2)
        run_config_keys = {key for key in sent if key in _FIELDS}
        assert run_config_keys <= set(MESSAGE_KEYS), (raw, run_config_keys - set(MESSAGE_KEYS))
        assert _refusal(sent, ROUND_KEYS + RECIPE_KEYS) is None, raw
    # a key the node never reads is not in the schema (the server's own: its rounds, its momentum, its data)
    assert not {"num-server-rounds", "server-momentum", "dataset", "seed", "lr-decay"} & set(MESSAGE_KEYS)
    assert [f.name for f in config_fields() if sent_to_nodes(f)] == [key.replace("-", "_") for key in MESSAGE_KEYS]


def test_a_good_message_passes() -> None:
    assert _refusal(_GOOD, MESSAGE_KEYS) is None


@pytest.mark.parametrize("key", MESSAGE_KEYS)
def test_a_message_that_lacks_a_key_is_refused_naming_it(key) -> None:
    config = {k: v for k, v in _GOOD.items() if k != key}
    reason = _refusal(config, (key,))
    assert reason is not None and f"lacks '{key}'" in reason


@pytest.mark.parametrize("key", MESSAGE_KEYS)
def test_a_mistyped_value_is_refused_naming_the_key(key) -> None:
    for value in _wrong_types(key):
        reason = _refusal({**_GOOD, key: value})
        assert reason is not None and f"'{key}'" in reason, (key, value)


@pytest.mark.parametrize("key", [key for key in MESSAGE_KEYS if _kind(key) in (int, float)])
def test_nan_and_infinity_are_refused_naming_the_key(key) -> None:
    for value in (math.nan, math.inf, -math.inf):
        reason = _refusal({**_GOOD, key: value})
        assert reason is not None and f"'{key}'" in reason, (key, value)


@pytest.mark.parametrize("key", MESSAGE_KEYS)
def test_the_node_refuses_exactly_what_the_run_config_refuses(key) -> None:
    refused = 0
    for value in _CANDIDATES[_kind(key)]:
        reason = _refusal({**_GOOD, key: value})
        assert (reason is not None) == _refused_by_the_run_config(key, value), (key, value, reason)
        if reason is not None:
            refused += 1
            assert f"'{key}'" in reason and len(reason) < 400, (key, reason[:500])
    # every key has a range or a choice that some candidate breaks, except a switch (a bool)
    assert refused > 0 or _kind(key) is bool, key


@pytest.mark.parametrize("key", sorted(MESSAGE_ONLY_SETTINGS))
def test_a_setting_that_is_no_run_config_key_is_checked_by_its_own_declaration(key) -> None:
    """`server-round`, and any setting a strategy declares in MESSAGE_ONLY_SETTINGS: what its check refuses is
    refused naming the key, the rest passes; a hostile value (NaN, a huge text, a list) is refused."""
    accepted, ok = MESSAGE_ONLY_SETTINGS[key]
    for value in [*_CANDIDATES[int], *_CANDIDATES[float], "abc", [1], b"x", math.nan, math.inf, True]:
        reason = _refusal({**_GOOD, key: value})
        assert (reason is None) == ok(value), (key, value, reason)
        if reason is not None:
            assert f"{key!r}" in reason and accepted in reason and len(reason) < 400


def test_the_issues_examples_and_the_round_are_refused_naming_them() -> None:
    cases = {"lr": -1, "sam-rho": -0.5, "proximal-mu": -10, "momentum": 1.0, "batch-size": 0,
             "local-optimizer": "rmsprop", "compression": "gzip"}
    for key, value in cases.items():
        reason = _refusal({**_GOOD, key: value})
        assert reason is not None and f"run config key '{key}' = {value!r}" in reason, reason
    assert "'lr': expected a number, got 'abc'" in _refusal({**_GOOD, "lr": "abc"})
    for value in (-1, 1.5, "1", True):
        assert "'server-round'" in _refusal({**_GOOD, "server-round": value})
    assert _refusal({**_GOOD, "server-round": 0}) is None  # FedDDPM's warm-up


def test_keys_outside_the_schema_are_left_to_the_rule_that_reads_them() -> None:
    """A developer's own node_settings, FedDDPM's phase: not run-config keys the node reads."""
    assert _refusal({**_GOOD, "my-own-setting": "anything", "phase": "warmup", "seed": "not checked"}) is None
    # a key of the run config that a plugin's rule reads from its message is checked when it is required
    assert "'seed'" in _refusal({**_GOOD, "seed": "x"}, ("seed",))


def test_the_recipe_round_trips_through_the_message() -> None:
    cfg = RunConfig(local_steps=3, batch_size=7, lr=0.2, momentum=0.5, weight_decay=1e-4, clip_grad_norm=2.0)
    sent = cfg.recipe_config("sgd")
    assert list(sent) == list(RECIPE_KEYS) == ["local-epochs", "local-steps", "batch-size", "momentum",
                                               "weight-decay", "clip-grad-norm", "local-optimizer"]
    assert sent["local-optimizer"] == "sgd" and cfg.recipe_config()["local-optimizer"] == "auto"
    recipe = rule_settings({**sent, ROUND_LR_KEY: 0.1}, LocalTrainingSettings)  # the node's reading of it
    assert recipe == LocalTrainingSettings(local_steps=3, batch_size=7, lr=0.1, momentum=0.5, weight_decay=1e-4,
                                           clip_grad_norm=2.0, local_optimizer="sgd")
    assert recipe.recipe_config() == sent
    with pytest.raises(ValueError, match="lacks 'momentum'"):
        rule_settings({k: v for k, v in {**sent, ROUND_LR_KEY: 0.1}.items() if k != "momentum"}, LocalTrainingSettings)
    with pytest.raises(ValueError, match="lacks 'lr'"):
        rule_settings(sent, LocalTrainingSettings)
    with pytest.raises(ConfigError, match="'momentum' = 1.0"):
        rule_settings({**sent, ROUND_LR_KEY: 0.1, "momentum": 1.0}, LocalTrainingSettings)


# ----- a rule's own settings group, read from the message (common/run/client_settings.py `rule_settings`) -----

def _rule_groups() -> list[type]:
    """The settings groups whose fields the nodes read: each built-in strategy class's that travel to the node, each
    row's (`settings`), and those a node reads beside them: FedCOG's part on a run with FedCOG plugged in, and
    FedDDPM's warm-up (`WarmupSettings`)."""
    from common.algorithms.cog_settings import CogSettings
    from common.algorithms.plugins import import_attribute
    from common.models.diffusion_settings import WarmupSettings
    from server_app.strategies.catalog import STRATEGY_CLASSES
    from server_app.strategies.parameters import settings_groups

    groups = {group for cls in STRATEGY_CLASSES.values() for group in settings_groups(cls) if node_fields(group)}
    groups |= {import_attribute(row.settings, "a row's settings group") for row in ALGORITHMS.values() if row.settings}
    groups |= {CogSettings, WarmupSettings}
    return sorted(groups, key=lambda group: group.__name__)


_RULE_CASES = [(group, f.name.replace("_", "-")) for group in _rule_groups() for f in node_fields(group)]


def _rule_refusal(group: type, config: dict) -> str | None:
    from common.run.client_settings import rule_settings

    try:
        rule_settings(config, group)
    except ValueError as err:  # ConfigError too
        return str(err)
    return None


def test_every_rule_group_is_read_back_as_the_server_sent_it() -> None:
    from common.keys import message_config
    from common.run.client_settings import rule_settings

    assert {group.__name__ for group in _rule_groups()} >= {"SAMSettings", "FedProxSettings", "MOONSettings",
                                                             "MoFedSAMSettings", "FedDynSAMSettings",
                                                             "SynSAMRuleSettings", "DFedAvgMSettings",
                                                             "CogSettings", "FedCOGRuleSettings", "WarmupSettings"}
    for group in _rule_groups():
        sent = group()
        assert rule_settings({**_GOOD, **message_config(group, sent)}, group) == sent, group


@pytest.mark.parametrize("group,key", _RULE_CASES, ids=lambda case: getattr(case, "__name__", case))
def test_a_rule_refuses_a_missing_mistyped_nan_or_out_of_range_setting_naming_it(group: type, key: str) -> None:
    good = {**_GOOD}
    assert _rule_refusal(group, good) is None
    missing = _rule_refusal(group, {k: v for k, v in good.items() if k != key})
    assert missing is not None and f"lacks '{key}'" in missing, missing
    for value in _wrong_types(key):
        reason = _rule_refusal(group, {**good, key: value})
        assert reason is not None and f"'{key}'" in reason, (key, value, reason)
    if _kind(key) in (int, float):
        for value in (math.nan, math.inf, -math.inf):
            reason = _rule_refusal(group, {**good, key: value})
            assert reason is not None and f"'{key}'" in reason, (key, value)
    refused = 0
    for value in _CANDIDATES[_kind(key)]:
        reason = _rule_refusal(group, {**good, key: value})
        assert (reason is not None) == _refused_by_the_run_config(key, value), (key, value, reason)
        refused += reason is not None
    assert refused > 0 or _kind(key) is bool, key  # each rule setting has a range or a choice, but a switch (`cog`)


def test_fedcogs_node_reads_its_settings_as_the_server_sent_them_and_refuses_a_bad_one_naming_it() -> None:
    """FedCOG's client plug-in (client_app/fedcog.py `with_cog`) reads its part through the job, as every rule's."""
    from types import SimpleNamespace

    from client_app.training import LocalJob
    from common.algorithms.cog_settings import CogSettings
    from common.keys import message_config

    sent = CogSettings(cog=True, cog_start_round=3, gen_budget=7, gen_lr=0.2, kd_weighting="fixed", lambda_kd=0.5)
    job = SimpleNamespace(settings={**_GOOD, **message_config(CogSettings, sent)})
    assert LocalJob.rule_settings(job, CogSettings) == sent
    for key, value in {"gen-budget": 0, "gen-lr": math.nan, "kd-weighting": "soft", "cog": "yes"}.items():
        with pytest.raises(ConfigError, match=f"'{key}'"):
            LocalJob.rule_settings(SimpleNamespace(settings={**job.settings, key: value}), CogSettings)


def test_the_warm_up_is_read_from_its_message_and_a_bad_length_refused_naming_the_key() -> None:
    """FedDDPM's warm-up length as fedsynth's node (`warmup_recipe`) and a ClientApp of one's own (`warmup_length`)
    read it: the server's values, and a missing, mistyped, NaN or out-of-range one refused naming the key."""
    from types import SimpleNamespace

    from flwr.app import ConfigRecord, RecordDict

    from client_app.diffusion import WARMUP_KEYS, warmup_recipe
    from client_app.diffusion_library import warmup_length

    def message(config: dict) -> SimpleNamespace:  # what warmup_length reads of a Message: its content
        return SimpleNamespace(content=RecordDict({"config": ConfigRecord(config)}))

    warmup = {**_GOOD, "server-round": 0, "phase": "warmup", "warmup-epochs": 3, "warmup-steps": 7}
    assert set(WARMUP_KEYS) == {"server-round", "lr", "warmup-epochs", "warmup-steps"}
    assert (warmup_recipe(warmup).local_epochs, warmup_recipe(warmup).local_steps) == (3, 7)
    assert warmup_length(message(warmup)) == (3, 7)
    for key, out_of_range in {"warmup-epochs": 0, "warmup-steps": -1}.items():
        for bad in (out_of_range, 1.5, "abc", math.nan):
            with pytest.raises(ConfigError, match=f"'{key}'"):
                warmup_recipe({**warmup, key: bad})
            with pytest.raises(ConfigError, match=f"'{key}'"):
                warmup_length(message({**warmup, key: bad}))
        with pytest.raises(ValueError, match=f"lacks '{key}'"):
            warmup_length(message({k: v for k, v in warmup.items() if k != key}))
