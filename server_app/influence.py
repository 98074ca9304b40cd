"""Bounded influence of one client on a weighted mean: no weight share above `max-weight-share`.

A weighted mean (FedAvg's sample-count weights, the test-count weighted local
accuracy) trusts the counts the nodes claim. A node that claims 10^12 examples
at the handshake and in every reply owns the mean: the global model becomes
its local model and the round's local test accuracy its own. The counts cannot
be verified by the server, so their effect is bounded instead: every client's
share of a mean is capped at `max-weight-share` and the excess is handed to the
others in proportion to their own weights ("water-filling"), in every mean
of more than 1 / max-weight-share clients (fewer cannot be capped without
making the mean uniform). Honest runs whose
largest share is already below the cap are unchanged, bit for bit, because the
weights are then returned as they came.

A mean of values v_i with shares p_i <= s moves by at most s * |v_h - mean of
the others| when one client h changes what it sends, whatever it claims: the
bound the property tests check (tests/test_influence.py).

Pure functions of lists of numbers, unit-tested against hand-computed values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def capped_shares(weights: Sequence[float], max_share: float) -> list[float]:
    """The shares w_i / sum(w), with every share capped at `max_share` and the excess spread over the rest.

    The others keep their proportions. When the cap cannot hold with room to spare (n * max_share <= 1:
    e.g. two replies and a cap of 0.5) capping would make every share 1/n and throw the sample weighting
    away for honest clients too, so the shares are left as they are: the cap protects rounds with more than
    1 / max_share replies. All-zero weights give equal shares. `max_share` >= 1 leaves the shares as they are.
    """
    n = len(weights)
    if n == 0:
        return []
    values = [float(w) for w in weights]
    total = math.fsum(values)
    if total <= 0 or n == 1:
        return [1.0 / n] * n
    shares = [w / total for w in values]
    if max_share >= 1.0 or max(shares) <= max_share:
        return shares
    if n * max_share <= 1.0:
        return shares
    capped: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in capped]
        free_total = math.fsum(values[i] for i in free)
        mass = 1.0 - len(capped) * max_share
        over = [i for i in free if free_total <= 0 or values[i] / free_total * mass > max_share]
        if not over:
            return [max_share if i in capped else values[i] / free_total * mass for i in range(n)]
        capped.update(over)
        if len(capped) == n:  # unreachable when n * max_share > 1; kept so the loop always ends
            return shares


def capped_counts(counts: Sequence[float], max_share: float) -> list[float]:
    """The counts with the largest lowered so that none is more than `max_share` of their new total.

    The uncapped counts stay as they are (so server work that scales with a
    claim, FedDDPM's auxiliary sampling, is bounded by what the others claim);
    when the cap cannot hold (n * max_share <= 1) the counts are left as they are.
    """
    if len(counts) <= 1 or max_share >= 1.0:
        return [float(c) for c in counts]
    shares = capped_shares(counts, max_share)
    uncapped = [i for i, (c, p) in enumerate(zip(counts, shares)) if 0 < p < max_share and c > 0]
    if not uncapped:  # the cap cannot hold, or every count is exactly at it
        return [float(c) for c in counts]
    scale = float(counts[uncapped[0]]) / shares[uncapped[0]]  # the same for every uncapped count
    return [float(c) if i in uncapped else p * scale for i, (c, p) in enumerate(zip(counts, shares))]


def bounded_weights(weights: Sequence[float], max_share: float) -> list[float]:
    """The weights as they are when no share exceeds `max_share`, else `capped_shares` (which sum to 1).

    Returning honest weights untouched keeps the means they weight bitwise what they were before the cap.
    """
    values = [float(w) for w in weights]
    total = math.fsum(values)
    if total > 0 and max(values) <= max_share * total:
        return values
    return capped_shares(values, max_share)


def capped_mean(values: Sequence[float], weights: Sequence[float], max_share: float) -> float:
    """sum_i p_i * v_i with p = capped_shares(weights, max_share)."""
    return math.fsum(p * float(v) for p, v in zip(capped_shares(weights, max_share), values))
