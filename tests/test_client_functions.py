"""fedsynth.client called as a Flower developer would: a tiny model, a DataLoader, plain parameters.

Each rule is checked against the update written out by hand (or against
plain torch), and fedsynth's own ClientApp path is checked to run the same
function bitwise.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fedsynth.client as fc
from client_app.training import LocalJob
from client_app.registry import CLIENT_UPDATES
from common.run.config import parse_run_config
from common.protocol import SCAFFOLD_CONTROL, SCAFFOLD_CONTROL_DELTA, STATE_SCAFFOLD_CONTROL
from common.records import from_record, model_weights, to_record
from server_app.registry import SERVER_STRATEGIES, train_config_of

LR = 0.1


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def _loader(n: int = 20, batch_size: int = 5, classes: int = 3) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def _params(model: nn.Module) -> dict[str, np.ndarray]:
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def _torch_sgd(model: nn.Module, loader: DataLoader, lr: float = LR) -> nn.Module:
    """Plain SGD written out, the update of torch.optim.SGD (which imports torch._dynamo: seconds)."""
    for xb, yb in loader:
        model.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
    return model


def _grad(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], **tol) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], **{"rtol": 1e-5, "atol": 1e-6, **tol})


# ----- the loop, FedAvg, FedProx ------------------------------------------------------


def test_train_sgd_on_a_dataloader_is_plain_sgd():
    model, reference, loader = _model(), _model(), _loader()
    result = fc.train_sgd(model, loader, optimizer=fc.LocalOptimizer(lr=LR))
    _torch_sgd(reference, loader)
    assert result.num_steps == 4
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    losses, replay = [], _model()
    for batch in loader:  # the loss of each batch before its step
        losses.append(float(F.cross_entropy(replay(batch[0]), batch[1]).detach()))
        _torch_sgd(replay, [batch])
    assert result.train_loss == pytest.approx(np.mean(losses), rel=1e-6)


def test_tensor_batches_are_seeded_and_cover_an_epoch():
    x, y = torch.arange(10.0).reshape(10, 1), torch.arange(10)
    first = [yb.tolist() for _, yb in fc.tensor_batches(x, y, batch_size=4, num_steps=3, seed=[7, 1, 0])]
    again = [yb.tolist() for _, yb in fc.tensor_batches(x, y, batch_size=4, num_steps=3, seed=[7, 1, 0])]
    other = [yb.tolist() for _, yb in fc.tensor_batches(x, y, batch_size=4, num_steps=3, seed=[7, 2, 0])]
    assert first == again and first != other
    assert [len(b) for b in first] == [4, 4, 2]
    assert sorted(sum(first, [])) == list(range(10))
    assert len(list(fc.epochs(_loader(), 3))) == 12


def test_fedprox_with_mu_zero_is_sgd_and_mu_pulls_towards_the_start():
    loader = _loader()
    plain, prox0, prox = _model(), _model(), _model()
    fc.train_sgd(plain, loader, optimizer=fc.LocalOptimizer(lr=LR))
    fc.train_fedprox(prox0, loader, mu=0.0, optimizer=fc.LocalOptimizer(lr=LR))
    fc.train_fedprox(prox, loader, mu=5.0, optimizer=fc.LocalOptimizer(lr=LR))
    start = _params(_model())
    distance = lambda m: sum(float(np.sum((v - start[k]) ** 2)) for k, v in _params(m).items())  # noqa: E731
    _close(_params(prox0), _params(plain), rtol=0, atol=0)
    assert distance(prox) < 0.8 * distance(plain)


# ----- the SAM family -----------------------------------------------------------------


def _sam_step_by_hand(model: nn.Module, xb, yb, direction: list[torch.Tensor], rho: float) -> None:
    norm = torch.sqrt(sum(torch.sum(d.double() ** 2) for d in direction)).float()
    with torch.no_grad():
        saved = [p.clone() for p in model.parameters()]
        for p, d in zip(model.parameters(), direction):
            p.add_(rho * d / (norm + 1e-12))
    grads = _grad(model, xb, yb)
    with torch.no_grad():
        for p, w, g in zip(model.parameters(), saved, grads):
            p.copy_(w - LR * g)


def test_fedsam_step_is_sgd_at_the_perturbed_point():
    loader = _loader(n=5)
    model, reference = _model(), _model()
    fc.train_fedsam(model, loader, rho=0.5, optimizer=fc.LocalOptimizer(lr=LR))
    xb, yb = next(iter(loader))
    _sam_step_by_hand(reference, xb, yb, _grad(reference, xb, yb), 0.5)
    _close(_params(model), _params(reference))
    plain = _model()
    fc.train_sgd(plain, loader, optimizer=fc.LocalOptimizer(lr=LR))
    assert not np.allclose(_params(plain)["1.weight"], _params(model)["1.weight"])


def test_fedlesam_perturbs_along_the_negated_previous_update():
    loader = _loader(n=5)
    update = {name: np.full(p.shape, 0.3, dtype=np.float32) for name, p in _model().named_parameters()}
    model, reference, without = _model(), _model(), _model()
    fc.train_fedlesam(model, loader, rho=0.5, previous_update=update, optimizer=fc.LocalOptimizer(lr=LR))
    xb, yb = next(iter(loader))
    _sam_step_by_hand(reference, xb, yb, [-torch.from_numpy(update[n]) for n, _ in reference.named_parameters()], 0.5)
    _close(_params(model), _params(reference))
    fc.train_fedlesam(without, loader, rho=0.5, previous_update=None, optimizer=fc.LocalOptimizer(lr=LR))
    _close(_params(without), _params(_torch_sgd(_model(), loader)), rtol=0, atol=0)


def test_mofedsam_alpha_zero_moves_by_the_previous_update_and_alpha_one_is_fedsam():
    loader = _loader()
    start = _params(_model())
    update = {name: np.full(v.shape, 0.01, dtype=np.float32) for name, v in start.items()}
    moved = _model()
    fc.train_mofedsam(moved, loader, rho=0.1, alpha=0.0, previous_update=update, optimizer=fc.LocalOptimizer(lr=LR))
    _close(_params(moved), {k: start[k] + update[k] for k in start}, atol=1e-6)
    one, sam = _model(), _model()
    fc.train_mofedsam(one, loader, rho=0.1, alpha=1.0, previous_update=update, optimizer=fc.LocalOptimizer(lr=LR))
    fc.train_fedsam(sam, loader, rho=0.1, optimizer=fc.LocalOptimizer(lr=LR))
    _close(_params(one), _params(sam))


def test_fedsynsam_with_beta_one_is_fedsam_and_reports_its_mix():
    loader = _loader()
    gen = torch.Generator().manual_seed(5)
    syn_x, syn_y = torch.randn(6, 4, generator=gen), torch.tensor([0, 1, 2, 0, 1, 2])
    local_only, sam = _model(), _model()
    result = fc.train_fedsynsam(local_only, loader, synthetic_x=syn_x, synthetic_y=syn_y, rho=0.2, beta=1.0,
                                synthetic_batch_size=3, optimizer=fc.LocalOptimizer(lr=LR))
    fc.train_fedsam(sam, loader, rho=0.2, optimizer=fc.LocalOptimizer(lr=LR))
    _close(_params(local_only), _params(sam))
    assert result.metrics["synsam-share"] == 0.0
    mixed = fc.train_fedsynsam(_model(), loader, synthetic_x=syn_x, synthetic_y=syn_y, rho=0.2, beta=0.7,
                               mix="normalized", synthetic_batch_size=3, optimizer=fc.LocalOptimizer(lr=LR))
    assert mixed.metrics["synsam-share"] == pytest.approx(0.3, abs=1e-6)
    assert -1.0 <= mixed.metrics["synsam-cos"] <= 1.0 and mixed.metrics["synsam-norm-ratio-median"] > 0


# ----- SCAFFOLD and its SAM variants ------------------------------------------------------


def test_scaffold_corrects_each_step_and_returns_option_two_controls():
    loader = _loader(n=5)
    start = _params(_model())
    c_global = {name: np.full(v.shape, 0.2, dtype=np.float32) for name, v in start.items()}
    c_local = {name: np.full(v.shape, 0.05, dtype=np.float32) for name, v in start.items()}
    model = _model()
    result = fc.train_scaffold(model, loader, c_global=c_global, c_local=c_local, optimizer=fc.LocalOptimizer(lr=LR))
    sgd = _params(_torch_sgd(_model(), loader))
    _close(_params(model), {k: sgd[k] - LR * (0.2 - 0.05) for k in sgd})
    end = _params(model)
    expected = {k: c_local[k] - c_global[k] + (start[k] - end[k]) / (1 * LR) for k in start}
    _close(result.control, expected)
    _close(result.control_delta, {k: expected[k] - c_local[k] for k in start})
    first = fc.train_scaffold(_model(), loader, c_global=c_global, optimizer=fc.LocalOptimizer(lr=LR))
    assert set(first.control) == set(start)  # c_i starts at zero


def test_fedgamma_and_fedlesam_s_are_their_sam_rules_plus_the_correction():
    loader = _loader(n=5)
    zeros = {name: np.zeros(p.shape, dtype=np.float32) for name, p in _model().named_parameters()}
    gamma, sam = _model(), _model()
    fc.train_fedgamma(gamma, loader, rho=0.3, c_global=zeros, c_local=zeros, optimizer=fc.LocalOptimizer(lr=LR))
    fc.train_fedsam(sam, loader, rho=0.3, optimizer=fc.LocalOptimizer(lr=LR))
    _close(_params(gamma), _params(sam), rtol=0, atol=0)
    update = {k: np.full(v.shape, 0.3, dtype=np.float32) for k, v in zeros.items()}
    shifted = {k: np.full(v.shape, 0.1, dtype=np.float32) for k, v in zeros.items()}
    lesam_s, lesam = _model(), _model()
    fc.train_fedlesam_s(lesam_s, loader, rho=0.3, previous_update=update, c_global=shifted, c_local=zeros,
                        optimizer=fc.LocalOptimizer(lr=LR))
    fc.train_fedlesam(lesam, loader, rho=0.3, previous_update=update, optimizer=fc.LocalOptimizer(lr=LR))
    _close(_params(lesam_s), {k: v - LR * 0.1 for k, v in _params(lesam).items()})


# ----- FedDyn-regularised rules -------------------------------------------------------------


def test_fedlesam_d_returns_feddyn_state_and_its_correction():
    loader = _loader()
    start = _params(_model())
    g = {k: np.full(v.shape, 0.05, dtype=np.float32) for k, v in start.items()}
    model = _model()
    result = fc.train_fedlesam_d(model, loader, rho=0.1, alpha=0.5, previous_update=None, dyn_gradient=g,
                                 optimizer=fc.LocalOptimizer(lr=LR))
    end = _params(model)
    expected = {k: g[k] - 0.5 * (end[k] - start[k]) for k in start}
    _close(result.dyn_gradient, expected)
    _close(result.correction, {k: expected[k] - g[k] for k in start})


def test_fedsmoo_first_round_keeps_the_server_perturbation_and_the_dual_apart():
    """Before a node's first round s, mu_i and g_i are all zero and must stay three separate buffers."""
    loader = _loader()
    start = _params(_model())
    model = _model()
    result = fc.train_fedsmoo(model, loader, rho=0.1, alpha=0.5, optimizer=fc.LocalOptimizer(lr=LR))
    end = _params(model)
    # g_i+ = g_i - alpha (w_i - w^t) with g_i = 0: nothing of mu_i may leak into g_i
    _close(result.dyn_gradient, {k: -0.5 * (end[k] - start[k]) for k in start}, rtol=0, atol=1e-7)
    mu_norm = np.sqrt(sum(float(np.sum(v ** 2)) for v in result.mu.values()))
    # s = 0: mu_i is the sum of the 4 steps' perturbations, each of norm rho
    assert 0.0 < mu_norm <= 4 * 0.1 + 1e-6
    assert set(result.perturbation_dual) == set(start)


