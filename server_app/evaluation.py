"""Centralized evaluation of the global model on the dataset's official test split.

Available where the server has the dataset (simulation, or a deployment whose
server has a data directory); `central-eval = false` turns it off.
"""

from __future__ import annotations

from common.config import RunConfig
from common.datasets import load_run_dataset
from common.evaluation import as_tensors, evaluate_model, resolve_device
from common.records import Weights, load_weights
from common.task import make_model


class CentralEvaluator:
    """Holds the test split as tensors and one model to load weights into."""

    def __init__(self, cfg: RunConfig) -> None:
        data = load_run_dataset(cfg)
        self.device = resolve_device(cfg.device)
        self.x, self.y = as_tensors(data.x_test, data.y_test, cfg.dataset, self.device)
        self.model = make_model(cfg).to(self.device)

    def evaluate(self, weights: Weights) -> tuple[float, float]:
        """(loss, accuracy) of the given global weights."""
        load_weights(self.model, weights)
        self.model.to(self.device)
        return evaluate_model(self.model, self.x, self.y)
