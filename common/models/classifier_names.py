"""What a model name means, without torch: the built-in classifiers' names, a user's factory, and which images fit.

The run config checks `model` against these (common/models/settings.py, common/run/config.py), so they
live apart from the networks themselves (common/models/classifiers.py, which needs torch): the run
config, and `import fedsynth.strategies`, do not load torch (tests/test_light_import.py).
"""

from __future__ import annotations

from collections.abc import Callable

from common.data.datasets import DatasetInfo
from common.errors import ConfigError
from common.imports import import_attribute

MODELS = ("cnn", "cnn-gn", "mlp", "mlp2", "convnet", "resnet18")
# GroupNorm groups of resnet18 unless the run config says otherwise (`gn-groups`).
DEFAULT_GN_GROUPS = 2


def cnn_side(size: int) -> int:
    """The side of the simple CNN's last feature map for an image side (at least 1 where the CNN fits)."""
    # conv5 -> pool2 -> conv5 -> pool2
    return ((size - 4) // 2 - 4) // 2


def is_user_model(name: str) -> bool:
    """Whether a model name is a user's factory, `package.module:factory`."""
    return ":" in name


def user_factory(name: str) -> Callable[..., object]:
    """The factory a `package.module:factory` name refers to; ConfigError (a ValueError) saying what failed."""
    factory = import_attribute(name, f"run config key 'model' = {name!r}", kind="callable")
    if not callable(factory):
        raise ConfigError(f"run config key 'model' = {name!r}: {name.partition(':')[2]!r} is a {type(factory).__name__}, not a callable")
    return factory


def check_model_fits(name: str, info: DatasetInfo) -> None:
    """Raise ValueError when a model cannot take the dataset's images."""
    if name in ("mlp", "mlp2") and info.shape != (1, 28, 28):
        raise ValueError(
            f"'{name}' takes 1x28x28 images (784 inputs) but the dataset's images are "
            f"{info.channels}x{info.height}x{info.width}; use cnn, convnet or resnet18"
        )
    if name in ("cnn", "cnn-gn") and min(cnn_side(info.height), cnn_side(info.width)) < 1:
        raise ValueError(f"'{name}' needs images of at least 16x16")
    if name == "convnet" and min(info.height, info.width) < 8:
        raise ValueError("'convnet' needs images of at least 8x8")
