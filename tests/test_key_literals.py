"""A setting's key is spelled in one place, its declaration (issue 63: "each algorithm defined once").

Every key of the settings groups fedsynth's strategy classes declare (`settings`: common/algorithms/rule_settings.py
and the other groups; FedSAM's `sam-rho`, FedProx's `proximal-mu`, ...) travels as the group's field: the class's
parameter, the train message's entry and the node's read all come from the group, so the key's text stands only
in the module that declares it (its field and its check's message), in the generated docs (docs/*.md, not
scanned here) and in tests. The scan reads the library's code (common/, server_app/, client_app/, fedsynth/);
the run-config files a user writes (pyproject.toml, studies/, benchmarks' run configs, the hand-written docs)
name keys by design and are not scanned.

The run's shared groups (`SHARED_GROUPS`: the local training group, whose node-side keys every train message of
fedsynth's app carries, the recipe and the round's rate; the uplink codec, one value from the run config to the
wire; FedCOG's part, sent on every run with FedCOG plugged in; the diffusion task's, whose node-side keys are
FedDDPM's warm-up message) are held to the same rule, so every key a train message carries is. A key that is a
plain word (`lr`, `momentum`, `bits`, `cog`) counts where it stands quoted, as a string or in backticks: the word
itself is prose or code (`self.lr`, "the server's momentum", the `X+cog` rows); a compound key (`sam-rho`,
`batch-size`) counts wherever it stands as a word.

`ALLOWED` lists the only other files where a key may stand, and `HOMONYMS` the only other (key, file) pairs, each
with why it is no use of the setting.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from common.algorithms.codec_settings import CodecSettings
from common.algorithms.cog_settings import CogSettings
from common.algorithms.local_training_settings import LocalTrainingSettings
from common.keys import key_name, node_fields, own_fields, sent_to_nodes
from common.models.diffusion_settings import DiffusionSettings
from common.run.config import config_fields
from server_app.strategies.catalog import STRATEGY_CLASSES
from server_app.strategies.parameters import settings_groups

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("common", "server_app", "client_app", "fedsynth")

# The groups a train message of fedsynth's app carries beside a strategy class's `settings`: the local training recipe
# and the round's rate (every run), the uplink codec (every centralized run), FedCOG's part (a run with FedCOG
# plugged in: `X+cog`, `cog = true`) and the diffusion task's (its node-side keys are FedDDPM's warm-up message,
# `WarmupSettings`). Their keys that travel (`node_fields`) are scanned as the classes' groups' keys are.
SHARED_GROUPS: tuple[type, ...] = (LocalTrainingSettings, CodecSettings, CogSettings, DiffusionSettings)
# (key, file) -> why a group's key stands in that file although it is no use of the setting
HOMONYMS: dict[tuple[str, str], str] = {
    ("levels", "common/uplink/payloads.py"): "a qsgd payload's array of packed levels, named so on the wire",
}

# Files where a group's key may stand although it is no use of the setting (file -> why).
ALLOWED: dict[str, str] = {
    # the rows' paper rules: each names the shared keys its paper fixes (`PaperRule.keys`; their values are the
    # keys' declared defaults) and its server step's text names them; docs/algorithms.md's paper-rule table and
    # tests/test_paper_rule_defaults.py are generated from / check them
    "common/algorithm_table.py": "a row's paper rule",
}


def source_files() -> dict[str, str]:
    """The library's code, path (relative to the repository) -> text."""
    return {str(path.relative_to(ROOT)): path.read_text() for root in SOURCES
            for path in sorted((ROOT / root).rglob("*.py"))}


def run_config_keys() -> set[str]:
    return {key_name(f.name) for f in config_fields()}


def declaration(group: type, field: dataclasses.Field) -> str:
    """The file of the group (`group` or one it extends) that declares `field`."""
    declaring = next(g for g in group.__mro__ if dataclasses.is_dataclass(g)
                     and field.name in {own.name for own in own_fields(g)})
    return str(Path(inspect.getsourcefile(declaring)).relative_to(ROOT))


