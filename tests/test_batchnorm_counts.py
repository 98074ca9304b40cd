"""One update of BatchNorm's running statistics per local batch, and a distillation that leaves the trajectory alone.

A tiny BatchNorm CNN trains through every client rule whose step forwards more than one batch
(SAM's second pass, FedSynSAM's synthetic batch, FedCOG's generated batch): afterwards every
BatchNorm layer's `num_batches_tracked` equals the number of steps, as under plain SGD. The
server's trajectory distillation, its real-image oracle and DynaFed's server training leave
every stored trajectory entry bitwise as it was.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, RecordDict
from torch import nn

from client_app.fedcog import GeneratedSet, KnowledgeDistillation
from client_app.registry import CLIENT_UPDATES
from client_app.training import LocalJob
from common.algorithms.batch_statistics import frozen_batch_statistics
from common.algorithms.sam import fedsam_gradients
from common.records import model_weights
from common.run.config import parse_run_config
from common.run.task import ServerTask
from fedsynth.client import (
    CogSettings, LocalOptimizer, fedcog_distillation, tensor_batches, train_fedcog, train_fedgamma, train_fedlesam,
    train_fedlesam_d, train_fedlesam_s, train_fedsam, train_fedsmoo, train_fedsynsam, train_mofedsam, train_sgd,
    train_steps,
)
from common.algorithms.synsam_settings import SynSAMSettings
from server_app.distillation import distill, real_oracle
from common.algorithm_table import ALGORITHMS
from common.algorithms.plugins import rule_keys
from server_app.registry import SERVER_STRATEGIES, train_config_of
from server_app.strategies.dynafed import DynaFed
from server_app.strategies.fedsynsam import FedSynSAM
from server_app.strategies.server_training import DistillationSettings, DynaFedTraining

STEPS = 3
CLASSES = 4
SIDE = 8
OPTIMIZER = LocalOptimizer(lr=0.05)


def tiny_bn_cnn(num_classes: int = CLASSES, channels: int = 1, image_size: int = SIDE) -> nn.Module:
    """Two BatchNorm layers (2d and 1d) in a model small enough for many rules in a few seconds.

    Also a site model factory (`model = "tests.test_batchnorm_counts:tiny_bn_cnn"`).
    """
    side = image_size // 4
    return nn.Sequential(
        nn.Conv2d(channels, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AvgPool2d(4),
        nn.Flatten(), nn.Linear(4 * side * side, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, num_classes),
    )


def seeded_model() -> nn.Module:
    torch.manual_seed(0)
    return tiny_bn_cnn()


def data(n: int = 20, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, SIDE, SIDE, generator=generator), torch.randint(0, CLASSES, (n,), generator=generator)


def batches(num_steps: int = STEPS):
    x, y = data()
    return tensor_batches(x, y, batch_size=8, num_steps=num_steps, seed=[0, 1, 2])


def counts(model: nn.Module) -> list[int]:
    """`num_batches_tracked` of every BatchNorm layer, in module order."""
    return [int(m.num_batches_tracked) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def small_update(model: nn.Module, scale: float = 0.01) -> dict[str, np.ndarray]:
    """A previous global update / server state shaped like the parameters (by name)."""
    rng = np.random.default_rng(5)
    return {name: (scale * rng.standard_normal(p.shape)).astype(np.float32) for name, p in model.named_parameters()}


# ----- the switch itself ----------------------------------------------------------------------


def test_frozen_batch_statistics_normalises_by_the_batch_and_writes_nothing() -> None:
    tracked, frozen = seeded_model().train(), seeded_model().train()
    x, _ = data(6)
    before = model_weights(frozen)
    with frozen_batch_statistics(frozen):
        out_frozen = frozen(x)
    expected = tracked(x)
    torch.testing.assert_close(out_frozen, expected, rtol=0, atol=0)  # the batch's own mean and variance
    after = model_weights(frozen)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)  # running mean, variance and the counter untouched
    assert counts(tracked) == [1, 1] and counts(frozen) == [0, 0]
    assert all(m.track_running_stats for m in frozen.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    frozen(x)  # restored: the next forward counts again
    assert counts(frozen) == [1, 1]


def test_frozen_batch_statistics_restores_tracking_after_an_error() -> None:
    model = seeded_model().train()
    with pytest.raises(RuntimeError), frozen_batch_statistics(model):
        assert model[1].track_running_stats is False and model[6].track_running_stats is False
        raise RuntimeError("inside")
    assert model[1].track_running_stats is True and model[6].track_running_stats is True


def test_frozen_batch_statistics_leaves_eval_mode_and_untracked_layers_as_they_were() -> None:
    model = seeded_model().train()
    model[6].eval()                         # a BatchNorm in eval mode: not switched
    model[1].track_running_stats = False    # one that tracks nothing stays so
    with frozen_batch_statistics(model):
        assert model[6].track_running_stats is True and model[1].track_running_stats is False
    assert model[1].track_running_stats is False and model[6].track_running_stats is True


# ----- one update per local batch, rule by rule --------------------------------------------------


def _synsam(model: nn.Module, local):
    sx, sy = data(8, seed=7)
    return train_fedsynsam(model, local, synthetic_x=sx, synthetic_y=sy, rho=0.05, beta=0.5,
                           synthetic_batch_size=4, optimizer=OPTIMIZER)


def _cog(model: nn.Module, local):
    return train_fedcog(model, local, label_counts=np.array([10, 0, 5, 5]), previous_model=model_weights(model),
                        input_shape=(1, SIDE, SIDE), settings=CogSettings(gen_budget=8, gen_steps=2), batch_size=4,
                        optimizer=OPTIMIZER)


RULES = {
    "sgd": lambda m, b: train_sgd(m, b, optimizer=OPTIMIZER),
    "fedsam": lambda m, b: train_fedsam(m, b, rho=0.05, optimizer=OPTIMIZER),
    "mofedsam": lambda m, b: train_mofedsam(m, b, rho=0.05, alpha=0.5, previous_update=small_update(m),
                                            num_steps=STEPS, optimizer=OPTIMIZER),
    "fedlesam": lambda m, b: train_fedlesam(m, b, rho=0.05, previous_update=small_update(m), optimizer=OPTIMIZER),
    "fedlesam-s": lambda m, b: train_fedlesam_s(m, b, rho=0.05, previous_update=small_update(m),
                                                c_global=small_update(m), optimizer=OPTIMIZER),
    "fedlesam-d": lambda m, b: train_fedlesam_d(m, b, rho=0.05, alpha=0.1, previous_update=small_update(m),
                                                optimizer=OPTIMIZER),
    "fedgamma": lambda m, b: train_fedgamma(m, b, rho=0.05, c_global=small_update(m), optimizer=OPTIMIZER),
    "fedsmoo": lambda m, b: train_fedsmoo(m, b, rho=0.05, alpha=0.1, global_perturbation=small_update(m),
                                          optimizer=OPTIMIZER),
    "fedsynsam": _synsam,
    "fedcog": _cog,
}


@pytest.mark.parametrize("rule", [r for r in RULES if r != "fedcog"])
def test_each_rule_updates_the_batchnorm_statistics_once_per_step(rule: str) -> None:
    model = seeded_model()
    result = RULES[rule](model, batches())
    assert result.num_steps == STEPS
    assert counts(model) == [STEPS, STEPS]


def test_fedcog_updates_them_on_the_real_and_on_the_generated_batch_of_each_step() -> None:
    """rui-ye/FedCOG's `local_train_fedgen` forwards the real batch, then the generated one, both in train mode."""
    model = seeded_model()
    result = _cog(model, batches())
    assert result.num_steps == STEPS
    assert counts(model) == [2 * STEPS, 2 * STEPS]


