"""The error that ends a first round of broken replies names what is missing and the `fedsynth.client` call that
sends it, for each strategy family (issue 53): plain, compressed, SCAFFOLD's, the dynamic rules', the
decentralized relay and FedDDPM's warm-up."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedsynth import strategies
from tests.library_grid import ClientAppGrid


def model() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32)), "bn.running_mean": Array(np.zeros(2, np.float32)),
                        "bn.num_batches_tracked": Array(np.array(0, dtype=np.int64))})


def plain_reply(msg: Message, context: Context) -> Message:
    """The template's reply, the model as "arrays", whatever the strategy asked for."""
    return Message(RecordDict({"arrays": msg.content["arrays"],
                               "metrics": MetricRecord({"num-examples": 4, "train_loss": 0.5})}), reply_to=msg)


def no_loss(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 4})}),
                   reply_to=msg)


def contract_error(strategy, train) -> str:
    with pytest.raises(strategies.ReplyContractError) as raised:
        strategy.start(ClientAppGrid(2, train), model(), num_rounds=2, timeout=10,
                       train_config=ConfigRecord({"lr": 0.1}))
    return str(raised.value)


def test_plain_a_missing_loss_names_the_metric_and_the_builder():
    text = contract_error(strategies.FedAvg(), no_loss)
    assert "'train-loss'" in text and '"arrays": ArrayRecord(the local model' in text
    assert "fedsynth.client.train_reply(msg, model, result, num_examples=n)" in text


@pytest.mark.parametrize("public", [strategies.FedSynSAM, strategies.FedAvg])
def test_compressed_a_model_sent_as_arrays_is_told_to_send_the_compressed_update_and_the_buffers(public):
    text = contract_error(public(codec=strategies.QSGD(bits=4)), plain_reply)
    assert "reply lacks the 'compressed-update' record" in text
    assert '"compressed-update": the qsgd codec' in text and '"model-buffers"' in text and 'no "arrays"' in text
    assert "fedsynth.client.train_reply" in text
    assert 'RecordDict({"arrays"' not in text  # the advice of issue 53's report, wrong for a compressed strategy


def test_compressed_buffers_inside_the_payload_are_told_where_buffers_go():
    """Issue 53's first failure: the whole state dict through the codec (buffers included)."""
    from fedsynth.client import encode_update, message_codec

    def whole_state_compressed(msg: Message, context: Context) -> Message:
        delta = {name: np.zeros(array.numpy().shape, np.float32) for name, array in msg.content["arrays"].items()}
        payload = encode_update(delta, message_codec(msg.content["config"]), np.random.default_rng(0)).payload
        return Message(RecordDict({"compressed-update": ArrayRecord({k: Array(v) for k, v in payload.items()}),
                                   "metrics": MetricRecord({"num-examples": 4, "train-loss": 0.5})}), reply_to=msg)

    text = contract_error(strategies.FedAvg(codec=strategies.QSGD(bits=4)), whole_state_compressed)
    assert "bn.num_batches_tracked" in text and "\"model-buffers\": the model's buffers" in text


def test_scaffold_names_its_record_and_scaffold_reply():
    text = contract_error(strategies.Scaffold(), plain_reply)
    assert "reply lacks the 'scaffold-delta-c' record" in text
    assert '"scaffold-delta-c": ArrayRecord(c_i+ - c_i' in text and "fedsynth.client.scaffold_reply(" in text


@pytest.mark.parametrize(("public", "record", "result"), [(strategies.FedLESAMD, "dynamic-correction", "correction"),
                                                          (strategies.FedSMOO, "perturbation-dual",
                                                           "perturbation_dual")])
def test_the_dynamic_rules_name_their_record_and_where_it_comes_from(public, record, result):
    text = contract_error(public(), plain_reply)
    assert f"reply lacks the '{record}' record" in text and f"result.{result}" in text
    assert "fedsynth.client.train_reply(msg, model, result" in text


def test_the_decentralized_relay_names_the_builder():
    def broken(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 4, "train-loss": 0.1})}), reply_to=msg)

    with pytest.raises(strategies.ReplyContractError, match="fedsynth.client.train_reply"):
        strategies.DFedAvg(gossip=strategies.Gossip(topology="ring")).start(ClientAppGrid(3, broken), model(),
                                                                             num_rounds=2, timeout=10)


def test_fedddpm_s_failed_warmup_names_warmup_reply():
    from server_app.strategies.fedddpm import WarmupFailed

    def no_model(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 4, "train-loss": 0.1})}), reply_to=msg)

    strategy = strategies.FedDDPM(diffusion=strategies.DiffusionTraining(
        task=strategies.ServerTask(model="unet-small", image_size=8, diffusion_timesteps=20)))
    with pytest.raises(WarmupFailed, match=r"fedsynth\.client\.warmup_reply\(msg, model"):
        strategy.warmup(ClientAppGrid(2, no_model), model())
