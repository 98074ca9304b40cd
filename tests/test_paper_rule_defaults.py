"""An algorithm's name runs its paper's rule by default; bounded influence is one named option (issue 51).

- With the defaults, the run config and every public class have the bounds off, and three hand-made replies
  are aggregated to the plain sample-weighted mean, exactly.
- `bounded-influence = true` (the run config) and `aggregation=Bounded(mean)` (a class; the relay's
  `bounded_influence=BOUNDED_INFLUENCE`) turn both bounds on; each
  round's metrics then say how many updates were clipped and whether the weight cap bound.
- A compressed update is bounded by the norm its client measured, not by its quantiser noise.
- SCAFFOLD's control variate follows the step the server took when a bound clipped an update.
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedsynth.strategies as public
from common.algorithm_table import ALGORITHMS, COG_BASES, PAPER_MEANS, Algorithm
from common.algorithms.losses import scaffold_clipped_control_delta
from common.algorithms.plugins import rule_keys
from common.errors import ConfigError
from common.protocol import COMPRESSED_UPDATE, SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA
from common.records import from_record, to_record
from common.run.aggregation import bounded_influence_of
from common.keys import key_name
from common.run.config import RunConfig, config_fields, parse_run_config
from common.uplink.encoding import encode_delta
from common.algorithms.codec_settings import CodecSettings, paper_levels
from common.uplink.wire import decode_reply, measured_update_norm
from fedsynth.algorithm_docs import declared_defaults, paper_keys
from fedsynth.strategies import BOUNDED_INFLUENCE, AppWiring, Bounded, FedAvg, Scaffold
from server_app.influence import cap_binds
from server_app.registry import SERVER_STRATEGIES
from server_app.robust import clip_factors, scale_update, update_norm
from server_app.strategies.node_table import NodeInfo


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Instruction messages take their run id from the process's task identity (as in a ServerApp)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)


def nodes(n: int) -> list[NodeInfo]:
    return [NodeInfo(node_id=100 + pid, partition_id=pid, num_train_examples=1000, num_test_examples=0)
            for pid in range(n)]


def arr(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def one_round(strategy, start: dict, locals_: dict[int, tuple[dict, int]], extra=None):
    """configure_train, then replies {partition: (model, num-examples)} built as a ClientApp builds them."""
    messages = list(strategy.configure_train(1, to_record(start), ConfigRecord({}), None))
    replies = []
    for msg in messages:
        pid = next(n.partition_id for n in strategy.node_table.nodes if n.node_id == msg.metadata.dst_node_id)
        model, count = locals_[pid]
        content = RecordDict({"arrays": to_record(model),
                              "metrics": MetricRecord({"num-examples": count, "train-loss": 1.0, "partition-id": pid})})
        for name, record in (extra(pid, msg) if extra else {}).items():
            content[name] = record
        replies.append(Message(content, reply_to=msg))
    return strategy.aggregate_train(1, replies)


# ----- the defaults ---------------------------------------------------------------------------------------


def test_the_run_config_defaults_run_the_papers_plain_mean() -> None:
    cfg = parse_run_config({}, SERVER_STRATEGIES)
    assert (cfg.bounded_influence, cfg.max_update_norm_ratio, cfg.max_weight_share, cfg.max_update_norm) == (
        False, 0.0, 1.0, 0.0)


def test_config_json_of_a_default_run_says_the_bounds_are_off(tmp_path) -> None:
    from common.run.results import RunResults

    cfg = RunConfig(results_dir=str(tmp_path), run_name="defaults")
    with RunResults(cfg):
        written = json.loads((tmp_path / "defaults" / "config.json").read_text())
    written = written.get("config", written)  # the effective config, defaults resolved
    assert (written["bounded-influence"], written["max-update-norm-ratio"], written["max-weight-share"]) == (
        False, 0.0, 1.0)


@pytest.mark.parametrize("name", sorted(public.__all__))
def test_every_public_class_defaults_to_no_bounds(name: str) -> None:
    cls = getattr(public, name)
    if not inspect.isclass(cls) or not hasattr(cls, "configure_train"):
        return
    parameters = inspect.signature(cls).parameters
    if "aggregation" in parameters:  # a plain mean: no `Bounded` one
        assert parameters["aggregation"].default in ("weighted", "uniform")
        assert cls().bounded_influence is None
    else:  # the relay, which has no mean, takes its bounds alone
        assert parameters["bounded_influence"].default is None
    built = cls()
    assert (built.max_weight_share, getattr(built, "max_update_norm_ratio", 0.0), built.max_update_norm) == (1.0, 0.0, 0.0)


def test_a_hand_built_fedavg_gives_the_plain_weighted_mean_of_three_replies_exactly() -> None:
    strategy = FedAvg(wiring=AppWiring(nodes=nodes(3)))
    start = {"w": arr(0, 0)}
    # node 2 claims most of the examples and sent a long update: the paper's mean lets it weigh 0.8
    arrays, metrics = one_round(strategy, start, {0: ({"w": arr(1, 0)}, 10), 1: ({"w": arr(0, 2)}, 10),
                                                  2: ({"w": arr(100, 100)}, 80)})
    # (10 * [1, 0] + 10 * [0, 2] + 80 * [100, 100]) / 100 = [80.1, 80.2]
    np.testing.assert_array_equal(from_record(arrays)["w"], arr(80.1, 80.2))
    assert "clipped-updates" not in metrics and "weight-cap-bound" not in metrics


# ----- every name's rule is its paper's: the table, the classes, the run config ----------------------------


def _base_rows() -> list[str]:
    return [name for name in ALGORITHMS if not name.endswith("+cog")]


def test_every_built_in_row_declares_its_paper_rule_and_the_cog_rows_run_their_bases() -> None:
    assert [name for name in _base_rows() if ALGORITHMS[name].rule is None] == []
    for name in COG_BASES:
        assert ALGORITHMS[f"{name}+cog"].rule is ALGORITHMS[name].rule, name
    assert all(ALGORITHMS[name].rule.server_step and ALGORITHMS[name].rule.source for name in _base_rows())


def test_the_papers_means_by_hand() -> None:
    """FedSynSAM's eq. 24 and FedDDPM's Algorithm 1 average 1/S; the others weigh by samples (McMahan et al.)."""
    uniform = sorted(name for name in ALGORITHMS if ALGORITHMS[name].mean == "uniform")
    assert uniform == ["fedddpm", "fedddpm+", "fedsynsam"]
    assert all(ALGORITHMS[name].mean in PAPER_MEANS for name in ALGORITHMS)


_FIELDS = {key_name(f.name): f for f in config_fields()}


@pytest.mark.parametrize("name", _base_rows())
def test_each_paper_hyper_parameter_is_a_run_config_key_that_declares_its_source(name: str) -> None:
    """The table's values are the keys' declared defaults, so each key must say where its default comes from."""
    keys = paper_keys(ALGORITHMS[name])
    assert [key for key in keys if key not in _FIELDS] == [], name
    assert [key for key in keys if not _FIELDS[key].metadata.get("source")] == [], name


def _own_keys(group: type | None) -> list[dataclasses.Field]:
    """The run-config keys a class's settings group declares itself: not a parameter that is no key
    (`parameter_only`: FedCOG's `cog_settings`), nor another part's key it reuses (`declared_in`: `batch-size`)."""
    return [f for f in (dataclasses.fields(group) if group is not None else ())
            if not f.metadata.get("parameter_only") and "declared_in" not in f.metadata]


@pytest.mark.parametrize("name", sorted({row.strategy_name for row in ALGORITHMS.values()}))
def test_each_key_of_a_classs_settings_group_declares_its_source(name: str) -> None:
    group = getattr(public, name).settings
    assert [f.name for f in _own_keys(group) if not f.metadata.get("source")] == [], (name, group)


def test_the_table_shows_the_declared_defaults() -> None:
    assert paper_keys(ALGORITHMS["mofedsam"]) == ("sam-rho", "mofedsam-alpha")
    assert paper_keys(ALGORITHMS["dfedavgm"]) == ("peers", "dfedavgm-momentum")
    assert declared_defaults()["sam-rho"] == RunConfig().sam_rho == 0.05


@pytest.mark.parametrize("name", sorted(set(ALGORITHMS)))
def test_the_run_configs_defaults_are_the_declared_ones(name: str) -> None:
    """`aggregation = "auto"` (the default) runs the row's mean; the run config of the algorithm keeps each of its
    paper's hyper-parameters at its key's declared default (nothing resolves it by algorithm)."""
    cfg = parse_run_config({"algorithm": name}, SERVER_STRATEGIES)
    assert cfg.aggregation == ALGORITHMS[name].mean
    defaults = declared_defaults()
    for key in paper_keys(ALGORITHMS[name]):
        assert getattr(cfg, key.replace("-", "_")) == defaults[key], (name, key)


@pytest.mark.parametrize("name", sorted({row.strategy_name for row in ALGORITHMS.values()}))
def test_each_public_class_built_with_no_arguments_has_the_declared_defaults(name: str) -> None:
    """A class's defaults are the run config's, and those its settings group declares."""
    cls = getattr(public, name)
    built = cls()
    rows = [algorithm for algorithm, row in ALGORITHMS.items() if row.strategy_name == name]
    parameters = inspect.signature(cls).parameters
    defaults = declared_defaults()
    for algorithm in rows:
        row = ALGORITHMS[algorithm]
        if not row.decentralized:
            assert built.aggregation == row.mean, (name, algorithm)
        for key in paper_keys(row):
            attribute = key.replace("-", "_")
            if attribute in parameters:  # the others are node settings of fedsynth's app (FedCOG's generation)
                assert _held_value(built, attribute) == defaults[key], (name, algorithm, key)
    for f in _own_keys(cls.settings):
        assert _held_value(built, f.name) == f.default, (name, f.name)
        assert defaults.get(key_name(f.name), f.default) == f.default, (name, f.name)


def _held_value(strategy: object, attribute: str) -> object:
    """A parameter's value as the strategy holds it: its attribute, or the field of a settings value it keeps
    (FedSynSAM's `distillation`); AssertionError when it holds neither."""
    if hasattr(strategy, attribute):
        return getattr(strategy, attribute)
    held = [getattr(value, attribute) for value in vars(strategy).values()
            if dataclasses.is_dataclass(value) and hasattr(value, attribute)]
    assert held, f"{type(strategy).__name__} holds no {attribute}"
    return held[0]


def test_an_explicit_mean_wins_over_the_papers() -> None:
    assert parse_run_config({"algorithm": "fedsynsam", "aggregation": "weighted"}, SERVER_STRATEGIES).aggregation == (
        "weighted")
    assert parse_run_config({"algorithm": "fedavg", "aggregation": "uniform"}, SERVER_STRATEGIES).aggregation == (
        "uniform")
    assert public.FedSynSAM(aggregation="weighted").aggregation == "weighted"
    with pytest.raises(ConfigError, match="aggregation = 'auto' is the run config's"):
        FedAvg(aggregation="auto")


def test_a_plugin_row_names_one_of_the_two_means() -> None:
    from common.algorithms import plugins

    with pytest.raises(ConfigError, match="its mean must be one of weighted, uniform"):
        plugins.plugin_algorithm("tests.test_paper_rule_defaults:BAD_MEAN_ROW")


BAD_MEAN_ROW = Algorithm(strategy="server_app.strategies.fedavg:FedAvg", client="client_app.updates:fedavg_update",
                         mean="median")


def test_a_uniform_fedsynsam_takes_the_plain_mean_of_three_replies() -> None:
    """The same three replies as the weighted test above: FedSynSAM's default mean ignores the claimed counts."""
    strategy = public.FedSynSAM(wiring=AppWiring(nodes=nodes(3)))
    arrays, _ = one_round(strategy, {"w": arr(0, 0)}, {0: ({"w": arr(1, 0)}, 10), 1: ({"w": arr(0, 2)}, 10),
                                                        2: ({"w": arr(100, 100)}, 80)})
    np.testing.assert_allclose(from_record(arrays)["w"], [101 / 3, 102 / 3], rtol=1e-6)


# ----- the option -----------------------------------------------------------------------------------------


def test_bounded_influence_in_the_run_config_sets_both_bounds_and_an_explicit_value_wins() -> None:
    cfg = parse_run_config({"bounded-influence": True}, SERVER_STRATEGIES)
    assert (cfg.max_update_norm_ratio, cfg.max_weight_share) == (1.5, 0.4)
    assert (BOUNDED_INFLUENCE.update_norm_ratio, BOUNDED_INFLUENCE.weight_share) == (1.5, 0.4)
    assert BOUNDED_INFLUENCE == public.BoundedInfluence()  # the option's defaults
    cfg = parse_run_config({"bounded-influence": True, "max-weight-share": 0.5}, SERVER_STRATEGIES)
    assert (cfg.max_update_norm_ratio, cfg.max_weight_share) == (1.5, 0.5)
    # docs/reliability.md: set max-weight-share = 1 to keep the plain weighting; the off values win too
    cfg = parse_run_config({"bounded-influence": True, "max-weight-share": 1}, SERVER_STRATEGIES)
    assert (cfg.max_update_norm_ratio, cfg.max_weight_share) == (1.5, 1.0)
    cfg = parse_run_config({"bounded-influence": True, "max-update-norm-ratio": 0}, SERVER_STRATEGIES)
    assert (cfg.max_update_norm_ratio, cfg.max_weight_share) == (0.0, 0.4)
    assert bounded_influence_of(cfg) == public.BoundedInfluence(update_norm_ratio=0.0)
    # without the option an unset key is off, and an explicit bound is kept
    cfg = parse_run_config({"max-weight-share": 0.5}, SERVER_STRATEGIES)
    assert (cfg.max_update_norm_ratio, cfg.max_weight_share) == (0.0, 0.5)


def test_the_unset_values_are_the_run_configs_alone() -> None:
    """A class's BoundedInfluence holds bounds, not "unset": the run config's sentinels are refused there."""
    with pytest.raises(ConfigError, match="'max-weight-share' = 0.0 is invalid here"):
        public.BoundedInfluence(weight_share=0.0)
    with pytest.raises(ConfigError, match="'max-update-norm-ratio' = -1.0 is invalid here"):
        public.BoundedInfluence(update_norm_ratio=-1.0)


def test_bounded_influence_clips_and_caps_and_each_round_says_so() -> None:
    strategy = FedAvg(wiring=AppWiring(nodes=nodes(3)), aggregation=Bounded("weighted", BOUNDED_INFLUENCE))
    start = {"w": arr(0, 0)}
    arrays, metrics = one_round(strategy, start, {0: ({"w": arr(1, 0)}, 10), 1: ({"w": arr(0, 2)}, 10),
                                                  2: ({"w": arr(100, 0)}, 80)})
    # norms 1, 2, 100: lower median 2, bound 3, so node 2's update becomes [3, 0]; shares 0.1, 0.1, 0.8 capped at
    # 0.4 with the excess spread in proportion: 0.3, 0.3, 0.4. Mean: 0.3 [1, 0] + 0.3 [0, 2] + 0.4 [3, 0]
    np.testing.assert_allclose(from_record(arrays)["w"], [1.5, 0.6], rtol=1e-6)
    assert metrics["clipped-updates"] == 1 and metrics["weight-cap-bound"] == 1


def test_clip_factors_by_hand() -> None:
    assert clip_factors([1.0, 2.0, 100.0], 0.0, 1.5) == [1.0, 1.0, 0.03]
    assert clip_factors([1.0, 2.0, 100.0], 0.0, 0.0) == [1.0, 1.0, 1.0]  # off
    # the fixed bound 10 first (100 -> 10), then 1.5 x the lower median of [1, 2, 10] = 3: 3 / 100 in all
    assert clip_factors([1.0, 2.0, 100.0], 10.0, 1.5) == pytest.approx([1.0, 1.0, 0.03])
    assert clip_factors([0.0, 0.0, 5.0], 0.0, 1.5) == [1.0, 1.0, 1.0]  # a median of 0 erases nothing
    delta = {"a": arr(3, 4)}
    assert scale_update(delta, 1.0) is delta
    np.testing.assert_allclose(scale_update(delta, 0.5)["a"], [1.5, 2.0])


def test_cap_binds_by_hand() -> None:
    assert cap_binds([10, 10, 80], 0.4) and not cap_binds([30, 30, 40], 0.4)
    assert not cap_binds([10, 90], 1.0) and not cap_binds([5], 0.4)


# ----- compressed updates: the bound acts on the update, not on quantiser noise ----------------------------


def test_a_quantised_update_is_bounded_by_the_norm_its_client_measured() -> None:
    spec = CodecSettings("qsgd", levels=paper_levels(4), qsgd_scope="model")  # the paper's single-norm 4-bit form
    rng = np.random.default_rng(0)
    current = {"w": np.zeros(100_000, np.float32)}
    delta = {"w": (rng.normal(size=100_000) / 316).astype(np.float32)}  # norm about 1
    content = RecordDict({COMPRESSED_UPDATE: to_record(encode_delta(delta, spec, rng).payload)})
    decoded = decode_reply(content, current, spec)
    measured = measured_update_norm(content, spec)
    assert measured == pytest.approx(update_norm(delta), rel=1e-6)
    assert update_norm(decoded) > 3 * measured  # the quantised vector's length is mostly quantiser noise
    assert measured_update_norm(content, CodecSettings("topk", topk_ratio=0.5)) is None


def test_three_honest_quantised_updates_of_equal_length_are_not_clipped() -> None:
    """Under the 1.5 ratio, the decoded norms of equal-length updates spread past 1.5x; the measured ones do not."""
    strategy = FedAvg(wiring=AppWiring(nodes=nodes(3)), aggregation=Bounded("weighted"),
                      codec=public.QSGD(bits=4, levels=paper_levels(4), qsgd_scope="model"))
    rng = np.random.default_rng(1)
    start = {"w": np.zeros(4096, np.float32)}
    sizes = [1, 1, 4096]  # a one-coordinate update quantises exactly; a dense one of the same norm decodes longer
    payloads = {}
    for pid, nonzero in enumerate(sizes):
        update = np.zeros(4096, np.float64)
        update[:nonzero] = rng.normal(size=nonzero)
        update = (update / np.linalg.norm(update)).astype(np.float32)  # every update of norm 1
        payloads[pid] = to_record(encode_delta({"w": update}, strategy.codec, rng).payload)

    def compressed(pid, msg):
        return {COMPRESSED_UPDATE: payloads[pid]}

    decoded_norms = [update_norm(decode_reply(RecordDict({COMPRESSED_UPDATE: payloads[p]}), start, strategy.codec))
                     for p in range(3)]
    assert max(decoded_norms) > 1.5 * sorted(decoded_norms)[1]  # a bound on the decoded norms would clip
    _, metrics = one_round(strategy, start, {p: ({"w": start["w"]}, 10) for p in range(3)}, extra=compressed)
    assert metrics["clipped-updates"] == 0


# ----- SCAFFOLD follows the step the server took ------------------------------------------------------------


def test_scaffold_clipped_control_delta_by_hand() -> None:
    delta, c = {"a": arr(3.0, -1.0)}, {"a": arr(1.0, 1.0)}
    # (c_i+ - c_i) + c = [4, 0] is the update's part; at scale 0.5: -c + 0.5 [4, 0] = [1, -1]
    np.testing.assert_allclose(scaffold_clipped_control_delta(delta, c, 0.5)["a"], [1.0, -1.0])
    assert scaffold_clipped_control_delta(delta, c, 1.0) is delta


def test_scaffold_control_variate_is_consistent_with_a_clipped_step() -> None:
    strategy = Scaffold(wiring=AppWiring(nodes=nodes(3)), aggregation=Bounded("weighted"))
    start = {"w": arr(0, 0)}
    steps, lr = 4, 0.5
    locals_ = {0: ({"w": arr(1, 0)}, 10), 1: ({"w": arr(0, 2)}, 10), 2: ({"w": arr(100, 0)}, 10)}

    def control_delta(pid, msg):  # option II with c_i = 0 and c = 0: (w - w_i) / (K lr)
        c_global = from_record(msg.content.array_records[SCAFFOLD_CONTROL])
        return {SCAFFOLD_CONTROL_DELTA: to_record(
            {"w": (-c_global["w"] + (start["w"] - locals_[pid][0]["w"]) / (steps * lr)).astype(np.float32)})}

    _, metrics = one_round(strategy, start, locals_, extra=control_delta)
    assert metrics["clipped-updates"] == 1
    # node 2's update [100, 0] was clipped to [3, 0]: its c_i+ - c_i is -[3, 0] / 2, not -[100, 0] / 2
    expected = -(arr(1, 0) + arr(0, 2) + arr(3, 0)) / (steps * lr) / 3
    np.testing.assert_allclose(strategy.control["w"], expected, rtol=1e-6)
