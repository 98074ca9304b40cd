"""A node's state that follows its update, kept equal to the server's after bounded influence clipped the update.

SCAFFOLD's c_i and FedDyn's g_i (FedLESAM-D, FedSMOO) change each round by a part proportional to the node's
update w_i - w: option II's c_i+ - c_i = -c + (w - w_i) / (K lr), FedDyn's g_i+ - g_i = -alpha (w_i - w). When
`bounded-influence` scales a node's update by s < 1, the server folds in the state change of the update it took
(s times that part: server_app/strategies/scaffold.py, sam_baselines.py), so its c (or h) stays the mean of the
nodes' states only if the node scales its own state change too. The node cannot know s when it replies, so the
server tells it in its next train message, under two explicit keys of the message's config:

- `ACCEPTED_SCALE_KEY` ("accepted-update-scale"): s, in (0, 1);
- `ACCEPTED_ROUND_KEY` ("accepted-update-round"): the round whose update it scaled.

The node keeps the update's part of its last state change with that round (client_app/accepted_scale.py) and,
when the round matches, sets state <- state + (s - 1) part (`rescaled_state`) before it trains; the server sends
the notice until the node answers a round that carried it, and a node whose kept round differs (it applied the
notice already, or trained since) leaves its state alone, so a notice is applied once. Pure numpy, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

ACCEPTED_SCALE_KEY = "accepted-update-scale"
ACCEPTED_ROUND_KEY = "accepted-update-round"
ACCEPTED_SCALE_KEYS = (ACCEPTED_SCALE_KEY, ACCEPTED_ROUND_KEY)


def rescaled_state(state: Mapping[str, np.ndarray], update_part: Mapping[str, np.ndarray],
                   scale: float) -> dict[str, np.ndarray]:
    """state + (scale - 1) * update_part, accumulated in float64: the state as if its change's update part had
    been `scale` times as long (the update the server took)."""
    return {name: (state[name].astype(np.float64) + (scale - 1.0) * update_part[name].astype(np.float64))
            .astype(np.float32) for name in state}


def accepted_scale(config: Mapping[str, Any]) -> tuple[float, int] | None:
    """(s, round) of a train message's notice, or None when it carries none; ValueError naming the key when a
    value is not a finite number in (0, 1) or a round >= 1, or when one of the two keys comes without the other."""
    given = [key for key in ACCEPTED_SCALE_KEYS if key in config]
    if not given:
        return None
    if len(given) == 1:
        missing = next(key for key in ACCEPTED_SCALE_KEYS if key not in config)
        raise ValueError(f"the train message's config carries {given[0]!r} without {missing!r}")
    scale, round_ = config[ACCEPTED_SCALE_KEY], config[ACCEPTED_ROUND_KEY]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or not 0 < scale < 1:
        raise ValueError(f"train message setting {ACCEPTED_SCALE_KEY!r} = {scale!r} is invalid; accepted: a number "
                         "in (0, 1), the scale the server applied to this node's clipped update")
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 1:
        raise ValueError(f"train message setting {ACCEPTED_ROUND_KEY!r} = {round_!r} is invalid; accepted: an "
                         "integer >= 1, the round of the clipped update")
    return float(scale), int(round_)
