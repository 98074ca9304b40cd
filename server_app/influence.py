"""Bounded influence of one client on a weighted mean: no weight share above `max-weight-share`.

A weighted mean (FedAvg's sample-count weights, the test-count weighted local
accuracy) trusts the counts the nodes claim. A node that claims 10^12 examples
at the handshake and in every reply owns the mean: the global model becomes
its local model and the round's local test accuracy its own. The counts cannot
be verified by the server, so their effect is bounded instead: every client's
share of a mean of n > 1 clients is capped at max(max-weight-share, 1/n) and
the excess is handed to the others in proportion to their own weights
("water-filling"). The cap holds at every n > 1: where max-weight-share is at
or below 1/n (two clients under the default 0.4) the mean is uniform, since no
weighting can then keep every share under the cap. Honest runs whose largest
share is already below the cap are unchanged, bit for bit, because the weights
are then returned as they came.

A mean of values v_i with shares p_i <= s moves by at most s * |v_h - mean of
the others| when one client h changes what it sends, whatever it claims: the
bound the property tests check (tests/test_influence.py).

Pure functions of lists of numbers, unit-tested against hand-computed values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def share_cap(max_share: float, n: int) -> float:
    """The cap on one share of a mean of `n` clients: max(max_share, 1/n) (1/n: the uniform mean)."""
    return max(float(max_share), 1.0 / n) if n > 0 else 1.0


def capped_shares(weights: Sequence[float], max_share: float) -> list[float]:
    """The shares w_i / sum(w), with every share capped at `share_cap(max_share, n)` and the excess spread over the rest.

    The others keep their proportions. The cap applies at every n > 1; where `max_share` <= 1/n it is 1/n,
    and the shares are uniform. All-zero weights give equal shares. `max_share` >= 1 leaves the shares as
    they are.
    """
    n = len(weights)
    if n == 0:
        return []
    values = [float(w) for w in weights]
    total = math.fsum(values)
    if total <= 0 or n == 1:
        return [1.0 / n] * n
    shares = [w / total for w in values]
    cap = share_cap(max_share, n)
    if cap >= 1.0 or max(shares) <= cap:
        return shares
    if cap * n <= 1.0:  # max_share <= 1/n: only the uniform mean keeps every share under it
        return [1.0 / n] * n
    capped: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in capped]
        free_total = math.fsum(values[i] for i in free)
        mass = 1.0 - len(capped) * cap
        over = [i for i in free if free_total <= 0 or values[i] / free_total * mass > cap]
        if not over:
            return [cap if i in capped else values[i] / free_total * mass for i in range(n)]
        capped.update(over)
        if len(capped) == n:  # unreachable when n * cap > 1; kept so the loop always ends
            return [1.0 / n] * n


def capped_counts(counts: Sequence[float], max_share: float) -> list[float]:
    """The counts with the largest lowered so that none is more than the cap (`share_cap`) of their new total.

    The uncapped counts stay as they are (so server work that scales with a
    claim, FedDDPM's auxiliary sampling, is bounded by what the others claim);
    where the cap makes the shares uniform, every count is lowered to the smallest positive one.
    """
    if len(counts) <= 1 or max_share >= 1.0:
        return [float(c) for c in counts]
    cap = share_cap(max_share, len(counts))
    if cap * len(counts) <= 1.0:  # the cap makes the mean uniform: no count above the smallest
        smallest = min((float(c) for c in counts if c > 0), default=0.0)
        return [min(float(c), smallest) for c in counts]
    shares = capped_shares(counts, max_share)
    uncapped = [i for i, (c, p) in enumerate(zip(counts, shares)) if 0 < p < cap and c > 0]
    if not uncapped:  # every count is exactly at the cap
        return [float(c) for c in counts]
    scale = float(counts[uncapped[0]]) / shares[uncapped[0]]  # the same for every uncapped count
    return [float(c) if i in uncapped else p * scale for i, (c, p) in enumerate(zip(counts, shares))]


def bounded_weights(weights: Sequence[float], max_share: float) -> list[float]:
    """The weights as they are when no share exceeds the cap (`share_cap`), else `capped_shares` (which sum to 1).

    Returning honest weights untouched keeps the means they weight bitwise what they were before the cap.
    """
    values = [float(w) for w in weights]
    total = math.fsum(values)
    if total > 0 and max(values) <= share_cap(max_share, len(values)) * total:
        return values
    return capped_shares(values, max_share)


def cap_binds(weights: Sequence[float], max_share: float) -> bool:
    """Whether the cap changes these weights: some share above `share_cap(max_share, n)` (n > 1)."""
    values = [float(w) for w in weights]
    total = math.fsum(values)
    return len(values) > 1 and total > 0 and max(values) > share_cap(max_share, len(values)) * total


def capped_mean(values: Sequence[float], weights: Sequence[float], max_share: float) -> float:
    """sum_i p_i * v_i with p = capped_shares(weights, max_share)."""
    return math.fsum(p * float(v) for p, v in zip(capped_shares(weights, max_share), values))
