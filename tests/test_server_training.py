"""The settings of a training the server runs itself are one grouped value each (issue 63): built from the run
config by fedsynth's app with every key of the same name, checked when built with the run config's message, and
given to the class as one parameter."""

from __future__ import annotations

import dataclasses

import pytest

import fedsynth.strategies as public
from common.algorithm_table import ALGORITHMS
from common.errors import ConfigError
from common.run.config import parse_run_config
from common.run.task import task_of
from server_app.registry import build_strategy

GROUPS = [public.DistillationSettings, public.DynaFedTraining, public.DiffusionTraining, public.CorrectionSettings,
          public.QuickTestSettings]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_a_grouped_value_is_frozen_and_its_fields_mirror_run_config_keys(group):
    value = group()
    keys = {f.name for f in dataclasses.fields(parse_run_config({}, ALGORITHMS))}
    assert {f.name for f in dataclasses.fields(group)} - {"task"} <= keys
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, dataclasses.fields(group)[-1].name, 1)


@pytest.mark.parametrize(("group", "field", "bad", "key"), [
    (public.DistillationSettings, "synthetic_ipc", 0, "synthetic-ipc"),
    (public.DistillationSettings, "device", "tpu", "device"),
    (public.DynaFedTraining, "dynafed_lr", 0.0, "dynafed-lr"),
    (public.DiffusionTraining, "aux_fraction", 1e300, "aux-fraction"),
    (public.CorrectionSettings, "correction_lr", -1.0, "correction-lr"),
    (public.QuickTestSettings, "quicktest_reference", "real", "quicktest-reference"),
])
def test_a_grouped_value_is_checked_when_built_naming_the_key(group, field, bad, key):
    with pytest.raises(ConfigError, match=rf"^{group.__name__}: run config key '{key}'"):
        group(**{field: bad})


def test_a_task_of_the_wrong_shape_is_refused():
    with pytest.raises(ConfigError, match="'image-size'"):
        public.DistillationSettings(task=public.ServerTask(image_size=10**12))
    with pytest.raises(ConfigError, match="accepted: a fedsynth.strategies.ServerTask"):
        public.DiffusionTraining(task="unet-small")


def test_a_class_refuses_a_value_of_another_type():
    with pytest.raises(ConfigError, match=r"^FedSynSAM: parameter distillation = .* accepted: a fedsynth.strategies"
                                          r".DistillationSettings$"):
        public.FedSynSAM(distillation=public.DynaFedTraining())


def test_the_app_builds_each_grouped_value_from_the_run_config_keys():
    cfg = parse_run_config({"algorithm": "dynafed", "model": "mlp", "trajectory-rounds": 4, "distill-lr": 0.5,
                            "synthetic-ipc": 3, "dynafed-epochs": 2, "dynafed-lr": 0.01, "batch-size": 8,
                            "device": "cpu"}, ALGORITHMS)
    strategy = build_strategy(cfg)
    assert strategy.distillation == public.DistillationSettings(
        task=task_of(cfg), device="cpu", trajectory_rounds=4, distill_lr=0.5, synthetic_ipc=3)
    assert strategy.server_training == public.DynaFedTraining(dynafed_lr=0.01, dynafed_epochs=2, batch_size=8)
