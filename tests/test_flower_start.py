"""Every server strategy runs under Flower's own `Strategy.start()` (issue 36).

- one good and one error reply: `start()` finishes, the error reply is dropped in `aggregate_train`
  (recorded with its reason) and the good one is aggregated, for an algorithm of every server family of the
  table (a new family's first row runs here without an edit);
- the public keyword-parameter classes of `fedsynth.strategies` give bitwise the model `fedsynth run`
  gives with the same config and seed (fedsynth's ServerApp calls the same `start()`);
- FedDDPM's warm-up and correction run inside `start()` (its recorded phases);
- Flower's `evaluate_fn` is called before the first round and after every round;
- a Flower DP wrapper runs around a fedsynth strategy.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from common.run.config import parse_run_config
from common.records import from_record, model_weights, to_record
from common.run.task import make_model
from fedsynth import strategies
from fedsynth.inprocess import InProcessGrid, run_federation
from server_app.handshake import handshake
from common.algorithm_table import ALGORITHMS
from server_app.registry import SERVER_STRATEGIES, build_strategy, decayed_lr, strategy_arguments, train_config
from tests.conftest import with_fid_classifier
from tests.diffusion_tiny import TINY_DIFFUSION

# one algorithm per server family of the table, with what its clients need to run in a few seconds
CLASS_CASES = {
    "fedavg": {}, "fedavgm": {}, "scaffold": {}, "mofedsam": {}, "fedlesam": {}, "fedlesam-s": {}, "fedlesam-d": {},
    "fedsmoo": {}, "fedsynsam": {"trajectory-rounds": 1, "synthetic-ipc": 1, "distill-iterations": 2},
    "dynafed": {"trajectory-rounds": 1, "synthetic-ipc": 1, "distill-iterations": 2},
    "dfedavg": {"topology": "ring"},
    "fedddpm": {**TINY_DIFFUSION, "warmup-steps": 2, "correction-epochs": 1},
    "fedddpm+": {**TINY_DIFFUSION, "warmup-steps": 2, "quicktest-reference": "auxiliary", "fid-features": "random"},
}


def uncovered_families(chosen: list[str]) -> list[str]:
    """The first row of each server family (the table's `server`) that no algorithm of `chosen` runs: a new
    family is run by its first row with no extra settings, without an edit here."""
    covered = {ALGORITHMS[name].server for name in chosen}
    first: dict[str, str] = {}
    for name, row in ALGORITHMS.items():
        if row.server not in covered:
            first.setdefault(row.server, name)
    return list(first.values())


FAMILY_CASES = [*CLASS_CASES, *uncovered_families(list(CLASS_CASES))]

# public classes of fedsynth.strategies, one per server family at least, with their algorithm and what it needs
# on the tiny config
PUBLIC_CASES = [
    (strategies.FedAvg, "fedavg", {}),
    (strategies.FedSAM, "fedsam", {"sam-rho": 0.05}),
    (strategies.FedCOG, "fedcog", {"cog-start-round": 2, "gen-budget": 8, "gen-steps": 2}),
    (strategies.FedSynSAM, "fedsynsam", {"compression": "qsgd", "bits": 4}),
    (strategies.DFedAvg, "dfedavg", {"topology": "ring"}),
    (strategies.OledFL, "oledfl-sgd", {"topology": "ring", "ole-beta": 0.5}),
    (strategies.FedAvgM, "fedavgm", {"server-momentum": 0.5}),
    (strategies.Scaffold, "scaffold", {}),
    (strategies.MoFedSAM, "mofedsam", {}),
    (strategies.FedLESAM, "fedlesam", {}),
    (strategies.FedLESAMS, "fedlesam-s", {}),
    (strategies.FedLESAMD, "fedlesam-d", {}),
    (strategies.FedSMOO, "fedsmoo", {}),
    (strategies.DynaFed, "dynafed", {}),
    (strategies.FedDDPM, "fedddpm", {"num-server-rounds": 1}),
    (strategies.FedDDPMPlus, "fedddpm+", {"num-server-rounds": 1}),
]
PUBLIC_CASES += [(getattr(strategies, ALGORITHMS[name].strategy_name), name, {})
                 for name in uncovered_families([algorithm for _, algorithm, _ in PUBLIC_CASES])]


@pytest.fixture(autouse=True)
def trained_fid_classifier(tmp_path, fid_classifier) -> None:
    """Each run's cache-dir (tmp_path / "cache") starts with the session's trained FID classifier
    (tests/conftest.py): its training costs most of a tiny diffusion run, and is tested where runs start
    from an empty cache-dir (test_simulation.py's FedDDPM+ case)."""
    with_fid_classifier(tmp_path / "cache", fid_classifier)

def test_the_cases_cover_every_server_rule() -> None:
    """The classes that differ only in the settings their nodes read share their server's code (a family)."""
    families = {algorithm.server for algorithm in ALGORITHMS.values()}
    assert {ALGORITHMS[name].server for name in FAMILY_CASES} == families
    assert {ALGORITHMS[algorithm].server for _, algorithm, _ in PUBLIC_CASES} == families
    for cls, algorithm, _ in PUBLIC_CASES:
        assert SERVER_STRATEGIES[algorithm] is cls


def public_arguments(public: type, raw: dict) -> dict:
    """The run config's values of `public`'s own keyword parameters, as a developer writes them: each run-config
    key under its name, the codec, bounded influence, the aggregation and the server's task as their values."""
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    given = strategy_arguments(public, cfg, None)
    return {name: value for name, value in given.items()
            if name not in ("wiring", "fraction_evaluate")}


def tiny_config(tmp_path, data_dir, algorithm: str, **extra) -> dict:
    return {
        "algorithm": algorithm, "data-dir": str(data_dir), "cache-dir": str(tmp_path / "cache"),
        "results-dir": str(tmp_path / "results"), "run-name": "run", "num-server-rounds": 2, "local-steps": 2,
        "batch-size": 16, "partition": "iid", "seed": 3, **CLASS_CASES.get(algorithm, {}), **extra,
    }


@pytest.mark.parametrize("algorithm", sorted(FAMILY_CASES))
def test_start_drops_an_error_reply_and_aggregates_the_good_one(tmp_path, tiny_data_dir, algorithm) -> None:
    raw = tiny_config(tmp_path, tiny_data_dir, algorithm, **{"num-server-rounds": 1, "min-nodes": 1})
    decentralized = ALGORITHMS[algorithm].decentralized
    if decentralized:
        raw["topology"] = "full"
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(3 if decentralized else 2, raw)
    nodes = handshake(grid, cfg)
    grid.faults[(1, 1, "train")] = "raise"  # partition 1 fails in round 1
    strategy = build_strategy(cfg, nodes)
    initial = model_weights(make_model(cfg, seeded=True))
    calls: list[int] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        calls.append(server_round)
        return MetricRecord({"norm": float(sum(np.abs(v).sum() for v in from_record(arrays).values()))})

    result = strategy.start(grid, to_record(initial), num_rounds=1, timeout=60, evaluate_fn=evaluate_fn,
                            train_config=ConfigRecord(train_config(cfg)))  # the local training recipe

    report = strategy.round_log.latest.as_record()
    assert report["failed"] == 1 and report["failures"][0]["partition"] == 1
    assert report["failures"][0]["reason"].startswith("error: injected failure")
    assert report["answered"] == len(nodes) - 1
    final = from_record(result.arrays)
    assert any(not np.array_equal(final[name], initial[name]) for name in initial)  # the good reply moved it
    assert calls == [0, 1] and set(result.evaluate_metrics_serverapp) == {0, 1}


@pytest.mark.parametrize(("public", "algorithm", "extra"), PUBLIC_CASES)
def test_start_on_the_public_class_equals_fedsynth_run(tmp_path, tiny_data_dir, public, algorithm, extra) -> None:
    """`Public(**keyword parameters).start(...)` on the same nodes gives bitwise `fedsynth run`'s final model."""
    raw = tiny_config(tmp_path, tiny_data_dir, algorithm, **extra, **{"save-model": True})
    num_nodes = 3
    summary = run_federation(raw, InProcessGrid(num_nodes, raw))
    expected = load_file(str(Path(summary["results-dir"]) / "model.safetensors"))

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(num_nodes, raw)
    strategy = public(**public_arguments(public, raw), wiring=strategies.AppWiring(
        nodes=handshake(grid, cfg), lr_schedule=partial(decayed_lr, cfg.lr, cfg.lr_decay)))
    result = strategy.start(grid, to_record(model_weights(make_model(cfg, seeded=True))),
                            num_rounds=cfg.num_server_rounds, timeout=60,
                            train_config=ConfigRecord({"lr": cfg.lr, **train_config(cfg)}))  # lr, recipe: start()'s
    final = from_record(result.arrays)
    assert final.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(final[name], expected[name]), name


def test_fedddpm_runs_its_warmup_and_correction_under_start(tmp_path, tiny_data_dir) -> None:
    raw = tiny_config(tmp_path, tiny_data_dir, "fedddpm", **{"num-server-rounds": 1, "correction-epochs": 1,
                                                             "local-steps": 1})
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(2, raw)
    strategy = strategies.FedDDPM(**public_arguments(strategies.FedDDPM, raw),
                                  wiring=strategies.AppWiring(nodes=handshake(grid, cfg)), fraction_evaluate=0.0)
    assert strategy.auxiliary is None
    # fedsynth's ClientApp trains at the lr and by the recipe its messages carry: start()'s train_config here
    result = strategy.start(grid, to_record(model_weights(make_model(cfg, seeded=True))), num_rounds=1, timeout=120,
                            train_config=ConfigRecord({"lr": cfg.lr, **train_config(cfg)}))
    phases = [phase.phase for phase in strategy.round_log.phases]
    assert phases == ["warmup"]  # no recorder drained them: they are the strategy's record of the run
    assert all(message.content["config"]["lr"] == cfg.lr for message in strategy.warmup_phase.sent)
    assert strategy.auxiliary is not None and len(strategy.auxiliary) == strategy.round_log.phases[0].values["aux-size"] > 0
    assert strategy.round_log.latest.answered == 2
    # the correction on the auxiliary set ran after the aggregation: its metrics are the round's
    correction = result.train_metrics_clientapp[1]
    assert correction["correction-epochs"] == 1 and np.isfinite(correction["correction-loss"])


def test_fedddpm_plus_corrects_at_the_last_round_of_start(tmp_path, tiny_data_dir) -> None:
    """`FedDDPMPlus(...).start(num_rounds=3)` corrects and stops at round 3, not at its config's 20 rounds."""
    raw = tiny_config(tmp_path, tiny_data_dir, "fedddpm+", **{"local-steps": 1, "quicktest-every": 100})
    del raw["num-server-rounds"]  # the config's default (20) must not decide
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    assert cfg.num_server_rounds != 3
    grid = InProcessGrid(2, raw)
    strategy = strategies.FedDDPMPlus(**public_arguments(strategies.FedDDPMPlus, raw),
                                      wiring=strategies.AppWiring(nodes=handshake(grid, cfg)), fraction_evaluate=0.0)
    result = strategy.start(grid, to_record(model_weights(make_model(cfg, seeded=True))), num_rounds=3, timeout=120,
                            train_config=ConfigRecord({"lr": 0.003, **train_config(cfg)}))
    assert (strategy.stopped_at, strategy.stop_reason) == (3, "last-round")
    assert strategy.quicktest_scorer.oneshot_rate() == 0.003  # the one-shot correction trains at start()'s lr
    assert set(result.train_metrics_clientapp) == {1, 2, 3}


def test_public_classes_refuse_unknown_parameters() -> None:
    with pytest.raises(TypeError, match="no_such_key"):
        strategies.FedAvg(no_such_key=1)


def test_dp_fixed_clipping_wraps_fedsam(tmp_path, tiny_data_dir) -> None:
    """Flower's DifferentialPrivacyServerSideFixedClipping around FedSAM runs two rounds."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    raw = tiny_config(tmp_path, tiny_data_dir, "fedsam")
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(2, raw)
    inner = strategies.FedSAM(wiring=strategies.AppWiring(nodes=handshake(grid, cfg),
                                                          lr_schedule=partial(decayed_lr, cfg.lr, cfg.lr_decay)),
                              sam_rho=0.05, fraction_evaluate=0.0)
    dp = DifferentialPrivacyServerSideFixedClipping(inner, noise_multiplier=0.1, clipping_norm=1.0, num_sampled_clients=2)
    initial = model_weights(make_model(cfg, seeded=True))
    result = dp.start(grid, to_record(initial), num_rounds=2, timeout=60, train_config=ConfigRecord(train_config(cfg)))
    assert set(result.train_metrics_clientapp) == {1, 2}
    final = from_record(result.arrays)
    assert all(np.isfinite(value).all() for value in final.values())
    assert any(not np.array_equal(final[name], initial[name]) for name in initial)