# ----- MOON -----------------------------------------------------------------------------------


class _Moon(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.out = nn.Linear(4, 5), nn.Linear(5, 3)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.out(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_moon_with_mu_zero_is_sgd_and_returns_the_model_to_keep():
    loader = _loader()
    moon, sgd = _Moon(), _Moon()
    result = fc.train_moon(moon, loader, mu=0.0, tau=0.5, previous_model=None, optimizer=fc.LocalOptimizer(lr=LR))
    _torch_sgd(sgd, loader)
    _close(_params(moon), _params(sgd), rtol=0, atol=0)
    _close(result.previous_model, model_weights(moon), rtol=0, atol=0)
    contrastive = _Moon()
    fc.train_moon(contrastive, loader, mu=5.0, tau=0.5, previous_model=model_weights(_Moon()) | {
        k: v + 0.5 for k, v in model_weights(_Moon()).items()}, optimizer=fc.LocalOptimizer(lr=LR))
    assert not np.allclose(_params(contrastive)["body.weight"], _params(sgd)["body.weight"])


# ----- FedCOG -----------------------------------------------------------------------------------


def test_fedcog_generates_the_missing_labels_and_distils_them():
    loader = _loader(n=20, classes=2)  # labels 0 and 1 only: class 2 is missing
    counts = np.bincount(torch.cat([yb for _, yb in loader]).numpy(), minlength=3)
    assert fc.fedcog_distillation(_model(), np.array([4, 4, 4]), previous_model=None, input_shape=(4,)) is None
    settings = fc.CogSettings(gen_budget=12, gen_steps=5)
    plugin = fc.fedcog_distillation(_model(), counts, previous_model=None, input_shape=(4,), settings=settings,
                                    batch_size=4)
    assert plugin is not None and 2 in plugin.generated.targets.tolist()
    assert plugin.generated.inputs.shape[1:] == (4,) and plugin.stats()["disagreement"] == 0.0
    model = _model()
    result = fc.train_fedcog(model, loader, label_counts=counts, previous_model=model_weights(_model(1)),
                             input_shape=(4,), settings=settings, batch_size=4, optimizer=fc.LocalOptimizer(lr=LR))
    assert result.metrics["generated"] > 0 and result.metrics["disagreement"] == 1.0
    _close(result.previous_model, model_weights(model), rtol=0, atol=0)
    plain = _torch_sgd(_model(), loader)
    # the KD term on generated class-2 inputs keeps class 2's logit bias from collapsing as plain SGD does
    assert float(model[1].bias[2].detach()) > float(plain[1].bias[2].detach())


# ----- decentralized FL -------------------------------------------------------------------------


def test_gossip_mix_and_ole_restart_by_hand():
    own, a, b = ({"w": np.array([v], dtype=np.float32)} for v in (1.0, 3.0, 5.0))
    assert fc.gossip_mix(own, 0.5, [a, b], [0.25, 0.25])["w"][0] == pytest.approx(0.5 + 0.75 + 1.25)
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(2.0)
    norm = fc.ole_restart(model, {"weight": np.array([[1.5]], dtype=np.float32)}, beta=0.5)
    assert norm == pytest.approx(0.5)
    assert float(model.weight.detach()) == pytest.approx(2.0 + 0.5 * 0.5)


# ----- the uplink ---------------------------------------------------------------------------------


def test_encode_update_round_trips_through_the_servers_decoder():
    rng = np.random.default_rng(0)
    delta = {"b": rng.standard_normal(7).astype(np.float32), "a": rng.standard_normal((3, 4)).astype(np.float32)}
    shapes = {k: v.shape for k, v in delta.items()}
    plain = fc.encode_update(delta, fc.CodecSettings(), np.random.default_rng(1))
    _close(fc.decode_update(plain.payload, shapes, fc.CodecSettings()), delta, rtol=0, atol=0)
    codec = fc.CodecSettings("topk", topk_ratio=0.25, error_feedback=True)
    encoded = fc.encode_update(delta, codec, np.random.default_rng(1))
    decoded = fc.decode_update(encoded.payload, shapes, codec)
    _close({k: decoded[k] + encoded.residual[k] for k in delta}, delta, rtol=0, atol=1e-7)
    assert sum(int(np.count_nonzero(v)) for v in decoded.values()) < 19
    qsgd = fc.CodecSettings("qsgd", levels=17, qsgd_scope="model")
    payload = fc.encode_update(delta, qsgd, np.random.default_rng(1)).payload
    assert set(fc.decode_update(payload, shapes, qsgd)) == set(delta)


# ----- fedsynth's own ClientApp runs these same functions -----------------------------------------


def _job(algorithm: str, state: RecordDict, incoming: RecordDict) -> LocalJob:
    cfg = parse_run_config({"algorithm": algorithm, "local-steps": 3, "batch-size": 8, "lr": 0.05,
                            "model": "mlp"}, SERVER_STRATEGIES)
    from common.run.task import make_model
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(30, 1, 28, 28, generator=gen), torch.randint(0, 10, (30,), generator=gen)
    incoming["config"] = ConfigRecord(train_config_of(cfg, 2))  # what the app's strategy sends in round 2
    return LocalJob(cfg=cfg, server_round=2, partition_id=1, model=make_model(cfg, seeded=True), x=x, y=y,
                    device=torch.device("cpu"), incoming=incoming, state=state)


def test_the_clientapp_rules_are_the_public_functions_bitwise():
    job = _job("fedsam", RecordDict(), RecordDict())
    twin = copy.deepcopy(job.model)
    CLIENT_UPDATES["fedsam"](job)
    batches = fc.tensor_batches(job.x, job.y, 8, 3, seed=[job.cfg.seed, 2, 1])
    fc.train_fedsam(twin, batches, rho=job.cfg.sam_rho, optimizer=fc.LocalOptimizer(lr=0.05))
    _close(model_weights(job.model), model_weights(twin), rtol=0, atol=0)

    names = [n for n, _ in job.model.named_parameters()]
    c_global = {n: np.full(p.shape, 0.01, dtype=np.float32) for n, p in job.model.named_parameters()}
    incoming = RecordDict({SCAFFOLD_CONTROL: to_record(c_global)})
    job = _job("scaffold", RecordDict(), incoming)
    twin = copy.deepcopy(job.model)
    reply = CLIENT_UPDATES["scaffold"](job)
    result = fc.train_scaffold(twin, fc.tensor_batches(job.x, job.y, 8, 3, seed=[job.cfg.seed, 2, 1]),
                               c_global=c_global, optimizer=fc.LocalOptimizer(lr=0.05))
    _close(model_weights(job.model), model_weights(twin), rtol=0, atol=0)
    _close(from_record(job.state.array_records[STATE_SCAFFOLD_CONTROL]), result.control, rtol=0, atol=0)
    _close(from_record(reply.outgoing[SCAFFOLD_CONTROL_DELTA]), {n: result.control_delta[n] for n in names},
           rtol=0, atol=0)
