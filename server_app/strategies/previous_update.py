"""FedAvg that also sends the previous global update `w^t - w^{t-1}`.

MoFedSAM uses it as momentum in the local descent, FedLESAM as the SAM ascent
direction. In round 1 there is no previous update and nothing extra is sent.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Message

from common.protocol import PREVIOUS_UPDATE
from common.records import Weights, to_record
from server_app.strategies.parameters import documented
from server_app.strategies.fedavg import FedAvg, parameter_change


@documented
class PreviousUpdateStrategy(FedAvg):
    """FedAvg that remembers and sends the last global update."""

    previous_update: Weights | None = None

    def state_arrays(self) -> dict[str, Weights]:
        return {"previous-update": self.previous_update} if self.previous_update is not None else {}

    def load_state_arrays(self, groups) -> None:
        self.previous_update = groups.get("previous-update")

    def downlink_records(self, server_round: int) -> dict[str, ArrayRecord]:
        if self.previous_update is None:
            return {}
        return {PREVIOUS_UPDATE: to_record(self.previous_update)}

    def server_step(self, mean_delta: Weights, replies: list[Message]) -> Weights:
        new = super().server_step(mean_delta, replies)
        self.previous_update = parameter_change(new, self.current, self._parameter_names)
        return new