def test_fedcogs_kd_pass_tracks_the_generated_batch_after_the_real_one() -> None:
    """One step's statistics are those of a tracked forward of the real batch, then of the generated batch."""
    model, expected = seeded_model().train(), seeded_model().train()
    (xb, yb), = list(batches(1))
    generated = GeneratedSet(inputs=torch.randn(4, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(3)),
                             global_logits=torch.zeros(4, 4), targets=torch.zeros(4, dtype=torch.long))
    plugin = KnowledgeDistillation(generated, c_real=0.5, c_kd=0.5, batch_size=4, seed=0)
    plugin(model, F.cross_entropy(model(xb), yb))
    expected(xb)
    expected(generated.inputs)  # the plug-in's batch of 4 is the whole set, in some order: the same statistics
    got, want = model_weights(model), model_weights(expected)
    for name in got:
        if "running" in name or "num_batches" in name:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("algorithm", [name for name, row in ALGORITHMS.items()
                                       if row.decentralized and "sam-rho" in rule_keys(row)])
def test_decentralized_sam_rules_update_the_statistics_once_per_step(algorithm: str) -> None:
    cfg = parse_run_config({"algorithm": algorithm, "model": "tests.test_batchnorm_counts:tiny_bn_cnn",
                            "local-steps": STEPS, "batch-size": 8}, SERVER_STRATEGIES)
    x, y = torch.randn(20, 1, 28, 28), torch.randint(0, 10, (20,))
    torch.manual_seed(cfg.seed)  # the seeded x^0 the node's first Ole restart starts from: the restart is x itself
    model = tiny_bn_cnn(num_classes=10, image_size=28)
    job = LocalJob(cfg=cfg, server_round=1, partition_id=0, model=model, x=x, y=y, device=torch.device("cpu"),
                   incoming=RecordDict({"config": ConfigRecord(train_config_of(cfg, 1))}), state=RecordDict())
    result = CLIENT_UPDATES[algorithm](job)
    assert result.num_steps == STEPS and counts(job.model) == [STEPS, STEPS]


