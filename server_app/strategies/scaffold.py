"""SCAFFOLD (Karimireddy et al., 2020): control variates correct client drift.

The server sends its control variate `c` with the model and receives each
sampled client's `c_i+ - c_i`; it applies `c += (1/N) * sum(c_i+ - c_i)` with N
the number of clients in the federation. Control variates travel both ways, so
SCAFFOLD's traffic is twice FedAvg's, and the bytes counters see it because
they count every record sent.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict

from common.protocol import SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA, STATE_SCAFFOLD_CONTROL
from common.algorithms.scaffold_control import scaffold_clipped_control_delta, scaffold_server_control
from common.records import Weights, from_record, to_record
from common.algorithms.aggregation_settings import RecordBoundSettings
from server_app.robust import bounded_record, record_norm_problem
from common.records import check_weights
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.parameters import documented


@documented
class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al., 2020): the server sends its control variate `c` beside the model; nodes
    train with `fedsynth.client.train_scaffold` and reply with `c_i+ - c_i` in the record "scaffold-delta-c"
    (the server sends `c` as "scaffold-c").
    """

    settings = RecordBoundSettings

    def __post_init__(self) -> None:
        self.client_controls: dict[int, Weights] = {}

    control: Weights | None = None
    notifies_accepted_scale = True  # c_i changes with the update: a clipped node scales its own change too

    def state_arrays(self) -> dict[str, Weights]:
        groups = {f"client-control-{pid}": c for pid, c in self.client_controls.items()}
        if self.control is not None:
            groups["control"] = self.control
        return groups

    def load_state_arrays(self, groups) -> None:
        self.control = groups.get("control")
        prefix = "client-control-"
        self.client_controls = {int(k[len(prefix):]): v for k, v in groups.items() if k.startswith(prefix)}

    def _node_state_records(self, partition_id: int) -> dict[str, ArrayRecord]:
        control = self.client_controls.get(partition_id)
        return {STATE_SCAFFOLD_CONTROL: to_record(control)} if control is not None else {}

    reply_records = {SCAFFOLD_CONTROL_DELTA: (f"ArrayRecord(c_i+ - c_i, the arrays of '{SCAFFOLD_CONTROL}'), which "
                                              "fedsynth.client.scaffold_reply(msg, model, train_scaffold(...), "
                                              "num_examples=n) adds")}

    def _control(self) -> Weights:
        if self.control is None:
            # over the trainable parameters only: buffers have no gradient, and clients send c_i+ - c_i for
            # their parameters (client_app/rules.py)
            self.control = {name: np.zeros_like(self.current[name]) for name in self._parameter_names}
        return self.control

    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        return {SCAFFOLD_CONTROL: to_record(self._control())}

    def check_extra_records(self, content: RecordDict) -> str | None:
        record = content.array_records.get(SCAFFOLD_CONTROL_DELTA)
        if record is None:
            return f"reply lacks the '{SCAFFOLD_CONTROL_DELTA}' record"
        delta = from_record(record)
        return check_weights(delta, self._control(), SCAFFOLD_CONTROL_DELTA) or record_norm_problem(
            delta, self.max_record_norm, self.update_norm_action, SCAFFOLD_CONTROL_DELTA)

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        ordered = sorted(replies, key=self.node_table.partition_of)
        # c_i+ - c_i as if the update were as long as the bounds left it (`update_scales`), so c stays consistent
        # with the step the server took; then within the record bound (`RecordBoundSettings`), so that one node's control variate cannot
        # drag c (and every client's correction) away
        control = self._control()
        deltas = [bounded_record(scaffold_clipped_control_delta(
            from_record(r.content.array_records[SCAFFOLD_CONTROL_DELTA]), control,
            self.update_scales.get(self.node_table.partition_of(r), 1.0)), self.max_record_norm) for r in ordered]
        for reply, delta in zip(ordered, deltas):
            previous = self.client_controls.get(self.node_table.partition_of(reply))
            self.client_controls[self.node_table.partition_of(reply)] = (
                delta if previous is None else {n: (previous[n] + delta[n]).astype(np.float32) for n in delta}
            )
        self.control = scaffold_server_control(self._control(), deltas, len(self.node_table.nodes))
        return super().server_step(mean_delta, replies)
