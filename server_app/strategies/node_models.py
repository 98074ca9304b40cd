"""The nodes' last trained models, kept on the server so that a resumed run can hand them back.

MOON's contrastive term and FedCOG's disagreement term read the model a node
ended its previous round with, which the node keeps in its `Context.state`.
A resumed simulation starts with that state empty, so without help the first
round after a resume would compare with the global model instead (MOON) or
drop the disagreement term (FedCOG), and the run would no longer be the run
that was interrupted. That model is exactly the model the node sent in its reply when the
uplink is uncompressed, so the server keeps the last one of each node, saves
them in its checkpoints and sends them back with each node's first message
after a resume (`node-state:` records), under the state keys the ClientApp
reads.

Kept only when the run can resume (`checkpoint-every` > 0) and the uplink is
uncompressed (a compressed reply holds a lossy update, not the node's model):
the cost is one model per node in the server's memory and in each checkpoint.
A node whose reply the server refused kept a model the server never saw; after
a resume it gets the last model the server accepted from it. A checkpoint of a
base X (whose nodes keep no model) forked into X+cog has none to hand back: the
first FedCOG round after such a fork generates without the disagreement term.
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import ArrayRecord

from common.algorithms.plugins import algorithm_of
from common.run.config import RunConfig, cog_enabled
from common.protocol import STATE_COG_PREVIOUS_MODEL, STATE_MOON_PREVIOUS_MODEL
from common.records import Weights, to_record

GROUP_PREFIX = "node-model-"  # + partition id: a checkpoint group


def kept_model_keys(cfg: RunConfig) -> tuple[str, ...]:
    """The `Context.state` keys under which this run's nodes keep their last trained model, when the run can
    resume (`checkpoint-every` > 0) and the uplink is uncompressed; none otherwise."""
    if cfg.checkpoint_every <= 0 or cfg.compression != "none":
        return ()
    keys = []
    if algorithm_of(cfg.algorithm).projection_head:  # MOON's previous model
        keys.append(STATE_MOON_PREVIOUS_MODEL)
    if cog_enabled(cfg):
        keys.append(STATE_COG_PREVIOUS_MODEL)
    return tuple(keys)


class NodeModels:
    """The last model each node sent, kept under the nodes' state `keys` (`kept_model_keys`; none: keep nothing).

    fedsynth's app gives its strategies one (server_app/registry.py `build_strategy`); a strategy built
    without it keeps no node models.
    """

    def __init__(self, keys: tuple[str, ...] = ()) -> None:
        self.keys = keys
        self.models: dict[int, Weights] = {}

    def keep(self, partition_id: int, model: Weights) -> None:
        """The model a node just sent (its reply's uncompressed model)."""
        if self.keys:
            self.models[partition_id] = model

    def records(self, partition_id: int) -> dict[str, ArrayRecord]:
        """The node's kept model under each of its state keys, for its first message after a resume."""
        model = self.models.get(partition_id)
        return {key: to_record(model) for key in self.keys} if model is not None else {}

    def arrays(self) -> dict[str, Weights]:
        """Checkpoint groups, one per node."""
        return {f"{GROUP_PREFIX}{pid}": model for pid, model in sorted(self.models.items())}

    def load(self, groups: Mapping[str, Weights]) -> dict[str, Weights]:
        """Take this object's groups from a checkpoint's; returns the others (the strategy's own)."""
        self.models = {int(name[len(GROUP_PREFIX):]): value for name, value in groups.items()
                       if name.startswith(GROUP_PREFIX)}
        return {name: value for name, value in groups.items() if not name.startswith(GROUP_PREFIX)}
