"""FedSynSAM's server (SPEC 4.3), and the trajectory and synthetic-set machinery it shares with DynaFed.

`TrajectoryStrategy` is FedAvg (with whatever uplink compression the run uses)
that keeps the global models `w^0 .. w^R` of its first R aggregations, then
distils `D_syn` from them once (server_app/distillation.py); with `synthetic-source =
real-oracle`, a diagnostic that is not the method, D_syn is instead synthetic-ipc real
training images per class, read by the server from the training split. Rounds whose
aggregation was skipped add nothing, so the trajectory always holds R + 1
consecutive global models.

`FedSynSAM` sends D_syn once to every node: the first message a node
gets after the distillation carries it, and the server keeps sending it until
a reply from that partition reports `synthetic-examples` > 0, so a node that
missed a round, timed out, or restarted with empty state (a resumed run) gets
it with its next message. Nodes keep it in `Context.state` and from then on
perturb along the local/synthetic gradient mix (client_app/sam_family.py).

Both keep the trajectory, D_syn and the last global update in the checkpoint
hooks. With `perturbation-diagnostic` on (simulation only), every round logs
the cosines of server_app/perturbation.py.

torch and the distillation are imported inside the methods that distil: importing this module (and
`fedsynth.strategies`) does not load torch; a run loads it when the server first distils.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Iterable, Mapping
from logging import INFO
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.algorithms.synsam_settings import SynSAMRuleSettings
from common.keys import parameter
from common.run.config import REAL_ORACLE, paper_mean
from common.data.datasets import load_run_dataset, run_dataset_info
from common.protocol import SYNTHETIC_DATA
from common.records import Weights, to_record
from common.run.task import ServerTask, make_model
from server_app.strategies.fedavg import FedAvg, parameter_change
from server_app.strategies.parameters import documented
from server_app.strategies.server_training import DistillationSettings, field_list, grouped

if TYPE_CHECKING:
    from server_app.perturbation import PerturbationDiagnostic

_TRAJECTORY = "trajectory-"


def real_oracle_images(task: ServerTask, num_classes: int, ipc: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`synthetic-source = real-oracle` (a diagnostic): `ipc` training images per class of `task`'s dataset as
    model input (float32 (n, C, H, W)) and their labels (int64 (n,)), chosen with `seed`.

    The server reads the training split here, which breaks the federated premise that it holds no
    data; the oracle exists only to tell a poor distillation from a poor use of D_syn.
    """
    import torch

    from common.metrics.evaluation import as_tensors
    from server_app.distillation import oracle_indices

    arrays = load_run_dataset(task)
    index = oracle_indices(arrays.y_train, num_classes, ipc, seed)
    x, y = as_tensors(arrays.x_train[index], arrays.y_train[index], task.dataset, torch.device("cpu"))
    return x.numpy(), y.numpy()


@dataclass(frozen=True)
class TrajectorySettings:
    """The trajectory strategies' class settings (not a part of the run config): the distillation, one grouped
    value (its keys' declaration is the run config's FedSynSAM part, `SynSAMSettings`)."""

    distillation: DistillationSettings = parameter(
        DistillationSettings(), "The server's distillation of the synthetic set: a `DistillationSettings("
        f"{field_list(DistillationSettings)})`, each field the run-config key of the same name; `task` the model "
        "the server builds (common.run.task.ServerTask), `device` where it trains.")

    def check(self) -> None:
        """Refuse a `distillation` that is not a `DistillationSettings` (which checked its keys when built)."""
        grouped(DistillationSettings, "distillation", self.distillation)


