"""A setting's key is spelled in one place, its declaration (issue 63: "each algorithm defined once").

Every key of the settings groups fedsynth's strategy classes declare (`settings`: common/algorithms/rule_settings.py
and the other groups; FedSAM's `sam-rho`, FedProx's `proximal-mu`, ...) travels as the group's field: the class's
parameter, the train message's entry and the node's read all come from the group, so the key's text stands only
in the module that declares it (its field and its check's message), in the generated docs (docs/*.md, not
scanned here) and in tests. The scan reads the library's code (common/, server_app/, client_app/, fedsynth/);
the run-config files a user writes (pyproject.toml, studies/, benchmarks' run configs, the hand-written docs)
name keys by design and are not scanned.

`ALLOWED` lists the only other places, each with why it is no use of the setting. The run's shared groups
(`SHARED_GROUPS`: the uplink codec, one value from the run config to the wire) are held to the same rule, their keys
looked for quoted (they are common words: "bits", "levels"). The other keys a train message carries (the local
training recipe, FedCOG's, FedDDPM's warm-up) are not yet a settings group: `NOT_YET_GROUPED` lists the files that
still spell each (quoted), and may only shrink.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from common.algorithms.codec_settings import CodecSettings
from common.keys import key_name, own_fields, sent_to_nodes
from common.run.config import config_fields
from server_app.strategies.catalog import STRATEGY_CLASSES
from server_app.strategies.parameters import settings_groups

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("common", "server_app", "client_app", "fedsynth")

# Files where a group's key may stand although it is no use of the setting (file -> why).
ALLOWED: dict[str, str] = {
    # the rows' paper rules: each names the shared keys its paper fixes (`PaperRule.keys`; their values are the
    # keys' declared defaults) and its server step's text names them; docs/algorithms.md's paper-rule table and
    # tests/test_paper_rule_defaults.py are generated from / check them
    "common/algorithm_table.py": "a row's paper rule",
}

# The run's shared settings groups, each one value from the run config to the wire: the strategy holds it, the train
# message carries its fields, the node reads it back (common/run/client_settings.py `message_codec`).
SHARED_GROUPS: tuple[type, ...] = (CodecSettings,)
# (key, file) -> why a shared group's key stands quoted in that file although it is no use of the setting
HOMONYMS: dict[tuple[str, str], str] = {
    ("levels", "common/uplink/payloads.py"): "a qsgd payload's array of packed levels, named so on the wire",
}

# The train message's other keys, not yet a strategy class's settings group: the files that still spell each
# (quoted, as a string or in backticks). Moving a key into a group removes its entry; nothing may be added.
NOT_YET_GROUPED: dict[str, tuple[str, ...]] = {
    "local-epochs": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py",
                     "client_app/app.py", "client_app/training.py"),
    "local-steps": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py",
                    "server_app/reply_checks.py", "server_app/strategies/metric_means.py", "client_app/app.py",
                    "client_app/diffusion.py", "client_app/training.py", "fedsynth/algorithm.py"),
    "batch-size": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py",
                   "client_app/app.py", "client_app/fedcog.py", "client_app/training.py"),
    "lr": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py", "common/run/config.py",
           "server_app/registry.py", "server_app/strategies/fedavg.py", "server_app/strategies/fedddpm.py",
           "server_app/strategies/fedddpm_warmup.py", "server_app/strategies/quicktest_scorer.py",  # moved from FedDDPM(+)
           "server_app/strategies/relay.py", "server_app/strategies/round_log.py",
           "client_app/app.py", "client_app/decentralized.py", "client_app/diffusion.py", "client_app/training.py",
           "fedsynth/client.py", "fedsynth/strategies/__init__.py"),
    "momentum": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py", "client_app/app.py",
                 "client_app/training.py"),
    "weight-decay": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py",
                     "client_app/app.py", "client_app/training.py"),
    "clip-grad-norm": ("common/algorithms/local_training_settings.py", "common/run/client_settings.py",
                       "client_app/app.py", "client_app/training.py"),
    "local-optimizer": ("common/algorithms/local_training_settings.py", "common/models/diffusion.py",
                        "common/run/client_settings.py", "server_app/strategies/fedddpm.py", "client_app/app.py",
                        "client_app/training.py"),
    "cog": ("common/run/client_settings.py", "common/run/config.py", "client_app/app.py"),
    # the fedcog row's client_keys (the base table imports no floor of common/, so not COG_START_KEY)
    "cog-start-round": ("common/algorithms/cog_settings.py", "common/algorithm_table.py"),
    "gen-budget": ("common/algorithms/cog_settings.py", "common/algorithm_table.py"),
    "gen-steps": ("common/algorithms/cog_settings.py", "common/algorithm_table.py",
                  "server_app/strategies/parameters.py"),
    "gen-lr": ("common/algorithms/cog_settings.py", "common/algorithm_table.py"),
    "lambda-dis": ("common/algorithms/cog_settings.py", "common/algorithm_table.py"),
    "kd-weighting": ("common/algorithms/cog_settings.py", "common/algorithm_table.py"),
    "lambda-kd": ("common/algorithms/cog_settings.py",),
    "cog-ablation": ("common/algorithms/cog_settings.py",),
    "cog-grid-partition": ("common/algorithms/cog_settings.py",),
    # FedDDPM's warm-up message moved to its collaborator (server_app/strategies/fedddpm_warmup.py)
    "warmup-epochs": ("common/algorithm_table.py", "common/models/diffusion_settings.py",
                      "server_app/strategies/fedddpm.py", "server_app/strategies/fedddpm_warmup.py",
                      "client_app/diffusion.py", "client_app/diffusion_library.py"),
    "warmup-steps": ("common/models/diffusion_settings.py", "server_app/strategies/fedddpm_warmup.py",
                     "client_app/diffusion.py", "client_app/diffusion_library.py"),
}


def source_files() -> dict[str, str]:
    """The library's code, path (relative to the repository) -> text."""
    return {str(path.relative_to(ROOT)): path.read_text() for root in SOURCES
            for path in sorted((ROOT / root).rglob("*.py"))}