@pytest.mark.parametrize("rule", ["fedsam", "mofedsam", "fedgamma", "fedsmoo", "fedsynsam"])
def test_the_statistics_are_those_of_the_local_batch_at_w(rule: str) -> None:
    """After one step the running statistics are those of one tracked forward of the local batch at
    w (davda54/sam): not of the pass at w + e or the synthetic batch."""
    model, at_w = seeded_model(), seeded_model()
    RULES[rule](model, batches(1))
    (xb, _), = list(batches(1))
    at_w.train()(xb)
    got, expected = model_weights(model), model_weights(at_w)
    for name in got:
        if "running" in name or "num_batches" in name:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_fedsams_parameters_are_those_of_the_former_rule() -> None:
    """Freezing the statistics in the pass at w + e changes no parameter: both passes normalise by the
    batch, so the steps equal those of the former rule, whose second pass also wrote statistics."""
    model, reference = seeded_model(), seeded_model()
    train_fedsam(model, batches(), rho=0.05, optimizer=OPTIMIZER)
    params = list(reference.parameters())

    def both_passes_write(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return fedsam_gradients(params, lambda: F.cross_entropy(reference(xb), yb), 0.05)

    train_steps(reference, batches(), both_passes_write, OPTIMIZER)
    assert counts(reference) == [2 * STEPS, 2 * STEPS]
    got, old = model_weights(model), model_weights(reference)
    for name, _ in model.named_parameters():
        np.testing.assert_array_equal(got[name], old[name], err_msg=name)


def test_fedcog_generation_leaves_the_models_statistics_alone() -> None:
    """Only the real batches count: the generation uses frozen copies in eval mode."""
    model = seeded_model()
    before = model_weights(model)
    fedcog_distillation(model, np.array([10, 0, 5, 5]), previous_model=before, input_shape=(1, SIDE, SIDE),
                        settings=CogSettings(gen_budget=8, gen_steps=2), batch_size=4)
    for name, value in model_weights(model).items():
        np.testing.assert_array_equal(value, before[name])
    assert model.training


# ----- the server: the stored trajectory stays as it was --------------------------------------------


def bn_trajectory(length: int = 3) -> list[dict[str, np.ndarray]]:
    """Global models w^0 .. w^{length-1} of the tiny BN CNN, each a few SGD steps after the last."""
    model = seeded_model()
    trajectory = [model_weights(model)]
    for r in range(length - 1):
        train_sgd(model, tensor_batches(*data(), batch_size=8, num_steps=2, seed=r), optimizer=OPTIMIZER)
        trajectory.append(model_weights(model))
    return trajectory


def assert_unchanged(trajectory: list[dict[str, np.ndarray]], kept: list[dict[str, np.ndarray]]) -> None:
    assert len(trajectory) == len(kept)
    for entry, original in zip(trajectory, kept):
        assert entry.keys() == original.keys()
        for name, value in original.items():
            assert entry[name].dtype == value.dtype and entry[name].tobytes() == value.tobytes(), name


SETTINGS = SynSAMSettings(synthetic_ipc=1, distill_iterations=2, distill_inner_steps=1, distill_optimizer="adam",
                           distill_lr=0.05)


def test_distillation_leaves_every_trajectory_entry_bitwise_unchanged() -> None:
    trajectory = bn_trajectory()
    kept = copy.deepcopy(trajectory)
    assert int(trajectory[0]["1.num_batches_tracked"]) == 0
    distill(tiny_bn_cnn(), trajectory, CLASSES, (1, SIDE, SIDE), SETTINGS, torch.device("cpu"))
    assert_unchanged(trajectory, kept)


def test_the_real_image_oracle_leaves_the_trajectory_bitwise_unchanged() -> None:
    trajectory = bn_trajectory()
    kept = copy.deepcopy(trajectory)
    x, y = data(8)
    real_oracle(tiny_bn_cnn(), trajectory, x.numpy(), y.numpy(), SETTINGS, torch.device("cpu"))
    assert_unchanged(trajectory, kept)


TASK = ServerTask(model="tests.test_batchnorm_counts:tiny_bn_cnn", dataset="mnist", partition="node",
                  num_classes=CLASSES, image_channels=1, image_size=SIDE)


def test_fedsynsams_distillation_keeps_its_stored_trajectory_and_initial_model() -> None:
    strategy = FedSynSAM(distillation=DistillationSettings(task=TASK, trajectory_rounds=2, synthetic_ipc=1,
                                                           distill_iterations=2, distill_inner_steps=1))
    strategy.trajectory = bn_trajectory()
    kept = copy.deepcopy(strategy.trajectory)
    strategy._distil()
    assert strategy.synthetic is not None and strategy.synthetic[0].shape == (CLASSES, 1, SIDE, SIDE)
    assert_unchanged(strategy.trajectory, kept)
    groups = strategy.state_arrays()  # what the checkpoint stores as trajectory-00000 ..
    assert int(groups["trajectory-00000"]["1.num_batches_tracked"]) == 0


def test_dynafeds_server_training_counts_its_own_batches_and_leaves_its_input_alone() -> None:
    strategy = DynaFed(distillation=DistillationSettings(task=TASK, trajectory_rounds=2),
                       server_training=DynaFedTraining(dynafed_epochs=2, dynafed_lr=1e-3, batch_size=3))
    strategy.trajectory = bn_trajectory()
    kept = copy.deepcopy(strategy.trajectory)
    x, y = data(8, seed=3)
    strategy.synthetic = (x.numpy(), y.numpy())
    new = strategy.trajectory[-1]
    trained = strategy.after_aggregation(new)
    assert_unchanged(strategy.trajectory, kept)
    start = int(new["1.num_batches_tracked"])
    assert int(trained["1.num_batches_tracked"]) == start + 2 * 3  # 2 epochs of ceil(8 / 3) batches
