"""The model keys: which network the run trains, and the GroupNorm groups of the ResNet.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by this
floor's builders (common/models/classifiers.py, common/models/diffusion.py). Whether the model fits
the data and the algorithm spans parts: `RunConfig` checks that.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError
from common.keys import check_choice, check_text, key, require
from common.models.classifier_names import MODELS, is_user_model, user_factory
from common.models.diffusion_names import UNET_PRESETS


@dataclass(frozen=True)
class ModelSettings:
    """The model: a built-in classifier, a U-Net (the diffusion task) or a user's own factory."""

    model: str = key("auto", "Model: cnn, cnn-gn (cnn with GroupNorm), mlp (784-200-10), mlp2 (784-200-200-10, "
                     "McMahan's 2NN), convnet, resnet18; a U-Net (unet-small, "
                     "unet-paper-mnist, unet-paper-cifar) makes the run a diffusion task; auto: the algorithm's paper "
                     "model (unet-paper-mnist for fedddpm and fedddpm+, cnn otherwise); or a user's own, "
                     "package.module:factory (called with num_classes, channels, image_size; docs/own-data.md).",
                     "SPEC 3.3")
    gn_groups: int = key(
        2, "GroupNorm groups of resnet18 (a divisor of 64): 2, the project's default, or 32, the DisPFL code that "
        "OledFL builds on.", "OledFL code lineage (DisPFL): 32"
    )

    def check(self) -> None:
        """Validate these keys; a user's `package.module:factory` must import (it is built later)."""
        check_text(self, ModelSettings)
        if is_user_model(self.model):  # package.module:factory (SPEC 3.3)
            try:
                user_factory(self.model)
            except ConfigError:  # the resolver's refusal names the site, the key and the path already
                raise
            except ValueError as err:
                raise ConfigError(f"run config key 'model': {err}") from None
        else:
            check_choice("model", self.model, ("auto",) + MODELS + tuple(UNET_PRESETS) + ("package.module:factory",))
        require(self.gn_groups >= 1 and 64 % self.gn_groups == 0, "gn-groups", self.gn_groups,
                "a divisor of 64 (1, 2, 4, 8, 16, 32 or 64)")
