"""Flower's DP wrappers around every public fedsynth strategy: they work, or `start()` refuses them before any
message is sent, with one sentence why (docs/library.md, "Composing with Flower"; issue 53)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fedsynth import strategies
from server_app.strategies.flower_wrappers import WrapperRefused
from tests.library_grid import ClientAppGrid, passthrough_wrapper
from tests.test_reply_builders import bn_net, initial, no_reply_dropped, plain_train

torch.set_num_threads(1)

SERVER = "server-side"
CLIENT = "client-side"
SERVER_MODEL = {"distillation": strategies.DistillationSettings(
    task=strategies.ServerTask(model="tests.bn_models:bn_cnn", dataset="mnist"))}
DIFFUSION = {"diffusion": strategies.DiffusionTraining(
    task=strategies.ServerTask(model="unet-small", image_size=8, diffusion_timesteps=20))}

# public class, its arguments, and which clipping side Flower's wrappers can protect it with
RING = {"gossip": strategies.Gossip(topology="ring")}  # a graph that fits any node count
CASES = [
    ("FedAvg", {}, {SERVER, CLIENT}),
    ("FedAvgM", {}, {SERVER, CLIENT}),
    ("FedSAM", {}, {SERVER, CLIENT}),
    ("FedCOG", {}, {SERVER, CLIENT}),
    ("FedProx", {}, {SERVER, CLIENT}),
    ("MOON", {}, {SERVER, CLIENT}),
    ("FedGamma", {}, set()),  # SCAFFOLD's replies
    ("FedLESAMS", {}, set()),
    ("MoFedSAM", {}, {SERVER}),  # sends "previous-update" with the model: the client-side mod refuses the message
    ("FedLESAM", {}, {SERVER}),
    ("FedLESAMD", {}, set()),  # replies carry "dynamic-correction"
    ("FedSMOO", {}, set()),  # replies carry "perturbation-dual"
    ("Scaffold", {}, set()),  # replies carry "scaffold-delta-c"
    ("FedSynSAM", SERVER_MODEL, {SERVER}),  # sends "synthetic-data" with the model
    ("DynaFed", SERVER_MODEL, {SERVER, CLIENT}),
    ("FedDDPM", DIFFUSION, set()),  # the warm models come outside the rounds
    ("FedDDPMPlus", DIFFUSION, set()),
    ("DFedAvg", RING, set()),  # the nodes keep and exchange their own models
    ("OledFL", RING, set()),
    ("DPSGD", RING, set()),
    ("DFedAvgM", RING, set()),
    ("DFedSAM", RING, set()),
]


def test_the_cases_cover_every_public_strategy():
    classes = {name for name in strategies.__all__ if hasattr(getattr(strategies, name), "configure_train")}
    assert {name for name, _, _ in CASES} == classes


@pytest.mark.parametrize(("name", "arguments", "protected"), CASES, ids=[case[0] for case in CASES])
def test_each_strategy_says_which_clipping_side_can_protect_it(name, arguments, protected):
    strategy = getattr(strategies, name)(**arguments)
    for side in (SERVER, CLIENT):
        reason = strategy._dp_obstacle(side)
        assert (reason is None) == (side in protected), (name, side, reason)
        assert reason is None or ". " not in reason  # one clause of the one-sentence refusal
    compressed = getattr(strategies, name)(**arguments, codec=strategies.QSGD(bits=4)) if protected else None
    if compressed is not None:  # every centralized strategy: compression makes the replies unclippable
        assert "'compressed-update'" in compressed._dp_obstacle(SERVER)


def dp(wrapper, strategy, clients: int = 2):
    return wrapper(strategy, noise_multiplier=0.0, clipping_norm=10.0, num_sampled_clients=clients)


@pytest.mark.parametrize("wrapper", [DifferentialPrivacyServerSideFixedClipping,
                                     DifferentialPrivacyClientSideFixedClipping])
def test_a_compressed_strategy_is_refused_before_any_message_is_sent(wrapper):
    """Issue 53: server-side clipping crashed on a compressed reply with a numpy broadcast error."""
    grid = ClientAppGrid(2, plain_train)
    with pytest.raises(WrapperRefused, match=rf"^{wrapper.__name__} cannot wrap fedsynth's FedAvg: its nodes reply "
                                             r"with the qsgd codec's payload \('compressed-update'\)"):
        dp(wrapper, strategies.FedAvg(codec=strategies.QSGD(bits=4))).start(grid, initial(), num_rounds=1, timeout=10)
    assert grid.sent == []


def test_scaffold_and_the_relay_and_fedddpm_are_refused_at_start():
    for strategy, says in [(strategies.Scaffold(), "would corrupt 'scaffold-delta-c'"),
                           (strategies.DFedAvg(gossip=strategies.Gossip(topology="ring")), "keep their own models"),
                           (strategies.FedDDPM(**DIFFUSION), "warm models in the warm-up")]:
        grid = ClientAppGrid(2, plain_train)
        with pytest.raises(WrapperRefused, match=says):
            dp(DifferentialPrivacyServerSideFixedClipping, strategy).start(grid, initial(), num_rounds=1, timeout=10)
        assert grid.sent == []


def test_server_side_clipping_protects_fedavg_over_batchnorm():
    """The uncompressed model of a BatchNorm net is clipped to the norm: the global update's norm is at most it."""
    inner = strategies.FedAvg(fraction_evaluate=0.0)
    wrapper = DifferentialPrivacyServerSideFixedClipping(inner, noise_multiplier=0.0, clipping_norm=1e-3,
                                                         num_sampled_clients=2)
    result = wrapper.start(ClientAppGrid(2, plain_train), initial(), num_rounds=1, timeout=10,
                           train_config=ConfigRecord({"lr": 0.5}))
    no_reply_dropped(inner)
    start = {k: v.numpy() for k, v in initial().items()}
    final = {k: v.numpy() for k, v in result.arrays.items()}
    change = np.sqrt(sum(np.sum((final[k].astype(np.float64) - start[k]) ** 2) for k in start if k.endswith("weight")
                         or k.endswith("bias")))
    assert 0 < change <= 1e-3 * 1.001


def test_client_side_clipping_runs_with_flowers_mod_around_the_developers_clientapp():
    def clipped_train(msg: Message, context: Context) -> Message:
        return fixedclipping_mod(msg, context, plain_train)

    inner = strategies.FedAvg(fraction_evaluate=0.0)
    wrapper = dp(DifferentialPrivacyClientSideFixedClipping, inner)
    grid = ClientAppGrid(2, clipped_train)
    wrapper.start(grid, initial(), num_rounds=2, timeout=10, train_config=ConfigRecord({"lr": 0.05}))
    no_reply_dropped(inner)
    assert all("clipping_norm" in m.content["config"] for m in grid.sent)


def test_any_other_wrapper_passes():
    """A wrapper that is not one of Flower's DP wrappers is not judged."""
    inner = strategies.FedAvg(codec=strategies.QSGD(bits=4), fraction_evaluate=0.0)
    passthrough_wrapper(inner).start(ClientAppGrid(2, plain_train), ArrayRecord(bn_net().state_dict()), num_rounds=1,
                             timeout=10, train_config=ConfigRecord({"lr": 0.05}))
    no_reply_dropped(inner)