@documented
class TrajectoryStrategy(FedAvg):
    """FedAvg that records the global trajectory and distils a synthetic set after R aggregations."""

    settings = TrajectorySettings

    def __post_init__(self) -> None:
        self.trajectory: list[Weights] = []
        self.synthetic: tuple[np.ndarray, np.ndarray] | None = None
        self.previous_update: Weights | None = None
        self.distill_report: dict[str, float] = {}
        self._round_metrics: dict[str, float] = {}
        self.server_round = 0

    # the app's perturbation diagnostic (simulation only), attached by server_app/registry.py when it is on
    diagnostic: PerturbationDiagnostic | None = None

    # ----- public hook: what subclasses change -------------------------------------------
    def after_aggregation(self, new: Weights) -> Weights:
        """A server-side step on the aggregated model: `new` is the server step's global model ({name: array},
        the model's names, shapes and dtypes, float32 parameters); returns the model the round ends with, in the
        same names, shapes and dtypes (DynaFed trains it on D_syn). Default: `new` unchanged."""
        return new

    # ----- trajectory and distillation ------------------------------------------------
    def _distil(self) -> None:
        """Learn D_syn from the trajectory (or take the real-image oracle); its matching losses go into this round's metrics."""
        from common.metrics.evaluation import resolve_device
        from server_app.distillation import distill, real_oracle

        start = time.monotonic()
        task = self.distillation.task
        info = run_dataset_info(task)
        settings = self.distillation.synsam()  # the run config's FedSynSAM part, the object `distill` takes
        device = resolve_device(self.distillation.device)
        if self.distillation.synthetic_source == REAL_ORACLE:
            x, y = real_oracle_images(task, info.num_classes, self.distillation.synthetic_ipc, self.seed)
            result = real_oracle(make_model(task), self.trajectory, x, y, settings, device)
        else:
            result = distill(make_model(task), self.trajectory, info.num_classes, info.shape, settings, device,
                             seed=self.seed)
        self.synthetic = (result.x, result.y)
        self.distill_report = {
            "distill-loss-start": result.start_loss,
            "distill-loss-end": result.end_loss,
            "distill-alpha": result.alpha,
            "distill-time": time.monotonic() - start,
            "synthetic-examples": int(len(result.y)),
        }
        self._round_metrics.update(self.distill_report)

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        new = super().server_step(mean_delta, replies)
        if self.synthetic is None and len(self.trajectory) <= self.distillation.trajectory_rounds:
            self.trajectory.append(new)
            if len(self.trajectory) == self.distillation.trajectory_rounds + 1:
                self._distil()
        new = self.after_aggregation(new)
        self.previous_update = parameter_change(new, self.current, self._parameter_names)
        return new

    # ----- Strategy API -----------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self.server_round = server_round
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if messages and not self.trajectory:
            self.trajectory.append(dict(self.current))  # w^0
        return messages

    def _aggregate_good(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        self._round_metrics = {}
        if self.diagnostic is not None and replies:
            self._round_metrics.update(self.diagnostic.measure(
                self.current, [self.node_table.partition_of(r) for r in replies], self.previous_update, self.synthetic,
            ))
        arrays, metrics = super()._aggregate_good(server_round, replies)
        if metrics is None or not self._round_metrics:
            return arrays, metrics
        return arrays, MetricRecord({**dict(metrics), **self._round_metrics})

    # ----- checkpoint hooks ---------------------------------------------------------
    def state_arrays(self) -> dict[str, Weights]:
        groups: dict[str, Weights] = {f"{_TRAJECTORY}{i:05d}": w for i, w in enumerate(self.trajectory)}
        if self.synthetic is not None:
            groups["synthetic"] = {"x": self.synthetic[0], "y": self.synthetic[1]}
        if self.previous_update is not None:
            groups["previous-update"] = self.previous_update
        return groups

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        self.trajectory = [dict(groups[k]) for k in sorted(k for k in groups if k.startswith(_TRAJECTORY))]
        synthetic = groups.get("synthetic")
        self.synthetic = (synthetic["x"], synthetic["y"]) if synthetic is not None else None
        self.previous_update = groups.get("previous-update")

    def state_meta(self) -> dict[str, Any]:
        return {"distill": dict(self.distill_report)}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        self.distill_report = dict(meta.get("distill", {}))

    def summary(self) -> None:
        super().summary()
        log(INFO, "%s: trajectory of R=%d rounds, distillation of %d images per class after round R; uplink %s",
            type(self).__name__, self.distillation.trajectory_rounds, self.distillation.synthetic_ipc,
            self.codec.describe())


@documented
class FedSynSAM(TrajectoryStrategy):
    """FedSynSAM: FedAvg of (compressed) updates; after `distillation.trajectory_rounds` aggregations the server distils a
    synthetic set from the global models' trajectory and sends it once to every node (record "synthetic-data");
    nodes then perturb along a mix of their local and the synthetic gradient (`fedsynth.client.train_fedsynsam`),
    reading rho, beta and the mix (`SynSAMRuleSettings`). The server builds `distillation.task`'s model to distil.
    """

    settings = SynSAMRuleSettings
    parameter_defaults = {"aggregation": paper_mean("fedsynsam")}  # its paper's mean (its row's rule)

    def __post_init__(self) -> None:
        # partitions whose node reported holding D_syn; the others get it with their next message
        self.synthetic_holders: set[int] = set()

    reply_metrics = {"synthetic-examples": ("int >= 0, how many synthetic examples the node holds (optional; "
                                            "the server re-sends 'synthetic-data' until it is > 0)")}

    def _dp_obstacle(self, side: str) -> str | None:
        """Client-side clipping's mod also refuses the train message that carries 'synthetic-data'."""
        if side == "client-side" and self.codec.compression == "none":
            return ("Flower's client-side clipping mod refuses a train message with more array records than the model, "
                    "and this strategy sends 'synthetic-data' with it")
        return super()._dp_obstacle(side)

    def _synthetic_record(self) -> ArrayRecord:
        """D_syn as it travels: float32 images `x` (model input space) and int64 labels `y`."""
        assert self.synthetic is not None
        return to_record({"x": self.synthetic[0], "y": self.synthetic[1]})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if self.synthetic is None:
            return messages
        record = to_record({"x": self.synthetic[0], "y": self.synthetic[1]})  # float32 images, int64 labels
        partition_of_node = {n.node_id: n.partition_id for n in self.node_table.nodes}
        for message in messages:
            if partition_of_node[message.metadata.dst_node_id] not in self.synthetic_holders:
                message.content[SYNTHETIC_DATA] = record
        return messages

    def _aggregate_good(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        holding = [self.node_table.partition_of(r) for r in replies
                   if r.content.metric_records["metrics"].get("synthetic-examples", 0) > 0]
        self.synthetic_holders.update(holding)
        arrays, metrics = super()._aggregate_good(server_round, replies)
        if metrics is None or self.synthetic is None:
            return arrays, metrics
        # how many of this round's nodes trained with D_syn (read from their state, or just received)
        return arrays, MetricRecord({**dict(metrics), "synthetic-holders": len(holding)})

    def on_resume(self) -> None:
        super().on_resume()
        self.synthetic_holders = set()  # resumed nodes may start with empty state: send D_syn again

    def state_meta(self) -> dict[str, Any]:
        return {**super().state_meta(), "synthetic-holders": sorted(self.synthetic_holders)}

    def load_state_meta(self, meta: Mapping[str, Any]) -> None:
        super().load_state_meta(meta)
        self.synthetic_holders = set(meta.get("synthetic-holders", []))
