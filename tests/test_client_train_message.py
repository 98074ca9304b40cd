"""fedsynth's ClientApp reads the round's settings from its train message, as a Flower developer's client does.

docs/library.md ("What each strategy sends and expects"): the round's `lr`, the uplink codec and every setting of
the node's rule travel in the train message's config, and so does the local training recipe; fedsynth's own
ClientApp trains at the `lr` and by the recipe its message carries (not its run config's), and refuses a message
that lacks a setting its rule needs, or carries a value the run config would refuse, naming the key; the server
records that refusal as the node's failure, with its reason (tests/test_train_message_checks.py checks every key
of the message's schema).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from client_app.app import app as client_app
from client_app.app import required_settings
from common.errors import ConfigError
from fedsynth.inprocess import InProcessGrid
from common.algorithm_table import ALGORITHMS
from common.algorithms.cog_settings import COG_KEYS, CogSettings
from common.algorithm_table import COG_BASES
from common.records import from_record, model_weights, to_record
from common.algorithms.codec_settings import CodecSettings
from common.run.client_settings import message_codec
from common.run.config import parse_run_config
from common.run.task import make_model
from server_app.registry import SERVER_STRATEGIES, build_strategy, train_config, train_config_of


def _run_config(tmp_path, data_dir, **keys) -> dict:
    return {"algorithm": "fedavg", "model": "mlp", "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"),
            "results-dir": str(tmp_path / "results"), "partition": "iid", "local-steps": 2, "batch-size": 8,
            "seed": 1, **keys}


def _train(raw: dict, config: dict) -> Message:
    """fedsynth's ClientApp on one train message (the run's seeded model, `config`) on partition 0 of 2."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    content = RecordDict({"arrays": to_record(model_weights(make_model(cfg, seeded=True))),
                          "config": ConfigRecord(config)})
    message = Message(content, dst_node_id=1000, message_type=MessageType.TRAIN)
    context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, "num-partitions": 2},
                      state=RecordDict(), run_config=dict(raw))
    return client_app(message, context)


def _model(reply: Message) -> dict[str, np.ndarray]:
    return from_record(reply.content.array_records["arrays"])


def test_the_clientapp_trains_at_the_lr_of_its_message_not_its_run_configs(tmp_path, tiny_data_dir) -> None:
    small = _run_config(tmp_path, tiny_data_dir, lr=0.01)
    large = _run_config(tmp_path, tiny_data_dir, lr=0.5)
    sent = {**train_config_of(parse_run_config(small, SERVER_STRATEGIES), 1), "lr": 0.01}
    assert sent["lr"] == 0.01
    by_message = _model(_train(large, sent))  # the run config says 0.5, the message 0.01
    reference = _model(_train(small, sent))   # both say 0.01
    at_run_configs = _model(_train(large, {**sent, "lr": 0.5}))
    for name, value in reference.items():
        np.testing.assert_array_equal(by_message[name], value)
    assert any(not np.array_equal(at_run_configs[name], value) for name, value in reference.items())


@pytest.mark.parametrize(("keys", "missing"), [
    ({"algorithm": "fedsam"}, "sam-rho"),
    ({"algorithm": "fedprox+cog"}, "gen-budget"),
    ({"algorithm": "fedavg"}, "lr"),
    ({"algorithm": "fedavg"}, "compression"),
])
def test_a_message_without_a_setting_the_rule_needs_is_refused_naming_it(tmp_path, tiny_data_dir, keys,
                                                                        missing) -> None:
    raw = _run_config(tmp_path, tiny_data_dir, **keys)
    config = train_config_of(parse_run_config(raw, SERVER_STRATEGIES), 1)
    del config[missing]
    with pytest.raises(ValueError, match=f"lacks '{missing}'"):
        _train(raw, config)


def test_every_strategy_of_the_app_sends_what_its_nodes_require() -> None:
    """The decentralized relay included, and FedCOG's settings on every run with FedCOG."""
    configs = [{"algorithm": name, "model": "unet-small" if "ddpm" in name else "cnn"} for name in ALGORITHMS]
    configs += [{"algorithm": base, "cog": True} for base in COG_BASES]
    for raw in configs:
        cfg = parse_run_config(raw, SERVER_STRATEGIES)
        sent = train_config_of(cfg, 2)
        assert set(required_settings(cfg)) <= set(sent), raw
        assert sent["lr"] == cfg.lr * cfg.lr_decay


def test_fedcogs_settings_travel_as_one_object_with_the_first_round_resolved() -> None:
    settings = CogSettings(gen_budget=8, gen_steps=3, cog_ablation="global-only", lambda_kd=0.5)
    assert CogSettings.from_config(settings.cog_config()) == settings
    assert set(settings.cog_config()) == set(COG_KEYS)
    assert (settings.generation_steps, settings.disagreement_weight, settings.hard_label) == (3, 0.0, False)
    assert CogSettings(cog_ablation="noise").generation_steps == 0
    cfg = parse_run_config({"algorithm": "moon+cog", "num-server-rounds": 20, "gen-budget": 9}, SERVER_STRATEGIES)
    sent = train_config_of(cfg, 1)
    assert sent["cog-start-round"] == 15 and sent["gen-budget"] == 9
    with pytest.raises(KeyError, match="'gen-lr'"):
        CogSettings.from_config({key: value for key, value in sent.items() if key != "gen-lr"})


