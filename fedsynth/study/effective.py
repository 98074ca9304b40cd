"""A study run's effective config (every run-config key, defaults resolved), its run key, and its server rule.

A run is decided by every key of its run config, not only the ones the study
file sets: a changed default (the bounded-influence defaults of issue 51) runs
another rule under the same study settings. So the run key is a digest of the
effective config: the app's defaults (`[tool.flwr.app.config]`), then the
study's settings, parsed by the app's own `parse_run_config` into a `RunConfig`
and written out with every key (`RunConfig.as_dict`). Keys that say only where
files go or how a run is resumed (`NOT_IN_KEY`) are left out of the digest, so a
ledger stays valid on another machine or results folder.

The key has versions, recorded in each entry as `key-version`:

- 2 (today's): the effective config and the run's inputs outside it, the client
  count and the data's identity (`fedsynth.study.inputs`), recorded as `inputs`;
- 1 (an entry with an effective config and no `key-version`): the effective config
  alone. Such ledgers are read for their reports; their runs are not reused nor
  continued, since their keys do not say how many clients ran or on which data;
- 0 (no effective config: a ledger made before provenance): the study's settings
  alone (`settings_key`).

`expected_key` recomputes an entry's key from what it records, so a ledger checks
itself on every read (fedsynth/study/ledger.py); docs/studies.md says how old
ledgers are read.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Where a run's files go and how it is resumed: not what it computes. And `node-return-wait` (how long a
# round waits for a node the SuperLink reports lost to come back): a run that loses no node computes the same
# with any value, and a run that lost one records each wait in its metrics (`node-returns`). It came after
# ledgers that record effective configs; in the key, it would set every one of their runs apart for nothing.
NOT_IN_KEY = ("results-dir", "run-name", "resume", "overwrite", "accept-unverified-checkpoint", "data-dir",
              "cache-dir", "tensorboard", "checkpoint-every", "node-return-wait")
# The keys of the server's aggregation rule, as a report header states them.
RULE_KEYS = ("aggregation", "bounded-influence", "max-update-norm", "max-update-norm-ratio", "max-weight-share")
# What a ledger entry without an effective config says about its rule.
RULE_NOT_RECORDED = "not recorded (made before provenance)"


def digest(config: Mapping[str, Any]) -> str:
    """12 hex digits of the SHA-256 of the config as sorted JSON."""
    text = json.dumps(dict(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


KEY_VERSION = 2  # the run key of runs made now: effective config and run inputs (see the module's docstring)
RUN_INPUTS = "inputs"  # the entry field (and the key's part) holding the run's inputs outside its run config


def settings_key(overrides: Mapping[str, Any]) -> str:
    """The run key of ledgers made before provenance: a digest of the study's own settings alone."""
    return digest(overrides)


def effective_key(effective: Mapping[str, Any]) -> str:
    """The run key: a digest of the effective config without the `NOT_IN_KEY` keys."""
    return digest({k: v for k, v in effective.items() if k not in NOT_IN_KEY})


def run_key(effective: Mapping[str, Any], inputs: Mapping[str, Any]) -> str:
    """The run key of version 2: a digest of the effective config (without `NOT_IN_KEY`) and the run's inputs."""
    return digest({**{k: v for k, v in effective.items() if k not in NOT_IN_KEY}, RUN_INPUTS: dict(inputs)})


def key_version(entry: Mapping[str, Any]) -> Any:
    """The key version of a ledger entry: its `key-version`, else 1 with an effective config, else 0."""
    if "key-version" in entry:
        return entry["key-version"]
    return 1 if isinstance(entry.get("effective-config"), Mapping) else 0


