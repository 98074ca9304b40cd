"""Perturbation-quality diagnostic, simulation only (FedSynSAM Figure 2; `perturbation-diagnostic`).

SAM wants to climb along the true global gradient `grad F(w)`; federated SAM
variants estimate it. Each round, at the global model `w^t`, this measures the
cosine between `grad F(w^t)` on the union of the answering sampled clients'
training data and each method's ascent direction:

- `cos-fedsam`: each client's full local gradient `grad F_i(w^t)` (mean over clients);
- `cos-fedlesam`: `w^{t-1} - w^t`, the negated previous global update;
- `cos-fedsynsam`: the mixed direction `beta grad F_i(w^t) + (1 - beta) grad F(w^t; D_syn)`
  (or the "normalized" ablation's mix, `SynSAMRuleSettings`; mean over clients), once the
  synthetic set exists; `cos-synthetic` is the synthetic gradient alone;
- and, with the synthetic set, why the mix is or is not synthetic:
  `synthetic-norm-ratio` = `||grad F(w^t; D_syn)|| / ||grad F_i(w^t)||` and
  `synthetic-share` = the synthetic term's norm over the sum of both terms' norms
  (common/algorithms/synsam.py), both means over clients, and `cos-local-synthetic`, the
  cosine of each client's gradient with the synthetic one (mean).

The clients log the same ratio, share and cosine on their mini-batches, in
every FedSynSAM run (`stat-synsam-norm-ratio-median`, `stat-synsam-share`,
`stat-synsam-cos`); this diagnostic adds the full-batch values and the
cosines with the true gradient, which need every client's data.

It reads the clients' partitions from the partition cache, which only a
simulation's server can see, so it is off by default and never part of the
protocol. Gradients are full-batch, so the numbers compare directions, not
mini-batch noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.run.config import RunConfig
from common.metrics.evaluation import as_tensors, resolve_device
from common.data.partition import PartitionSpec, load_client_data
from common.records import load_weights
from common.algorithms.synsam import cosine, mix_ascent, norm_ratio, synthetic_share
from common.run.task import make_model


def full_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 2000) -> list[torch.Tensor]:
    """Gradient of the mean cross-entropy over the whole (x, y), accumulated in chunks."""
    model.zero_grad(set_to_none=True)
    for start in range(0, len(y), chunk):
        loss = F.cross_entropy(model(x[start:start + chunk]), y[start:start + chunk], reduction="sum") / len(y)
        loss.backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


class PerturbationDiagnostic:
    """Measures the cosines above; holds the model and the partitions it has loaded."""

    def __init__(self, cfg: RunConfig, num_partitions: int) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.model = make_model(cfg).to(self.device)
        self.spec = PartitionSpec(
            dataset=cfg.dataset, partition=cfg.partition, num_partitions=num_partitions, seed=cfg.seed,
            alpha=cfg.alpha, classes_per_client=cfg.classes_per_client, local_test_fraction=cfg.local_test_fraction,
            image_column=cfg.hf_image_column, label_column=cfg.hf_label_column,
        )
        self.data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _client(self, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        if partition_id not in self.data:
            client = load_client_data(self.spec, partition_id, self.cfg.data_dir, self.cfg.cache_dir)
            self.data[partition_id] = as_tensors(client.x_train, client.y_train, self.cfg.dataset, self.device)
        return self.data[partition_id]

    def measure(
        self,
        weights: Mapping[str, np.ndarray],
        partitions: Sequence[int],
        previous_update: Mapping[str, np.ndarray] | None,
        synthetic: tuple[np.ndarray, np.ndarray] | None,
    ) -> dict[str, float]:
        """The round's cosines at `weights` for the given (answering) partitions."""
        load_weights(self.model, weights)
        self.model.train()
        clients = [self._client(pid) for pid in partitions if len(self._client(pid)[1]) > 0]
        if not clients:
            return {}
        local = [full_gradient(self.model, x, y) for x, y in clients]
        counts = [len(y) for _, y in clients]
        # the union's mean loss is the count-weighted mean of the clients' mean losses
        true = [sum(g[j] * (n / sum(counts)) for g, n in zip(local, counts)) for j in range(len(local[0]))]
        out = {"cos-fedsam": float(np.mean([cosine(g, true) for g in local]))}
        if previous_update is not None:
            names = [name for name, _ in self.model.named_parameters()]
            direction = [-torch.from_numpy(np.asarray(previous_update[n])).to(self.device) for n in names]
            out["cos-fedlesam"] = cosine(direction, true)
        if synthetic is not None:
            xs, ys = (torch.from_numpy(a).to(self.device) for a in synthetic)
            g_syn = full_gradient(self.model, xs, ys)
            beta, mix = self.cfg.synsam_beta, self.cfg.synsam_mix
            out["cos-synthetic"] = cosine(g_syn, true)
            out["cos-fedsynsam"] = float(np.mean([cosine(mix_ascent(g, g_syn, beta, mix), true) for g in local]))
            out["cos-local-synthetic"] = float(np.mean([cosine(g, g_syn) for g in local]))
            out["synthetic-norm-ratio"] = float(np.mean([norm_ratio(g, g_syn) for g in local]))
            out["synthetic-share"] = float(np.mean([synthetic_share(g, g_syn, beta, mix) for g in local]))
        return out