@pytest.mark.parametrize(("key", "value"), [("cog", "false"), ("gen-budget", True), ("gen-budget", 2.5),
                                            ("gen-lr", float("nan")), ("gen-lr", "abc"), ("gen-budget", -1),
                                            ("kd-weighting", "nope"), ("lambda-kd", float("inf"))])
def test_fedcogs_public_reader_refuses_a_bad_value_naming_its_key(key: str, value: object) -> None:
    """`CogSettings.from_config` (a ClientApp of one's own) checks what it reads: the text "false" is no switch
    (bool("false") is True), a NaN rate no rate."""
    sent = CogSettings(gen_budget=8).cog_config()
    assert CogSettings.from_config(sent) == CogSettings(gen_budget=8)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        CogSettings.from_config({**sent, key: value})


def test_the_codec_is_read_from_the_message_without_fallback_values() -> None:
    assert message_codec({}) == CodecSettings()  # Flower's strategies and the relay send no codec
    sent = {"compression": "qsgd", "bits": 3, "levels": 0, "qsgd-scope": "bucket", "qsgd-bucket": 64,
            "topk-ratio": 0.1, "error-feedback": True}
    assert message_codec(sent) == CodecSettings("qsgd", bits=3, qsgd_scope="bucket", qsgd_bucket=64,
                                                error_feedback=True)
    with pytest.raises(ValueError, match="lacks 'bits'"):
        message_codec({key: value for key, value in sent.items() if key != "bits"})
    with pytest.raises(ValueError, match="'topk-ratio', 'error-feedback'"):
        message_codec({"compression": "topk", "bits": 3, "levels": 0, "qsgd-scope": "bucket", "qsgd-bucket": 64})
    # a mistyped or out-of-range value is refused naming the key, as the run config refuses it
    with pytest.raises(ConfigError, match="^train message refused: run config key 'bits': expected an integer"):
        message_codec({**sent, "bits": "3"})
    with pytest.raises(ConfigError, match="^train message refused: run config key 'qsgd-bucket' = 0 is invalid"):
        message_codec({**sent, "qsgd-bucket": 0})
    with pytest.raises(ConfigError, match="'topk-ratio': expected a finite number"):
        message_codec({**sent, "topk-ratio": float("nan")})


def test_the_clientapp_trains_by_the_recipe_of_its_message_not_its_run_configs(tmp_path, tiny_data_dir) -> None:
    """local-steps, batch-size, momentum and the optimizer come from the message, as the lr does."""
    mine = _run_config(tmp_path, tiny_data_dir)  # 2 steps of 8, no momentum
    theirs = _run_config(tmp_path, tiny_data_dir, **{"local-steps": 3, "batch-size": 4, "momentum": 0.5})
    sent = train_config_of(parse_run_config(theirs, SERVER_STRATEGIES), 1)
    assert (sent["local-steps"], sent["batch-size"], sent["momentum"], sent["local-optimizer"]) == (3, 4, 0.5, "sgd")
    reply = _train(mine, sent)
    assert reply.content.metric_records["metrics"]["local-steps"] == 3
    reference = _model(_train(theirs, sent))
    assert all(np.array_equal(_model(reply)[name], value) for name, value in reference.items())


@pytest.mark.parametrize(("algorithm", "key", "value"), [
    ("fedavg", "lr", -1.0), ("fedavg", "lr", "abc"), ("fedavg", "lr", float("nan")), ("fedavg", "lr", float("inf")),
    ("fedsam", "sam-rho", -0.5), ("fedprox", "proximal-mu", -10.0), ("fedavg", "momentum", 1.5),
    ("fedavg", "local-steps", -1), ("fedavg", "bits", 1), ("moon", "moon-tau", 0.0),
])
def test_the_clientapp_refuses_a_value_the_run_config_refuses_naming_its_key(tmp_path, tiny_data_dir, algorithm,
                                                                            key, value) -> None:
    raw = _run_config(tmp_path, tiny_data_dir, algorithm=algorithm)
    config = {**train_config_of(parse_run_config(raw, SERVER_STRATEGIES), 1), key: value}
    with pytest.raises(ConfigError, match=f"train message refused: run config key '{key}'"):
        _train(raw, config)


def test_the_server_records_a_refused_value_as_that_nodes_failure_with_the_reason(tmp_path, tiny_data_dir) -> None:
    """A server whose FedProx sends proximal-mu = -10 (its constructor refuses it; this one was changed after):
    each node refuses to train, the round keeps the model, and the round log names the key for every node."""
    raw = _run_config(tmp_path, tiny_data_dir, algorithm="fedprox")
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(2, raw)
    strategy = build_strategy(cfg)
    strategy.proximal_mu = -10.0
    arrays = to_record(model_weights(make_model(cfg, seeded=True)))
    replies = grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(train_config(cfg)), grid))
    assert strategy.aggregate_train(1, replies) == (None, None)
    failures = strategy.round_log.latest.failures
    assert [failure.partition for failure in failures] == [0, 1]
    assert all("run config key 'proximal-mu' = -10.0 is invalid" in failure.reason for failure in failures)
