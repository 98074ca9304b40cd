"""The run configuration: the parts of the run config composed, and what spans two parts.

A run is configured through Flower's run config (`[tool.flwr.app.config]` in
`pyproject.toml`, overridden with `--run-config`). Both the ServerApp and every
ClientApp read the same keys, so both validate them with `parse_run_config`
before doing any work. Each concern declares its keys (their defaults, meanings
and checks) next to the code that uses them, as one frozen dataclass: `PARTS`
below names them. `RunConfig` inherits them all, so every key is a flat
attribute (`cfg.lr`, `cfg.dataset`) and a keyword of its constructor; it adds
only the `auto` defaults and the checks that span two parts. docs/configuration.md
is generated from the parts (`python -m common.run.config_docs --markdown > docs/configuration.md`).

Validation errors are `ConfigError`s whose message names the key, the bad value
and the accepted values, so a user can fix the run from the message alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.algorithms.aggregation_settings import (
    AUTO_MEAN, AggregationSettings, FedAvgMSettings, RecordBoundSettings, bounded_influence_values,
)
from common.algorithms.codec_settings import CodecSettings
from common.algorithms.cog_settings import COG_KEY, CogSettings
from common.algorithms.decentralized_settings import DecentralizedSettings
from common.algorithms.rule_settings import (
    DFedAvgMSettings, FedDynSAMSettings, FedProxSettings, MOONSettings, MoFedSAMSettings, OledFLSettings, SAMSettings,
)
from common.algorithms.plugins import (
    PLUGIN_FORM, algorithm_of, check_paper_rule, is_plugin, known_algorithm, plugin_algorithm,
)
from common.algorithm_table import ALGORITHMS, COG_BASES, Algorithm
from common.algorithms.local_training_settings import LocalTrainingSettings
from common.algorithms.synsam_settings import REAL_ORACLE, DynaFedSettings, SynSAMRuleSettings, SynSAMSettings
from common.data.datasets import dataset_info
from common.data.hf_datasets import is_hf
from common.data.settings import NODE_PARTITION, DataSettings
from common.data.site_data import node_shape_info
from common.errors import ConfigError
from common.keys import LISTED_KEYS, check_choice, key_name, own_fields, require, shown, shown_keys
from common.models.classifier_names import MODELS, check_model_fits, is_user_model
from common.models.diffusion_names import UNET_PRESETS
from common.models.diffusion_settings import DiffusionSettings
from common.models.settings import ModelSettings
from common.run.round_settings import RoundSettings
from common.run.own_settings import as_config, is_own_key, parse_own_settings
from common.run.settings import RunSettings

# The parts of the run config, in reading order: docs/configuration.md's tables and `RunConfig.check` follow it.
# Each part is a settings group (common/keys.py); an algorithm's own group lives in its module (FedProx's, SAM's,
# ...: common/algorithms/rule_settings.py), and a group that extends another lists only the keys it declares.
PARTS: tuple[type, ...] = (
    RunSettings, DataSettings, ModelSettings, LocalTrainingSettings, FedProxSettings, MOONSettings, SAMSettings,
    MoFedSAMSettings, FedDynSAMSettings, RoundSettings, AggregationSettings, RecordBoundSettings, FedAvgMSettings,
    CodecSettings, SynSAMSettings, SynSAMRuleSettings, DynaFedSettings, CogSettings, DecentralizedSettings,
    DFedAvgMSettings, OledFLSettings, DiffusionSettings,
)


def _bases(parts: tuple[type, ...]) -> tuple[type, ...]:
    """`parts` with every group before the groups it extends (`MoFedSAMSettings` before `SAMSettings`), the others
    in their order: the bases `RunConfig` inherits them in (a class must precede its bases)."""
    ordered: list[type] = []
    for part in parts:
        extended = [i for i, other in enumerate(ordered) if issubclass(part, other)]
        ordered.insert(min(extended), part) if extended else ordered.append(part)
    return tuple(ordered)


@dataclass(frozen=True)
class RunConfig(*_bases(PARTS)):  # type: ignore[misc]
    """Validated run configuration shared by the ServerApp and the ClientApps: every part's keys, flat."""

    # a plugin's own settings group, from its keys "<name>.<key>" (common/run/own_settings.py); None for the others
    own_settings: Any = dataclasses.field(default=None, metadata={
        "meaning": "the settings group of a plugin algorithm, from its run-config keys '<name>.<key>'"})

    def __post_init__(self) -> None:
        if self.model == "auto":  # the algorithm's paper model when the user names none
            object.__setattr__(self, "model", default_model(self.algorithm))
        if self.fid_features == "auto":  # no server data with partition = node: an extractor that needs none
            object.__setattr__(self, "fid_features", "random" if self.partition == NODE_PARTITION else "classifier")
        if self.aggregation == AUTO_MEAN:  # the algorithm's paper mean (its row's `mean`) when the user names none
            object.__setattr__(self, "aggregation", paper_mean(self.algorithm))
        # the bounds a run applies: a key left unset takes bounded-influence's bound or its off value; an explicit
        # value stays (config.json shows the values applied)
        ratio, share = bounded_influence_values(self.max_update_norm_ratio, self.max_weight_share,
                                                self.bounded_influence)
        object.__setattr__(self, "max_update_norm_ratio", ratio)
        object.__setattr__(self, "max_weight_share", share)

    def as_dict(self) -> dict[str, Any]:
        """The config as run-config keys (dashes), as written to config.json, in `config_fields` order; then a
        plugin's own keys ("<name>.<key>")."""
        return {**{key_name(f.name): getattr(self, f.name) for f in config_fields()},
                **as_config(self.algorithm, self.own_settings)}

    def oneshot_rate(self) -> float:
        """FedDDPM+'s one-shot rate: `oneshot-lr`, or the clients' learning rate (Algorithm 2 trains it at zeta)."""
        return self.oneshot_lr or self.lr

    def check(self) -> None:
        """Every part's own checks, in `PARTS` order, then the checks that span two parts.

        Whether `algorithm` names a known strategy is not checked here: `parse_run_config` checks it
        first, against the caller's registry.
        """
        for part in PARTS:
            part.check(self)
        self._check_across_parts()

    def _check_across_parts(self) -> None:
        """The consistency checks between parts; each names the key and the accepted values."""
        node = self.partition == NODE_PARTITION
        hf = is_hf(self.dataset)
        algorithm = algorithm_of(self.algorithm)
        decentralized = algorithm.decentralized
        require(not is_user_model(self.model) or not algorithm.projection_head, "model", self.model,
                f"a built-in classifier with moon (MOON needs the model's `features` and `head`: "
                f"{', '.join(MODELS)})")
        require(self.aggregation in ("weighted", "uniform") or not decentralized,
                "aggregation", self.aggregation, "weighted or uniform with a decentralized algorithm (no server mean)")
        if decentralized:
            CodecSettings.check_uncompressed(self, "with a decentralized algorithm (nodes exchange full models)")
        require(self.synthetic_source != REAL_ORACLE or not node, "synthetic-source",
                self.synthetic_source, "distilled with partition = node (real-oracle reads the training split on the "
                "server, and the sites' data is not there)")
        require(not self.cog or algorithm.cog_base or algorithm.with_cog, COG_KEY, self.cog,
                f"true only with a base algorithm FedCOG plugs into: {', '.join(COG_BASES)}")
        unknown_keys = [key for key in algorithm.client_keys if not hasattr(self, key.replace("-", "_"))]
        require(not unknown_keys, "algorithm", self.algorithm,
                f"an algorithm whose client_keys are run-config keys (not {', '.join(map(repr, unknown_keys))})")
        if node and self.model in UNET_PRESETS:  # FID's reference: the sites' pooled feature sums
            require(self.fid_features != "classifier", "fid-features", self.fid_features,
                    "random (or inception, with its weights on every host) with a U-Net and partition = node: the "
                    "classifier is trained on real images on the server, which holds none")
        require(not (node and self.perturbation_diagnostic), "perturbation-diagnostic", self.perturbation_diagnostic,
                "false with partition = node (it reads every client's data on the server)")
        self._check_diffusion_task(algorithm)
        if (hf and not node) or is_user_model(self.model):  # a user's model is checked when it is built
            return
        try:
            check_model_fits(self.model, node_shape_info(self) if node else dataset_info(self.dataset))
        except ValueError as err:
            raise ConfigError(f"run config key 'model' = {self.model!r} does not fit dataset "
                              f"{self.dataset!r}: {err}") from None

    def _check_diffusion_task(self, algorithm: Algorithm) -> None:
        """FedDDPM (issue 5): which algorithms, image sizes and samplers go with the model (a U-Net or not)."""
        if self.model not in UNET_PRESETS:
            require(not algorithm.ddpm_only, "model", self.model,
                    f"a U-Net ({', '.join(UNET_PRESETS)}) with algorithm '{self.algorithm}' (the diffusion task)")
            require(self.image_size == 0 or self.partition == NODE_PARTITION or is_hf(self.dataset), "image-size",
                    self.image_size,
                    "0 unless the model is a U-Net (diffusion task), partition = node or an hf: dataset")
            return
        require(algorithm.trains_ddpm, "algorithm", self.algorithm,
                "with a U-Net model (diffusion task) one of "
                + ", ".join(name for name, row in ALGORITHMS.items() if row.trains_ddpm))
        require(not self.cog, COG_KEY, self.cog, "false with a U-Net model (FedCOG needs a classifier)")
        if is_hf(self.dataset) and self.partition != NODE_PARTITION:
            return
        preset = UNET_PRESETS[self.model]
        own = node_shape_info(self) if self.partition == NODE_PARTITION else dataset_info(self.dataset)
        side = self.image_size or own.height
        require(side % preset.downsampling == 0, "image-size", self.image_size,
                f"a side divisible by {preset.downsampling} for model '{self.model}' (the dataset's own side is "
                f"{own.height}; e.g. image-size = "
                f"{max(preset.downsampling, side // preset.downsampling * preset.downsampling)})")
        timesteps = self.diffusion_timesteps or preset.timesteps
        require("ddim" not in (self.sampler, self.aux_sampler) or self.ddim_steps <= timesteps, "ddim-steps",
                self.ddim_steps, f"at most T = {timesteps} (diffusion-timesteps)")


