"""SCAFFOLD's control-variate rules (Karimireddy et al., 2020, option II), on numpy arrays.

The client's c_i+ and the server's c update, as pure functions with hand-computed tests
(tests/test_losses.py). numpy alone: the server's Scaffold strategy uses them without loading torch
(tests/test_light_import.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def scaffold_client_control(
    c_local: Mapping[str, np.ndarray],
    c_global: Mapping[str, np.ndarray],
    w_global: Mapping[str, np.ndarray],
    w_local: Mapping[str, np.ndarray],
    num_steps: int,
    lr: float,
) -> dict[str, np.ndarray]:
    """SCAFFOLD option II: c_i+ = c_i - c + (w_global - w_local) / (K * lr)."""
    return {
        name: (c_local[name] - c_global[name] + (w_global[name] - w_local[name]) / (num_steps * lr)).astype(np.float32)
        for name in c_local
    }


def scaffold_clipped_control_delta(
    control_delta: Mapping[str, np.ndarray],
    c_global: Mapping[str, np.ndarray],
    scale: float,
) -> Mapping[str, np.ndarray]:
    """A client's c_i+ - c_i as if its update w_i - w had been `scale` times as long: s (c_i+ - c_i) + (s - 1) c.

    Option II gives c_i+ - c_i = -c + (w - w_i) / (K lr), so the update's part is (c_i+ - c_i) + c; scaling only
    that part keeps the server's c consistent with the step it took when a bound clipped the update, with no need
    to know K or lr. scale 1 returns the delta itself.
    """
    if scale == 1.0:
        return control_delta
    return {
        name: (scale * control_delta[name].astype(np.float64) + (scale - 1.0) * c_global[name].astype(np.float64))
        .astype(np.float32)
        for name in control_delta
    }


def scaffold_update_part(
    control_delta: Mapping[str, np.ndarray],
    c_global: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The update's part of a client's option-II control change: (c_i+ - c_i) + c = (w - w_i) / (K lr), the part
    `scaffold_clipped_control_delta` scales (a node keeps it to scale its own c_i the same way)."""
    return {name: (control_delta[name].astype(np.float64) + c_global[name].astype(np.float64)).astype(np.float32)
            for name in control_delta}


def scaffold_server_control(
    c_global: Mapping[str, np.ndarray],
    control_deltas: Sequence[Mapping[str, np.ndarray]],
    num_clients: int,
) -> dict[str, np.ndarray]:
    """SCAFFOLD server: c += (1/N) * sum over sampled clients of (c_i+ - c_i)."""
    return {
        name: (c_global[name] + sum(d[name].astype(np.float64) for d in control_deltas) / num_clients).astype(np.float32)
        for name in c_global
    }
