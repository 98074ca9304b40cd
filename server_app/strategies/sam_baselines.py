"""Server sides of the FedLESAM family, the FedSynSAM paper's baselines (SPEC 4.1).

- `fedlesam`: FedAvg that sends the previous global update (PreviousUpdateStrategy),
  plus the perturbation diagnostic when it is on (simulation only).
- `fedlesam-s`: SCAFFOLD's server that also sends the previous global update
  (FedLESAM + control variates; 2x uplink, counted, compressed like the model).
- `fedlesam-d`: FedDyn's server (Acar et al., 2021) that also sends the previous
  global update. It keeps `h`, updated from the nodes' dynamic corrections
  `g_i+ - g_i` (2x uplink): `h += (1/N) sum_i (g_i+ - g_i)`, and takes
  `w <- w + server_lr * mean Q(Delta_i) - h / alpha`. With `g_i+ - g_i =
  -alpha Delta_i` this is FedDyn's `h <- h - alpha/N sum_i Delta_i`; receiving the
  corrections instead of deriving them keeps `h` equal to the mean of the nodes'
  `g_i` when the model update is compressed.

- `fedsmoo` (Sun et al., 2023): FedDyn's server with `h` derived from the
  (decoded) model updates, `h -= (alpha/N) sum_i Delta_i`, and the global
  perturbation `s = rho * mean_i(mu_i - e_i) / ||mean_i(mu_i - e_i)||` from the
  nodes' perturbation corrections (2x uplink), sent down with the model.

(`fedgamma`, FedSAM + SCAFFOLD, uses the SCAFFOLD server unchanged.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from common.protocol import (
    DYNAMIC_CORRECTION, GLOBAL_PERTURBATION, PERTURBATION_DUAL, PREVIOUS_UPDATE, STATE_DYN_GRADIENT,
)
from common.records import Weights, check_weights, from_record, to_record
from common.algorithms.rule_settings import FedDynSAMSettings, SAMSettings
from server_app.robust import bounded_record, record_norm_problem, scale_update
from server_app.strategies.fedavg import FedAvg, parameter_change
from server_app.strategies.parameters import documented
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.scaffold import Scaffold

if TYPE_CHECKING:  # the diagnostic needs torch; the registry attaches one only when it is on
    from server_app.perturbation import PerturbationDiagnostic


@documented
class FedLESAM(PreviousUpdateStrategy):
    """FedLESAM (Fan et al., 2024): the server sends the previous global update `w^t - w^{t-1}`; nodes perturb
    along it (a locally estimated global ascent) with radius rho (`SAMSettings`). Logs the perturbation diagnostic when on.
    """

    settings = SAMSettings

    # the app's perturbation diagnostic (simulation only), attached by server_app/registry.py when it is on
    diagnostic: PerturbationDiagnostic | None = None

    def _aggregate_good(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        measured = {}
        if self.diagnostic is not None and replies:
            measured = self.diagnostic.measure(self.current, [self.node_table.partition_of(r) for r in replies], self.previous_update, None)
        arrays, metrics = super()._aggregate_good(server_round, replies)
        if metrics is None or not measured:
            return arrays, metrics
        return arrays, MetricRecord({**dict(metrics), **measured})


@documented
class FedLESAMS(Scaffold):
    """FedLESAM-S: SCAFFOLD's server that also sends the previous global update; nodes perturb along it with
    radius rho (`SAMSettings`) and reply with SCAFFOLD's "scaffold-delta-c".
    """

    settings = SAMSettings

    previous_update: Weights | None = None

    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        records = super().downlink_records(server_round)
        if self.previous_update is not None:
            records[PREVIOUS_UPDATE] = to_record(self.previous_update)
        return records

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        new = super().server_step(mean_delta, replies)
        self.previous_update = parameter_change(new, self.current, self._parameter_names)
        return new

    def state_arrays(self) -> dict[str, Weights]:
        groups = super().state_arrays()
        if self.previous_update is not None:
            groups["previous-update"] = self.previous_update
        return groups

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        super().load_state_arrays(groups)
        self.previous_update = groups.get("previous-update")


def feddyn_server_state(h: Weights, corrections: list[Mapping[str, np.ndarray]], num_clients: int) -> Weights:
    """h + (1/N) sum_i (g_i+ - g_i), accumulated in float64."""
    return {
        name: (h[name] + sum(c[name].astype(np.float64) for c in corrections) / num_clients).astype(np.float32)
        for name in h
    }


@documented
class FedLESAMD(FedAvg):
    """FedLESAM-D: FedLESAM with FedDyn's dynamic regulariser; the server keeps FedDyn's `h` and sends the previous
    global update; nodes reply with their correction `g_i+ - g_i` in the record "dynamic-correction".
    """

    settings = FedDynSAMSettings

    def __post_init__(self) -> None:
        self.h: Weights | None = None
        self.previous_update: Weights | None = None
        # each node's g_i, rebuilt from its corrections, to hand back after a resume
        self.client_gradients: dict[int, Weights] = {}

    notifies_accepted_scale = True  # g_i changes with the update: a clipped node scales its own change too
    reply_records = {DYNAMIC_CORRECTION: ("ArrayRecord(g_i+ - g_i over the trainable parameters: train_fedlesam_d's "
                                          "result.correction), which fedsynth.client.train_reply(msg, model, "
                                          "result, num_examples=n) adds")}

    def _h(self) -> Weights:
        if self.h is None:
            self.h = {name: np.zeros_like(self.current[name]) for name in self._parameter_names}
        return self.h

    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        return {PREVIOUS_UPDATE: to_record(self.previous_update)} if self.previous_update is not None else {}

    def check_extra_records(self, content: RecordDict) -> str | None:
        record = content.array_records.get(DYNAMIC_CORRECTION)
        if record is None:
            return f"reply lacks the '{DYNAMIC_CORRECTION}' record"
        correction = from_record(record)
        return check_weights(correction, self._h(), DYNAMIC_CORRECTION) or record_norm_problem(
            correction, self.max_record_norm, self.update_norm_action, DYNAMIC_CORRECTION)

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        ordered = sorted(replies, key=self.node_table.partition_of)
        # g_i+ - g_i = -alpha (w_i - w): scaled with the client's update where a bound clipped it (`update_scales`)
        corrections = [bounded_record(scale_update(from_record(r.content.array_records[DYNAMIC_CORRECTION]),
                                                   self.update_scales.get(self.node_table.partition_of(r), 1.0)),
                                      self.max_record_norm) for r in ordered]
        for reply, correction in zip(ordered, corrections):
            previous = self.client_gradients.get(self.node_table.partition_of(reply))
            self.client_gradients[self.node_table.partition_of(reply)] = (
                correction if previous is None else {n: (previous[n] + correction[n]).astype(np.float32) for n in correction}
            )
        self.h = feddyn_server_state(self._h(), corrections, len(self.node_table.nodes))
        new = super().server_step(mean_delta, replies)
        alpha = self.dyn_alpha
        for name in self._parameter_names:
            new[name] = (new[name] - self.h[name] / alpha).astype(np.float32)
        self.previous_update = parameter_change(new, self.current, self._parameter_names)
        return new

    def _node_state_records(self, partition_id: int) -> dict[str, ArrayRecord]:
        gradient = self.client_gradients.get(partition_id)
        return {STATE_DYN_GRADIENT: to_record(gradient)} if gradient is not None else {}

    def state_arrays(self) -> dict[str, Weights]:
        groups = {f"client-gradient-{pid}": g for pid, g in self.client_gradients.items()}
        if self.h is not None:
            groups["h"] = self.h
        if self.previous_update is not None:
            groups["previous-update"] = self.previous_update
        return groups

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        self.h = groups.get("h")
        self.previous_update = groups.get("previous-update")
        prefix = "client-gradient-"
        self.client_gradients = {int(k[len(prefix):]): dict(v) for k, v in groups.items() if k.startswith(prefix)}


def smoo_global_perturbation(duals: list[Mapping[str, np.ndarray]], rho: float) -> Weights:
    """FedSMOO's s = rho * m / ||m|| with m the mean of the nodes' corrections (one norm over all tensors)."""
    mean = {name: sum(d[name].astype(np.float64) for d in duals) / len(duals) for name in duals[0]}
    norm = float(np.sqrt(sum(float(np.sum(m ** 2)) for m in mean.values())))
    scale = rho / (norm + 1e-12) if norm > 0 else 0.0
    return {name: (m * scale).astype(np.float32) for name, m in mean.items()}


@documented
class FedSMOO(FedAvg):
    """FedSMOO (Sun et al., 2023): FedDyn's server (`h` from the updates) with a global perturbation `s` sent down;
    nodes reply with their perturbation correction in the record "perturbation-dual".
    """

    settings = FedDynSAMSettings

    def __post_init__(self) -> None:
        self.h: Weights | None = None
        self.perturbation: Weights | None = None

    notifies_accepted_scale = True  # g_i changes with the update: a clipped node scales its own change too
    reply_records = {PERTURBATION_DUAL: ("ArrayRecord(mu_i - e_i over the trainable parameters: train_fedsmoo's "
                                         "result.perturbation_dual), which fedsynth.client.train_reply(msg, model, "
                                         "result, num_examples=n) adds")}

    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        return {GLOBAL_PERTURBATION: to_record(self.perturbation)} if self.perturbation is not None else {}

    def check_extra_records(self, content: RecordDict) -> str | None:
        record = content.array_records.get(PERTURBATION_DUAL)
        if record is None:
            return f"reply lacks the '{PERTURBATION_DUAL}' record"
        reference = {name: self.current[name] for name in self._parameter_names}
        dual = from_record(record)
        return check_weights(dual, reference, PERTURBATION_DUAL) or record_norm_problem(
            dual, self.max_record_norm, self.update_norm_action, PERTURBATION_DUAL)

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        ordered = sorted(replies, key=self.node_table.partition_of)
        self.perturbation = smoo_global_perturbation(
            [bounded_record(from_record(r.content.array_records[PERTURBATION_DUAL]), self.max_record_norm)
             for r in ordered], self.sam_rho
        )
        alpha = self.dyn_alpha
        # the updates as the mean took them: scaled by the bounds' factors (`update_scales`)
        updates = [scale_update(self.reply_gate.delta(r), self.update_scales.get(self.node_table.partition_of(r), 1.0))
                   for r in ordered]
        corrections = [{n: -alpha * d[n] for n in self._parameter_names} for d in updates]
        if self.h is None:
            self.h = {name: np.zeros_like(self.current[name]) for name in self._parameter_names}
        self.h = feddyn_server_state(self.h, corrections, len(self.node_table.nodes))
        new = super().server_step(mean_delta, replies)
        for name in self._parameter_names:
            new[name] = (new[name] - self.h[name] / alpha).astype(np.float32)
        return new

    def state_arrays(self) -> dict[str, Weights]:
        groups = {}
        if self.h is not None:
            groups["h"] = self.h
        if self.perturbation is not None:
            groups["perturbation"] = self.perturbation
        return groups

    def load_state_arrays(self, groups: Mapping[str, Weights]) -> None:
        self.h = groups.get("h")
        self.perturbation = groups.get("perturbation")
