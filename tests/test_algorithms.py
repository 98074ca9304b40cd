"""The algorithm table (common/algorithm_table.py) and its halves: each app covers exactly the table's names.

- server_app/registry.py: every algorithm's server rule is a class there, and only the table's names are registered;
- client_app/registry.py: every algorithm has a client update function, and no other name has one;
- the decentralized rules (client_app/decentralized.py) and the relay's algorithms are the table's decentralized
  rows;
- the `X+cog` rows are generated from the rows FedCOG plugs into, and what used to be name lists are fields;
- the settings the train config carries are the table's client keys, under run-config names;
- fedsynth.strategies: the class the app builds for an algorithm is the class exported under the table's
  `strategy` name (one class per algorithm), and every exported strategy class is named in the table.
"""

from __future__ import annotations

import inspect

from client_app import decentralized as decentralized_rules
from client_app.registry import CLIENT_UPDATES
from common.algorithm_table import ALGORITHMS, COG_BASES
from common.algorithms.plugins import rule_keys
from common.algorithms.cog_settings import COG_KEYS
from common.run.client_settings import CODEC_KEYS, client_keys
from common.run.config import RunConfig, parse_run_config
from common.algorithms.gossip import DECENTRALIZED_ALGORITHMS
from fedsynth import strategies
from server_app.strategies.relay import DecentralizedRelay
from server_app.registry import SERVER_STRATEGIES, build_strategy


def test_the_server_half_covers_exactly_the_table() -> None:
    assert list(SERVER_STRATEGIES) == list(ALGORITHMS)
    for name, algorithm in ALGORITHMS.items():
        assert issubclass(SERVER_STRATEGIES[name], DecentralizedRelay) == algorithm.decentralized, name


def test_the_client_half_covers_exactly_the_table() -> None:
    assert set(CLIENT_UPDATES) == set(ALGORITHMS)
    assert all(callable(update) for update in CLIENT_UPDATES.values())


def test_the_decentralized_rules_are_the_tables_decentralized_rows() -> None:
    decentralized = {name for name, algorithm in ALGORITHMS.items() if algorithm.decentralized}
    assert set(DECENTRALIZED_ALGORITHMS) == decentralized
    for name in decentralized:
        assert ALGORITHMS[name].client.startswith("client_app.decentralized:"), name
        assert CLIENT_UPDATES[name] is getattr(decentralized_rules, CLIENT_UPDATES[name].__name__), name


def test_the_client_keys_are_run_config_keys_and_travel_in_the_train_config() -> None:
    fields = set(vars(RunConfig()))
    for name, algorithm in ALGORITHMS.items():
        assert all(key.replace("-", "_") in fields for key in rule_keys(algorithm)), name
        cog = algorithm.with_cog  # FedCOG plugged in: its settings travel too
        expected = (set(rule_keys(algorithm)) | (set() if algorithm.decentralized else set(CODEC_KEYS))
                    | (set(COG_KEYS) if cog else set()))
        assert set(client_keys(name, algorithm.decentralized, cog)) == expected
        model = "unet-small" if algorithm.ddpm_only else "cnn"
        cfg = parse_run_config({"algorithm": name, "model": model}, ALGORITHMS)
        strategy = build_strategy(cfg, [])
        assert set(strategy.client_config()) == expected, name


def test_cog_true_sends_fedcogs_settings_beside_the_bases() -> None:
    for base in COG_BASES:
        cfg = parse_run_config({"algorithm": base, "cog": True, "gen-budget": 7}, ALGORITHMS)
        sent = build_strategy(cfg, []).client_config()
        assert set(sent) == set(client_keys(base, False, cog=True)), base
        assert sent["gen-budget"] == 7 and sent["cog-start-round"] == cfg.first_cog_round(cfg.num_server_rounds)


def test_the_class_the_app_builds_is_the_class_fedsynth_strategies_exports() -> None:
    named = {algorithm.strategy_name for algorithm in ALGORITHMS.values()}
    classes = {name for name in strategies.__all__ if hasattr(getattr(strategies, name), "configure_train")}
    assert named == classes
    for name, algorithm in ALGORITHMS.items():
        exported = getattr(strategies, algorithm.strategy_name)
        assert SERVER_STRATEGIES[name] is exported, name
        # its parameters include every setting its nodes read (it sends them in the train config)
        parameters = set(inspect.signature(exported).parameters)
        assert {key.replace("-", "_") for key in rule_keys(algorithm)} <= parameters, name
        if not algorithm.decentralized:  # and the uplink codec, with which it decodes the replies
            assert "codec" in parameters, name


def test_the_cog_rows_are_their_bases_with_fedcog() -> None:
    bases = [name for name, algorithm in ALGORITHMS.items() if algorithm.cog_base]
    assert {"fedavg", "fedavgm", "fedprox", "scaffold", "moon"} <= set(bases)  # SPEC 4.2 (a new row may add itself)
    assert COG_BASES == tuple(bases)
    for base in bases:
        row, cog = ALGORITHMS[base], ALGORITHMS[f"{base}+cog"]
        assert (cog.server, rule_keys(cog), cog.strategy, cog.client) == (row.server, rule_keys(row), row.strategy,
                                                                          row.client)
        assert cog.with_cog and not cog.cog_base and not cog.trains_ddpm
        assert CLIENT_UPDATES[f"{base}+cog"].__name__ == f"{CLIENT_UPDATES[base].__name__}_with_cog"
        assert SERVER_STRATEGIES[f"{base}+cog"] is SERVER_STRATEGIES[base]
    assert {name for name, algorithm in ALGORITHMS.items() if algorithm.with_cog} == {f"{b}+cog" for b in bases} | {
        "fedcog"}


# the name lists the row fields replaced: those rows are marked (a new row sets its own fields)
REPLACED_LISTS = {"ddpm_only": {"fedddpm", "fedddpm+"},
                  "trains_ddpm": {"fedavg", "fedavgm", "fedprox", "scaffold", "fedsam", "mofedsam", "fedddpm",
                                  "fedddpm+"},
                  "projection_head": {"moon", "moon+cog"}}


def test_the_fields_that_replaced_name_lists_mark_the_same_algorithms() -> None:
    for field, names in REPLACED_LISTS.items():
        assert names <= {name for name, a in ALGORITHMS.items() if getattr(a, field)}, field
    assert not ALGORITHMS["fedcog"].trains_ddpm and not ALGORITHMS["fedavg"].ddpm_only  # and only those
    assert not ALGORITHMS["fedavg"].projection_head and not ALGORITHMS["fedavg+cog"].trains_ddpm
    assert all(a.trains_ddpm for a in ALGORITHMS.values() if a.ddpm_only)
    assert all("moon-mu" in rule_keys(a) for a in ALGORITHMS.values() if a.projection_head)
    assert parse_run_config({"algorithm": "fedddpm"}, ALGORITHMS).model == "unet-paper-mnist"
    assert parse_run_config({"algorithm": "fedavg"}, ALGORITHMS).model == "cnn"
