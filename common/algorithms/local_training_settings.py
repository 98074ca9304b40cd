"""The local-training keys: how each client trains on its data in a round, and each rule's own weights.

One part of the run config (common/run/config.py's `RunConfig` composes the parts), read by the
client rules (client_app/training.py and this floor's losses, optimizers and SAM): epochs or steps,
batch, learning rate and its decay, SGD's momentum and weight decay, gradient clipping, the
optimizer, and MOON's projection head; the terms each rule adds to the loss are its own settings group
(common/algorithms/rule_settings.py).

The keys a node reads (side `NODE`) travel in every train message of fedsynth's app, and this module is the
one place that names them: the server sends the local training recipe (`recipe_config`: every such key but the
learning rate, the same in every round, as `start()`'s `train_config`) and each round's rate beside it
(`round_lr_entry`, the rate of the server's schedule); the node reads the whole group back from its message
(common/run/client_settings.py `rule_settings(config, LocalTrainingSettings)`), checked as the run config checks
it, and never from its own run config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from common.keys import NODE, check_choice, check_text, key, key_name, node_fields, require

# The `local-optimizer` key's values (common/algorithms/optimizers.py builds sgd and adam); auto: adam for the
# diffusion task, sgd otherwise (common/models/diffusion.py `optimizer_kind`). Here, not beside the optimizers:
# the run config reads it without loading torch.
OPTIMIZERS = ("auto", "sgd", "adam")


@dataclass(frozen=True)
class LocalTrainingSettings:
    """Local training: epochs or steps, batch, learning rate, optimizer, and MOON's projection head."""

    local_epochs: int = key(1, "Local epochs per round (when local-steps is 0).", side=NODE)
    local_steps: int = key(0, "Local SGD steps per round K; 0 means use local-epochs.", side=NODE)
    batch_size: int = key(32, "Local mini-batch size.", side=NODE)
    lr: float = key(0.05, "Local learning rate eta.", side=NODE)
    lr_decay: float = key(1.0, "Per-round decay: lr * lr-decay^(round-1).", "OledFL: 0.998")
    momentum: float = key(0.0, "Local SGD momentum (buffer reset every round).", side=NODE)
    weight_decay: float = key(0.0, "Local SGD weight decay.", side=NODE)
    clip_grad_norm: float = key(
        0.0, "Local training: clip each step's gradient to this global L2 norm (as torch.nn.utils.clip_grad_norm_, "
        "before weight decay); 0: off.", "OledFL/DisPFL code: 10", side=NODE,
    )
    local_optimizer: str = key(
        "auto", "Optimizer of local training and of FedDDPM's server epochs: sgd, adam, or auto (adam for the "
        "diffusion task, sgd otherwise); a new one every round.", "FedDDPM: Adam", side=NODE,
    )
    moon_projection_dim: int = key(256, "MOON projection-head output size.", "MOON")

    def check(self) -> None:
        """Validate these keys; ConfigError names the key, the bad value and the accepted values."""
        check_text(self, LocalTrainingSettings)
        require(self.local_epochs >= 1, "local-epochs", self.local_epochs, "an integer >= 1")
        require(self.local_steps >= 0, "local-steps", self.local_steps, "an integer >= 0 (0: use local-epochs)")
        require(self.batch_size >= 1, "batch-size", self.batch_size, "an integer >= 1")
        require(self.lr > 0, "lr", self.lr, "a number > 0")
        require(0 < self.lr_decay <= 1, "lr-decay", self.lr_decay, "a number in (0, 1]")
        require(0 <= self.momentum < 1, "momentum", self.momentum, "a number in [0, 1)")
        require(self.weight_decay >= 0, "weight-decay", self.weight_decay, "a number >= 0")
        require(self.clip_grad_norm >= 0 and math.isfinite(self.clip_grad_norm), "clip-grad-norm", self.clip_grad_norm,
                "a number >= 0 (0: no clipping)")
        check_choice("local-optimizer", self.local_optimizer, OPTIMIZERS)
        require(self.moon_projection_dim >= 1, "moon-projection-dim", self.moon_projection_dim, "an integer >= 1")

    def recipe_config(self, local_optimizer: str | None = None) -> dict[str, Any]:
        """The local training recipe as a train message's config entries: each field a node reads but the round's
        learning rate (`recipe_fields`), under its run-config key, in declaration order; `local_optimizer`, when
        given, replaces this value's (fedsynth's server resolves `auto` by its task before sending)."""
        return {key_name(f.name): local_optimizer if f.name == "local_optimizer" and local_optimizer
                else getattr(self, f.name) for f in recipe_fields()}


# The local training recipe a train message carries, by the name `fedsynth.strategies` exports: the value of this
# group (`LocalRecipe(local_steps=5).recipe_config()` gives its entries; its `lr` travels as the round's rate)
LocalRecipe = LocalTrainingSettings

# The train message's entry of the round's learning rate: the `lr` key, which the server's schedule (`lr * lr-decay
# ^ (round - 1)`) sets anew in each round's message, beside the recipe
ROUND_LR_KEY: str = "lr"
# The reply metric of the local steps a node ran in a round (K), named as the key that sets them
LOCAL_STEPS_METRIC: str = "local-steps"


def recipe_fields() -> list[dataclasses.Field]:
    """The local training recipe's fields: those of the group a node reads (`node_fields`) but the round's
    learning rate (`ROUND_LR_KEY`), which the server sends anew each round; the others stay for the whole run."""
    return [f for f in node_fields(LocalTrainingSettings) if key_name(f.name) != ROUND_LR_KEY]


def round_lr_entry(rate: float) -> dict[str, float]:
    """A train message's config entry of the round's learning rate `rate` (`ROUND_LR_KEY`): what a strategy adds
    to each round's config from its schedule, and what a developer's own `train_config` gives beside the recipe."""
    return {ROUND_LR_KEY: rate}
