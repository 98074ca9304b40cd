"""Centralized evaluation of the global model on a test set the server holds, or none.

The test set is, first match wins: the folder named by `central-test-path` (any
format a site's folder may have, common/data/site_data.py; its test split, or its
only split); the named dataset's official test split; nothing with
`partition = "node"` (the server holds no data: the clients' aggregated
local-test accuracy is then the run's accuracy). `central-eval = false` turns it
off and never opens a dataset.
"""

from __future__ import annotations

import numpy as np

from common.data.settings import NODE_PARTITION
from common.run.config import RunConfig
from common.data.datasets import load_run_dataset, run_dataset_info
from common.models.diffusion import is_diffusion
from common.metrics.evaluation import as_tensors, evaluate_model, resolve_device
from common.records import Weights, load_weights
from common.data.site_data import load_test_set, site_spec
from common.run.task import make_model


class CentralEvaluator:
    """Holds the test set as tensors and one model to load weights into."""

    def __init__(self, cfg: RunConfig, x_test: np.ndarray | None = None, y_test: np.ndarray | None = None) -> None:
        if x_test is None or y_test is None:
            x_test, y_test = central_test_arrays(cfg)
        self.device = resolve_device(cfg.device)
        self.x, self.y = as_tensors(x_test, y_test, cfg.dataset, self.device)
        self.model = make_model(cfg).to(self.device)

    def evaluate(self, weights: Weights) -> tuple[float, float]:
        """(loss, accuracy) of the given global weights."""
        load_weights(self.model, weights)
        self.model.to(self.device)
        return evaluate_model(self.model, self.x, self.y)


def central_test_arrays(cfg: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """The server's test images and labels: `central-test-path`, else the named dataset's test split."""
    if cfg.central_test_path:
        spec = site_spec(cfg, cfg.central_test_path, run_dataset_info(cfg))
        return load_test_set(spec, "server (run config key 'central-test-path')")
    data = load_run_dataset(cfg)
    return data.x_test, data.y_test


def has_central_test_set(cfg: RunConfig) -> bool:
    """Whether the run evaluates centrally: on, a classifier, and a test set the server can hold."""
    return cfg.central_eval and not is_diffusion(cfg) and (
        bool(cfg.central_test_path) or cfg.partition != NODE_PARTITION)


def central_evaluator(cfg: RunConfig) -> CentralEvaluator | None:
    """The run's central evaluator, or None where it has none (see the module docstring)."""
    return CentralEvaluator(cfg) if has_central_test_set(cfg) else None