def run_config_keys() -> set[str]:
    return {key_name(f.name) for f in config_fields()}


def group_keys() -> dict[str, str]:
    """Every run-config key of a settings group a built-in strategy class declares -> the file declaring it."""
    keys: dict[str, str] = {}
    for cls in STRATEGY_CLASSES.values():
        for group in settings_groups(cls):
            for f in dataclasses.fields(group):
                if key_name(f.name) not in run_config_keys() or "declared_in" in f.metadata:
                    continue  # a parameter that is no key (OledFL's `sam`), or another part's key (FedCOG's start)
                declaring = next(g for g in group.__mro__ if dataclasses.is_dataclass(g)
                                 and f.name in {own.name for own in own_fields(g)})
                keys[key_name(f.name)] = str(Path(inspect.getsourcefile(declaring)).relative_to(ROOT))
    return keys


def shared_keys() -> dict[str, str]:
    """Every run-config key of the run's shared groups (`SHARED_GROUPS`) -> the file declaring it."""
    return {key_name(f.name): str(Path(inspect.getsourcefile(group)).relative_to(ROOT))
            for group in SHARED_GROUPS for f in own_fields(group)}


def spelled(key: str, text: str) -> bool:
    """Whether `text` spells `key` as a word (not inside a longer key: `sam-rho` is not in `xsam-rho-2`)."""
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", text) is not None


def quoted(key: str, text: str) -> bool:
    """Whether `text` spells `key` quoted: as a string or in backticks (`lr` the word is not the key `lr`)."""
    return re.search(rf"[\"'`]{re.escape(key)}[\"'`]", text) is not None


def test_the_groups_cover_every_algorithm_setting_the_train_message_carries() -> None:
    keys = group_keys()
    assert {"sam-rho", "proximal-mu", "moon-mu", "moon-tau", "mofedsam-alpha", "dyn-alpha", "synsam-beta",
            "synsam-mix", "dfedavgm-momentum", "ole-beta"} <= set(keys)
    shared = shared_keys()
    assert set(shared) == {"compression", "bits", "levels", "qsgd-scope", "qsgd-bucket", "topk-ratio",
                           "error-feedback"}
    # every key the train message carries is a group's or waits in NOT_YET_GROUPED, and none is in two of them
    message = {key_name(f.name) for f in config_fields() if sent_to_nodes(f)}
    grouped = set(keys) | set(shared)
    assert message <= grouped | set(NOT_YET_GROUPED), message - grouped - set(NOT_YET_GROUPED)
    assert not set(keys) & set(shared) and not grouped & set(NOT_YET_GROUPED)


@pytest.mark.parametrize("key", sorted(group_keys()))
def test_a_group_key_is_spelled_only_in_its_declaration(key: str) -> None:
    declaration = group_keys()[key]
    files = source_files()
    where = {path for path, text in files.items() if spelled(key, text)}
    assert declaration in where, (key, declaration)  # the scan sees the declaration: it can find the key
    assert where - {declaration} - set(ALLOWED) == set(), (key, sorted(where - {declaration} - set(ALLOWED)))


@pytest.mark.parametrize("key", sorted(shared_keys()))
def test_a_shared_group_key_is_quoted_only_in_its_declaration(key: str) -> None:
    declaration = shared_keys()[key]
    where = {path for path, text in source_files().items() if quoted(key, text)}
    assert declaration in where, (key, declaration)  # the scan sees the declaration: it can find the key
    homonyms = {path for (homonym, path) in HOMONYMS if homonym == key}
    assert homonyms <= where, (key, sorted(homonyms - where))  # an exception that no longer holds is removed
    assert where - {declaration} - homonyms == set(), (key, sorted(where - {declaration} - homonyms))


@pytest.mark.parametrize("key", sorted(NOT_YET_GROUPED))
def test_a_key_not_yet_grouped_is_spelled_in_no_new_place(key: str) -> None:
    where = {path for path, text in source_files().items() if quoted(key, text)}
    assert where <= set(NOT_YET_GROUPED[key]), (key, sorted(where - set(NOT_YET_GROUPED[key])))


def test_the_scan_would_see_a_new_spelling(tmp_path: Path) -> None:
    """The checks can fail: a line that spells a group's key outside its declaration is found."""
    assert spelled("sam-rho", 'config["sam-rho"]') and spelled("sam-rho", "reads `sam-rho`")
    assert not spelled("sam-rho", "xsam-rho-2") and not quoted("lr", "the lr of the round")
    assert quoted("lr", 'config["lr"]')