def group_keys() -> dict[str, str]:
    """Every run-config key of a settings group a built-in strategy class declares, and every key of a shared group
    that travels (`SHARED_GROUPS`) -> the file declaring it."""
    keys: dict[str, str] = {}
    for cls in STRATEGY_CLASSES.values():
        for group in settings_groups(cls):
            for f in dataclasses.fields(group):
                if key_name(f.name) not in run_config_keys() or "declared_in" in f.metadata:
                    continue  # a parameter that is no key (OledFL's `sam`), or another part's key (FedCOG's start)
                keys[key_name(f.name)] = declaration(group, f)
    for group in SHARED_GROUPS:
        for f in node_fields(group):
            keys[key_name(f.name)] = declaration(group, f)
    return keys


def spelled(key: str, text: str) -> bool:
    """Whether `text` spells `key` as a word (not inside a longer key: `sam-rho` is not in `xsam-rho-2`)."""
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", text) is not None


def quoted(key: str, text: str) -> bool:
    """Whether `text` spells `key` quoted: as a string or in backticks (`lr` the word is not the key `lr`)."""
    return re.search(rf"[\"'`]{re.escape(key)}[\"'`]", text) is not None


def names(key: str, text: str) -> bool:
    """Whether `text` names `key`: quoted for a plain word (`lr`, `momentum`: the word is prose), else as a word."""
    return spelled(key, text) if "-" in key else quoted(key, text)


def test_the_groups_cover_every_algorithm_setting_the_train_message_carries() -> None:
    keys = group_keys()
    assert {"sam-rho", "proximal-mu", "moon-mu", "moon-tau", "mofedsam-alpha", "dyn-alpha", "synsam-beta",
            "synsam-mix", "dfedavgm-momentum", "ole-beta"} <= set(keys)
    assert {"cog", "cog-start-round", "gen-budget", "gen-steps", "gen-lr", "lambda-dis", "kd-weighting", "lambda-kd",
            "cog-ablation", "cog-grid-partition", "warmup-epochs", "warmup-steps"} <= set(keys)
    # the local training recipe and the round's rate, every train message's (the shared group's)
    assert {"local-epochs", "local-steps", "batch-size", "lr", "momentum", "weight-decay", "clip-grad-norm",
            "local-optimizer"} <= set(keys)
    assert {keys[key] for key in ("lr", "batch-size")} == {"common/algorithms/local_training_settings.py"}
    assert {"compression", "bits", "levels", "qsgd-scope", "qsgd-bucket", "topk-ratio", "error-feedback"} <= set(keys)
    # every key the train message carries is one of these groups' (none is left spelled by hand)
    message = {key_name(f.name) for f in config_fields() if sent_to_nodes(f)}
    assert message <= set(keys), message - set(keys)


@pytest.mark.parametrize("key", sorted(group_keys()))
def test_a_group_key_is_spelled_only_in_its_declaration(key: str) -> None:
    declared_in = group_keys()[key]
    where = {path for path, text in source_files().items() if names(key, text)}
    assert declared_in in where, (key, declared_in)  # the scan sees the declaration: it can find the key
    homonyms = {path for (homonym, path) in HOMONYMS if homonym == key}
    assert homonyms <= where, (key, sorted(homonyms - where))  # an exception that no longer holds is removed
    unexplained = where - {declared_in} - set(ALLOWED) - homonyms
    assert unexplained == set(), (key, sorted(unexplained))


def test_the_scan_would_see_a_new_spelling(tmp_path: Path) -> None:
    """The checks can fail: a line that spells a group's key outside its declaration is found."""
    assert spelled("sam-rho", 'config["sam-rho"]') and spelled("sam-rho", "reads `sam-rho`")
    assert not spelled("sam-rho", "xsam-rho-2") and not quoted("lr", "the lr of the round")
    assert quoted("lr", 'config["lr"]')
    assert quoted("cog", 'require(..., "cog", ...)') and not quoted("cog", "`fedavg+cog`, `cog = true`")
    # a plain-word key is named where quoted, a compound one wherever it stands as a word
    assert names("lr", 'round_config["lr"]') and names("lr", "the round's `lr`") and not names("lr", "self.lr")
    assert names("batch-size", "the recipe's batch-size") and not names("momentum", "SGD's momentum")
