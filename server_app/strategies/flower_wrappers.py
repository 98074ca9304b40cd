"""Flower's strategy wrappers around fedsynth's strategies: a wrapper that cannot do its job is refused at start.

Flower's differential-privacy wrappers (flwr.serverapp.strategy) assume
Flower's FedAvg wire format:

- the server-side ones (`DifferentialPrivacyServerSide{Fixed,Adaptive}Clipping`)
  clip every `ArrayRecord` of every train reply as if it were the model, before
  the wrapped strategy sees it;
- the client-side ones (`DifferentialPrivacyClientSide{Fixed,Adaptive}Clipping`)
  rely on Flower's `fixedclipping_mod` / `adaptiveclipping_mod` on the node,
  which refuse a train message or reply with more than one `ArrayRecord`;
- both add noise to what the wrapped strategy's `aggregate_train` returns.

So they protect a strategy whose nodes send exactly their model, uncompressed,
in rounds the wrapper sees. A compressed reply (`compressed-update`, the codec's
payload, plus `model-buffers`) crashed the server-side clipping with a numpy
broadcast error; SCAFFOLD's `scaffold-delta-c` would be "clipped" as a model
and silently corrupted; FedDDPM's warm models reach the server outside the
rounds, unclipped; the decentralized nodes keep and exchange their own models,
which the wrapper never noises. Decoding a compressed update before clipping is
not possible from inside the wrapped strategy: the wrapper clips before it is
called. Each such pair is refused when the wrapper starts (its first
`configure_train`), with one sentence why (`WrapperRefused`), before any
message is sent. Other wrappers pass.

The wrapped strategy finds its wrapper on the call stack: the caller of its
`configure_train` whose `strategy` attribute is the strategy itself, as every
Flower wrapper holds the strategy it wraps.
"""

from __future__ import annotations

import sys
from typing import Any

from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

SERVER_SIDE = (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyServerSideAdaptiveClipping)
CLIENT_SIDE = (DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyClientSideAdaptiveClipping)
_MAX_FRAMES = 12  # the wrapper calls configure_train directly; a subclass's super() calls add a few frames


class WrapperRefused(ValueError):
    """A Flower strategy wrapper that cannot do its job around this fedsynth strategy (one sentence why)."""


def wrapper_of(strategy: Any) -> Any | None:
    """The object up the call stack that wraps `strategy` (its `strategy` attribute is it), or None."""
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        caller = frame.f_locals.get("self")
        if caller is not None and caller is not strategy and getattr(caller, "strategy", None) is strategy:
            return caller
        frame = frame.f_back
    return None


def clipping_side(wrapper: Any) -> str | None:
    """"server-side" or "client-side" for Flower's DP wrappers, None for any other wrapper."""
    if isinstance(wrapper, SERVER_SIDE):
        return "server-side"
    if isinstance(wrapper, CLIENT_SIDE):
        return "client-side"
    return None


def refuse_unsupported_wrapper(strategy: Any) -> None:
    """Raise WrapperRefused when a Flower DP wrapper wraps `strategy` and cannot clip what its nodes send.

    Checked once per strategy (the first `configure_train`); the strategy's `dp_obstacle(side)` says why not.
    """
    if getattr(strategy, "_wrapper_checked", False):
        return
    strategy._wrapper_checked = True
    wrapper = wrapper_of(strategy)
    side = clipping_side(wrapper) if wrapper is not None else None
    if side is None:
        return
    reason = strategy._dp_obstacle(side)
    if reason is not None:
        raise WrapperRefused(f"{type(wrapper).__name__} cannot wrap fedsynth's {type(strategy).__name__}: {reason} "
                             "(docs/library.md, 'Composing with Flower').")