def cog_enabled(cfg: RunConfig) -> bool:
    """Whether this run uses FedCOG: `fedcog`, an `X+cog` name, or `cog = true`."""
    return cfg.cog or algorithm_of(cfg.algorithm).with_cog


def default_model(algorithm: str) -> str:
    """`model = "auto"`: FedDDPM's MNIST U-Net for the diffusion algorithms (`ddpm_only`), the simple CNN otherwise
    (and for a name that is no algorithm, which `parse_run_config` refuses next)."""
    row = known_algorithm(algorithm)
    return "unet-paper-mnist" if row is not None and row.ddpm_only else "cnn"


def paper_mean(algorithm: str) -> str:
    """`aggregation = "auto"`: the mean the algorithm's paper takes (its row's `mean`: "uniform" for FedSynSAM and
    FedDDPM/FedDDPM+), "weighted" for a name that is no algorithm (`parse_run_config` refuses it next)."""
    row = known_algorithm(algorithm)
    return row.mean if row is not None else "weighted"


def config_fields() -> list[dataclasses.Field]:
    """All run-config fields: each part's own in declaration order (`own_fields`), the parts in `PARTS` order."""
    return [f for part in PARTS for f in own_fields(part)]


def finite_number(value: int | float) -> bool:
    """Whether `value` is a finite float: an integer beyond a float's range is not (`math.isfinite` would raise
    OverflowError on it, and `float()` too)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def coerce_value(key: str, value: Any, default: Any) -> Any:
    """Coerce a TOML/CLI value to the type of the key's default, or raise ConfigError."""
    expected = type(default)
    if expected is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"run config key '{key}': expected true or false, got {shown(value)}")
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"run config key '{key}': expected an integer, got {shown(value)}")
        return value
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"run config key '{key}': expected a number, got {shown(value)}")
        if not finite_number(value):
            raise ConfigError(f"run config key '{key}': expected a finite number, got {shown(value)}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"run config key '{key}': expected a string, got {shown(value)}")
    return value


# The keys that give the data's shape without a dataset (partition = node).
SHAPE_KEYS = ("image_channels", "image_size", "num_classes", "class_names")


def own_data_partition(image_channels: int, image_size: int, num_classes: int = 0) -> str:
    """The partition a strategy class's `ServerTask` describes: "node" when it is given the data's shape (the
    developer's own data: the shape comes from those keys alone), else the default split of a public dataset."""
    return NODE_PARTITION if (image_channels or image_size or num_classes) else RunConfig.partition


def check_parameters(owner: str, values: Mapping[str, Any]) -> None:
    """Refuse keyword parameters named like run-config keys as `parse_run_config` refuses those keys.

    A strategy's parameter mirrors the run-config key of the same name (`max_weight_share` <->
    `max-weight-share`, server_app/strategies/parameters.py), so the values it is given pass the same
    checks, worded the same: the key's type (a number, finite; an integer; true or false; text) as
    `coerce_value` checks it, then the `check` of every part that declares one of the given keys. The
    ConfigError names `owner` (the class) first. Names that are not run-config keys are left alone.
    """
    fields = {f.name: f for f in config_fields()}
    given = {name: value for name, value in values.items() if name in fields}
    if not given:
        return
    try:
        typed = {name: coerce_value(key_name(name), value, fields[name].default) for name, value in given.items()}
        if "partition" not in values and any(typed.get(name) for name in SHAPE_KEYS):
            # a class with no partition of its own that is told its data's shape describes a developer's own
            # data, as a site's: the shape comes from these keys (`own_data_partition`)
            typed["partition"] = NODE_PARTITION
        settings = RunConfig(**typed)
        for part in PARTS:
            if any(f.name in typed for f in own_fields(part)):
                part.check(settings)
    except ConfigError as err:
        raise ConfigError(f"{owner}: {err}") from None


def parse_run_config(raw: Mapping[str, Any], known_algorithms: Iterable[str]) -> RunConfig:
    """Build and validate a RunConfig from Flower's run config.

    Keys absent from `raw` take their defaults; unknown keys are an error (Flower
    rejects them in `flwr run`, and the in-process CLI must behave the same).
    """
    fields_by_key = {key_name(f.name): f for f in config_fields()}
    own_raw = {key: value for key, value in raw.items() if is_own_key(key)}  # a plugin's own, "<name>.<key>"
    unknown = sorted(set(raw) - set(fields_by_key) - set(own_raw))
    if unknown:
        import difflib

        hints = []
        for key in unknown[:LISTED_KEYS]:  # the closest keys of the first few: thousands would take minutes
            close = difflib.get_close_matches(key, list(fields_by_key), n=3, cutoff=0.6)
            hints.append(f"{shown(key)} (did you mean {' or '.join(repr(c) for c in close)}?)" if close else shown(key))
        more = f" and {len(unknown) - LISTED_KEYS} more" if len(unknown) > LISTED_KEYS else ""
        raise ConfigError(
            f"unknown run config key(s): {', '.join(hints)}{more}; the known keys are listed in the README's "
            "run-config table (known keys: " + ", ".join(fields_by_key) + ")"
        )
    values = {
        f.name: coerce_value(key, raw[key], f.default)
        for key, f in fields_by_key.items()
        if key in raw
    }
    cfg = RunConfig(**values)
    if is_plugin(cfg.algorithm):  # a user's algorithm: both halves imported and checked (common/algorithms/plugins.py)
        check_paper_rule(plugin_algorithm(cfg.algorithm), f"run config key 'algorithm' = {cfg.algorithm!r}",
                         fields_by_key)
    else:
        check_choice("algorithm", cfg.algorithm, [*sorted(known_algorithms), PLUGIN_FORM])
    object.__setattr__(cfg, "own_settings", parse_own_settings(cfg.algorithm, own_raw, coerce_value))
    cfg.check()
    return cfg


def parse_overrides(text: str) -> dict[str, Any]:
    """Parse `--run-config "a=1 b='x'"` the way Flower does: space-separated key=value, values in TOML.

    As in `flwr run` (flwr.common.config.parse_config_args), a quoted value stays a
    string (`run-name='2024'` is the string "2024") and may hold spaces; a bare
    word that is not TOML is taken as a string.
    """
    import re
    import tomllib

    pattern = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
    overrides: dict[str, Any] = {}
    rest = pattern.sub(" ", text).split()
    if rest:
        raise ConfigError(f"run config override {rest[0]!r} is not of the form key=value")
    for key, value in pattern.findall(text):
        try:
            overrides[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = value  # a bare word is a string, as in Flower's CLI
    return overrides