def key_problem(entry: Mapping[str, Any]) -> str | None:
    """Why a ledger entry's key is not the digest of what it records (edited or damaged), or None when it is."""
    version = key_version(entry)
    config, inputs = entry.get("effective-config"), entry.get(RUN_INPUTS)
    if version == 0:
        computed, of = settings_key(entry.get("config") if isinstance(entry.get("config"), Mapping) else {}), \
            "study settings (it records no effective config: a ledger made before provenance keys by them)"
    elif version == 1 and isinstance(config, Mapping):
        computed, of = effective_key(config), "effective config"
    elif version == KEY_VERSION and isinstance(config, Mapping) and isinstance(inputs, Mapping):
        computed, of = run_key(config, inputs), "effective config and run inputs"
    elif version in (1, KEY_VERSION):
        return f"key-version {version} needs an effective config{' and run inputs' if version == 2 else ''}, " \
               "which the entry lacks"
    else:
        return f"key-version {version!r} is not one this fedsynth knows (0 to {KEY_VERSION})"
    if computed != entry.get("key"):
        return (f"its key is not the digest of its recorded {of}, which is {computed}: the entry was edited after "
                "its run, or damaged")
    return None


def effective_config(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every run-config key of the run the app makes of `defaults` then `overrides` (raises ConfigError)."""
    text = json.dumps([dict(defaults), dict(overrides)], sort_keys=True, default=str)
    return dict(_parsed(text))


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> tuple[tuple[str, Any], ...]:
    from common.run.config import parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    defaults, overrides = json.loads(text)
    return tuple(parse_run_config({**defaults, **overrides}, SERVER_STRATEGIES).as_dict().items())


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """"KEY THEIRS vs OURS" for every key (outside `NOT_IN_KEY`) whose values differ; a missing key is "absent"."""
    keys = sorted((set(ours) | set(theirs)) - set(NOT_IN_KEY))
    return [f"{key} {json.dumps(theirs.get(key, 'absent'))} vs {json.dumps(ours.get(key, 'absent'))}"
            for key in keys if json.dumps(ours.get(key)) != json.dumps(theirs.get(key))]


def _bounds(config: Mapping[str, Any], resolved: bool) -> tuple[float, float]:
    """(max-update-norm-ratio, max-weight-share) the run applied. An effective config (`resolved`) records them as
    applied; a legacy entry's settings were read as the app then read them: `bounded-influence` filled a key left
    at its off value (0, 1) with its bound (1.5, 0.4)."""
    ratio, share = float(config.get("max-update-norm-ratio", 0.0)), float(config.get("max-weight-share", 1.0))
    if config.get("bounded-influence") and not resolved:
        from common.algorithms import aggregation_settings

        ratio = ratio if ratio != 0 else aggregation_settings.BOUNDED_UPDATE_NORM_RATIO
        share = share if share != 1 else aggregation_settings.BOUNDED_WEIGHT_SHARE
    return ratio, share


def server_rule(entry: Mapping[str, Any]) -> str:
    """The server rule a ledger entry's run used, in words, from its effective config.

    An entry without one (made before provenance) gives `RULE_NOT_RECORDED`, unless its
    study settings pin aggregation, max-update-norm-ratio and max-weight-share: then the
    rule is known from them.
    """
    config = entry.get("effective-config")
    resolved = isinstance(config, Mapping)
    if not isinstance(config, Mapping):
        settings = entry.get("config", {})
        if not all(k in settings for k in ("aggregation", "max-update-norm-ratio", "max-weight-share")):
            return RULE_NOT_RECORDED
        config = settings
    ratio, share = _bounds(config, resolved)
    parts = [f"aggregation {config.get('aggregation', 'weighted')}"]
    if float(config.get("max-update-norm", 0.0)) > 0:
        parts.append(f"max-update-norm {config['max-update-norm']:g} ({config.get('update-norm-action', 'clip')})")
    if ratio > 0 or share < 1:
        parts.append(f"bounded influence on (max-update-norm-ratio {ratio:g}, max-weight-share {share:g})")
    else:
        parts.append("bounded influence off (plain rule)")
    return ", ".join(parts)
