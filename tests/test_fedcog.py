"""FedCOG (issue 4): the math against hand-computed values, generation, and the plug-in in whole runs.

Whole runs use the in-process harness with a short generation (a few Adam steps
on a few dozen inputs); the 2-round Flower-simulation runs of every `X+cog`
come from tests/test_simulation.py, and the loopback deployment from
tests/test_fedcog_deployment.py.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from client_app.fedcog import (
    KnowledgeDistillation,
    frozen_copy,
    generate,
    grid_image,
)
from common.algorithm_table import COG_BASES
from common.run.config import ConfigError, parse_run_config
from common.data.datasets import dataset_info
from common.algorithms.fedcog import (
    complementary_counts,
    complementary_labels,
    disagreement_loss,
    generation_loss,
    js_divergence,
    kd_coefficients,
    kd_loss,
)
from common.models.classifiers import build_model
from common.protocol import STATE_COG_PREVIOUS_MODEL
from common.records import record_dict_array_bytes
from server_app.registry import SERVER_STRATEGIES
from fedsynth.inprocess import InProcessGrid
from tests.test_inprocess_runs import base_config, run_inprocess

# A short generation so that whole runs take seconds.
SMALL_GEN = {"gen-steps": 4, "gen-budget": 24}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Small tensors on a shared 2-core machine: one thread avoids OpenMP oversubscription stalls."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----- complementary label allocation (paper appendix A.1.1) -----------------------


def test_complementary_allocation_on_the_papers_worked_example():
    counts = complementary_counts(np.array([500, 0, 400, 200, 400]), 1000)
    np.testing.assert_array_equal(counts, [0, 500, 100, 300, 100])
    labels = complementary_labels(np.array([500, 0, 400, 200, 400]), 1000)
    assert len(labels) == 1000 and labels[0] == 1 and labels[-1] == 4
    np.testing.assert_array_equal(np.bincount(labels, minlength=5), [0, 500, 100, 300, 100])


def test_complementary_allocation_rounds_and_skips_a_balanced_client():
    # d_hat = [0, 2, 1]: 10 * 2/3 = 6.67 -> 7, 10 * 1/3 = 3.33 -> 3
    np.testing.assert_array_equal(complementary_counts(np.array([5, 3, 4]), 10), [0, 7, 3])
    np.testing.assert_array_equal(complementary_counts(np.array([7, 7, 7]), 256), [0, 0, 0])
    assert len(complementary_labels(np.array([7, 7, 7]), 256)) == 0


# ----- KD coefficients (paper appendix A.2.2) ------------------------------------------


def test_balanced_kd_coefficients_on_a_hand_made_histogram():
    # d = [30, 10, 0, 20]: d_hat = [0, 20, 30, 10], N_real = 60, N_gen = 60
    assert kd_coefficients(np.array([30, 10, 0, 20]), "balanced", 0.01) == pytest.approx((0.5, 0.5))
    # d = [8, 2]: d_hat = [0, 6], N_real = 10, N_gen = 6 -> 10/16, 6/16
    assert kd_coefficients(np.array([8, 2]), "balanced", 0.01) == pytest.approx((0.625, 0.375))
    # a NIID-2 client (2 of 10 classes, 100 each): N_gen = 8 * 100 -> (0.2, 0.8)
    assert kd_coefficients(np.array([100, 100] + [0] * 8), "balanced", 0.01) == pytest.approx((0.2, 0.8))
    assert kd_coefficients(np.array([8, 2]), "fixed", 0.01) == (1.0, 0.01)


# ----- divergences -------------------------------------------------------------------------


def test_js_divergence_hand_values_and_clamping():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 0.0, 3.0]])
    assert float(js_divergence(logits, logits)) == pytest.approx(0.0, abs=1e-7)
    assert float(disagreement_loss(logits, logits)) == pytest.approx(1.0, abs=1e-7)
    # p = (0.5, 0.5), q = (0.9, 0.1), m = (0.7, 0.3):
    # KL(p||m) = 0.5 ln(5/7) + 0.5 ln(5/3) = 0.0871767, KL(q||m) = 0.9 ln(9/7) + 0.1 ln(1/3) = 0.1163219
    p, q = torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.9, 0.1]]))
    assert float(js_divergence(p, q)) == pytest.approx(0.5 * (0.0871767 + 0.1163219), abs=1e-6)
    # one-hot opposites: clamped to (0.99, 0.01) vs (0.01, 0.99), m = (0.5, 0.5):
    # JS = 0.99 ln(1.98) + 0.01 ln(0.02), finite and below ln 2
    a, b = torch.tensor([[0.0, -100.0]]), torch.tensor([[-100.0, 0.0]])
    expected = 0.99 * math.log(1.98) + 0.01 * math.log(0.02)
    assert float(js_divergence(a, b)) == pytest.approx(expected, abs=1e-6) and expected < math.log(2)


def test_kd_loss_is_kl_of_teacher_to_student():
    teacher, student = torch.log(torch.tensor([[0.9, 0.1]])), torch.log(torch.tensor([[0.5, 0.5]]))
    assert float(kd_loss(student, teacher)) == pytest.approx(0.9 * math.log(1.8) + 0.1 * math.log(0.2), abs=1e-6)
    assert float(kd_loss(teacher, teacher)) == pytest.approx(0.0, abs=1e-7)


def test_generation_loss_has_no_disagreement_term_without_a_local_model():
    logits, targets = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])
    ce = float(torch.nn.functional.cross_entropy(logits, targets))
    assert float(generation_loss(logits, targets, None, 0.1)) == pytest.approx(ce)
    # identical models agree fully: 1 - JS = 1
    assert float(generation_loss(logits, targets, logits, 0.1)) == pytest.approx(ce + 0.1)


# ----- generation ----------------------------------------------------------------------------


def _frozen_cnns(dataset: str = "fashion-mnist") -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two different CNNs with confident predictions, as trained models have (fresh ones are near uniform)."""
    info = dataset_info(dataset)
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = build_model("cnn", info)
        with torch.no_grad():
            model.head.weight.mul_(20.0)
        models.append(frozen_copy(model))
    return models[0], models[1]


def test_generation_loss_falls_and_the_best_step_is_kept_as_a_copy():
    global_model, local_model = _frozen_cnns()
    targets = torch.arange(10).repeat(2)
    gen = generate(global_model, local_model, targets, (1, 28, 28), steps=25, lr=0.05, lambda_dis=0.1, seed=3)
    assert len(gen.losses) == 25
    assert min(gen.losses) < gen.losses[0] - 0.1
    assert gen.losses[-1] < gen.losses[0]
    # the kept inputs and logits are those of the best step, not the live tensor after the last step
    with torch.no_grad():
        logits = global_model(gen.inputs)
        recomputed = generation_loss(logits, targets, local_model(gen.inputs), 0.1)
    torch.testing.assert_close(gen.global_logits, logits)
    assert float(recomputed) == pytest.approx(min(gen.losses), abs=1e-5)
    assert gen.losses[gen.best_step] == min(gen.losses)


def test_disagreement_term_lowers_the_agreement_of_the_two_frozen_models():
    global_model, local_model = _frozen_cnns()
    targets = torch.arange(10).repeat(2)
    noise = generate(global_model, local_model, targets, (1, 28, 28), steps=0, lr=0.05, lambda_dis=5.0, seed=3)
    runs = {lam: generate(global_model, local_model, targets, (1, 28, 28), steps=25, lr=0.05, lambda_dis=lam, seed=3)
            for lam in (0.0, 5.0)}

    def agreement(inputs: torch.Tensor) -> float:
        with torch.no_grad():
            return 1.0 - float(js_divergence(global_model(inputs), local_model(inputs)))

    assert agreement(runs[5.0].inputs) < agreement(noise.inputs) - 0.2
    assert agreement(runs[5.0].inputs) < agreement(runs[0.0].inputs) - 0.05
    # steps = 0: Gaussian inputs, untouched (Table 5's ablation 1)
    assert noise.losses == [] and noise.inputs.std().item() == pytest.approx(1.0, abs=0.1)


def test_generation_takes_the_channel_count_from_the_data():
    global_model, local_model = _frozen_cnns("cifar10")
    gen = generate(global_model, local_model, torch.tensor([3, 3, 7]), (3, 32, 32), steps=2, lr=0.01,
                   lambda_dis=0.1, seed=0)
    assert gen.inputs.shape == (3, 3, 32, 32) and gen.global_logits.shape == (3, 10)
    grid, classes = grid_image(gen, "cifar10", columns=4)  # Figure 5: a row per class, as many columns as needed
    assert classes == [3, 7] and grid.shape == (2 * 32, 2 * 32, 3)
    assert 0.0 <= grid.min() and grid.max() <= 1.0


def test_kd_plugin_scales_the_task_loss_and_adds_kl_on_the_next_generated_batch():
    global_model, _ = _frozen_cnns()
    gen = generate(global_model, None, torch.arange(10), (1, 28, 28), steps=0, lr=0.01, lambda_dis=0.0, seed=0)
    plugin = KnowledgeDistillation(gen, c_real=0.25, c_kd=0.75, batch_size=10, seed=0)
    student = build_model("cnn", dataset_info("fashion-mnist"))
    task = torch.tensor(2.0)
    with torch.no_grad():
        expected = 0.25 * 2.0 + 0.75 * float(kd_loss(student(gen.inputs), gen.global_logits))
        assert float(plugin(student, task)) == pytest.approx(expected, rel=1e-5)
        # the teacher itself has nothing left to learn from its own soft labels
        assert float(plugin(global_model, task)) == pytest.approx(0.5, abs=1e-6)


# ----- configuration -------------------------------------------------------------------------


def test_cog_config_is_validated_and_the_default_schedule_follows_the_paper():
    with pytest.raises(ConfigError, match="'cog'"):
        parse_run_config({"algorithm": "fedsam", "cog": True}, SERVER_STRATEGIES)
    with pytest.raises(ConfigError, match="'kd-weighting'"):
        parse_run_config({"algorithm": "fedcog", "kd-weighting": "soft"}, SERVER_STRATEGIES)
    with pytest.raises(ConfigError, match="'cog-ablation'"):
        parse_run_config({"algorithm": "fedcog", "cog-ablation": "nothing"}, SERVER_STRATEGIES)
    rounds = {r: parse_run_config({"algorithm": "fedcog", "num-server-rounds": r}, SERVER_STRATEGIES).first_cog_round(r)
              for r in (70, 20, 2, 1)}
    assert rounds == {70: 51, 20: 15, 2: 2, 1: 1}
    explicit = parse_run_config({"algorithm": "fedcog", "cog-start-round": 3}, SERVER_STRATEGIES)
    assert explicit.first_cog_round(30) == 3


# ----- the plug-in in whole runs (in-process) ---------------------------------------------


class RecordingGrid(InProcessGrid):
    """An in-process grid that also keeps the train replies it hands to the server."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.train_replies = []

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        self.train_replies += [r for r in replies if r.metadata.message_type.startswith("train")]
        return replies


def _final_weights(tmp_path, data_dir, nodes: int = 2, **keys):
    raw = base_config(tmp_path, data_dir, **keys)
    _, results, strategy, grid = run_inprocess(raw, nodes, RecordingGrid(nodes, raw))
    return strategy.current, results, grid


@pytest.mark.parametrize("base", COG_BASES)
def test_before_the_first_cog_round_x_plus_cog_is_exactly_x(tmp_path, tiny_data_dir, base):
    plain, _, _ = _final_weights(tmp_path / "plain", tiny_data_dir, algorithm=base, **{"num-server-rounds": 1})
    cog, _, grid = _final_weights(tmp_path / "cog", tiny_data_dir, algorithm=f"{base}+cog",
                                  **{"num-server-rounds": 1, "cog-start-round": 2})
    for name, value in plain.items():
        np.testing.assert_array_equal(cog[name], value, err_msg=name)
    # ... but the node already keeps its local model for the first FedCOG round's disagreement term
    assert all(STATE_COG_PREVIOUS_MODEL in ctx.state.array_records for ctx in grid.contexts.values())


def test_cog_key_turns_fedcog_on_over_the_configured_base(tmp_path, tiny_data_dir):
    keys = {"cog-start-round": 1, **SMALL_GEN}
    named, _, _ = _final_weights(tmp_path / "named", tiny_data_dir, algorithm="fedprox+cog", **keys)
    flag, results, _ = _final_weights(tmp_path / "flag", tiny_data_dir, algorithm="fedprox", cog=True, **keys)
    plain, _, _ = _final_weights(tmp_path / "plain", tiny_data_dir, algorithm="fedprox")
    for name, value in named.items():
        np.testing.assert_array_equal(flag[name], value, err_msg=name)
    assert any(not np.array_equal(plain[name], named[name]) for name in named)
    assert all(r["stat-cog-generated"] > 0 for r in results.rounds[1:])


@pytest.mark.parametrize("base", ["scaffold"])  # the base with its own extra records both ways
def test_nothing_extra_crosses_the_network(tmp_path, tiny_data_dir, base):
    """Reply records and their byte counts equal the base's; the generated set stays out of node state too."""
    keys = {"num-server-rounds": 2, "cog-start-round": 1, **SMALL_GEN}
    _, _, plain = _final_weights(tmp_path / "plain", tiny_data_dir, algorithm=base, **keys)
    _, results, cog = _final_weights(tmp_path / "cog", tiny_data_dir, algorithm=f"{base}+cog", **keys)
    assert results.rounds[2]["stat-cog-disagreement"] == 1.0  # round 2 used the previous local model
    assert len(plain.train_replies) == len(cog.train_replies) == 4
    for a, b in zip(plain.train_replies, cog.train_replies):
        assert set(a.content.keys()) == set(b.content.keys())
        assert {k: r.count_bytes() for k, r in a.content.array_records.items()} == \
               {k: r.count_bytes() for k, r in b.content.array_records.items()}
        assert record_dict_array_bytes(a.content) == record_dict_array_bytes(b.content)
        extra_metrics = set(b.content.metric_records["metrics"]) - set(a.content.metric_records["metrics"])
        assert extra_metrics and all(k.startswith("stat-cog-") for k in extra_metrics)
    for pid in plain.contexts:
        assert set(cog.contexts[pid].state.keys()) == set(plain.contexts[pid].state.keys()) | {STATE_COG_PREVIOUS_MODEL}


def _write_tiny_cifar10(root, num_train: int = 300, num_test: int = 100):
    """A learnable CIFAR-10 stand-in in the python-pickle batch format (5 train batches + test)."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def batch(n: int) -> dict:
        labels = rng.integers(0, 10, size=n)
        images = rng.integers(0, 60, size=(n, 3, 32, 32)).astype(np.uint8)
        for i, label in enumerate(labels):
            images[i, label % 3, 2 + 3 * label: 5 + 3 * label, 4:28] = 230
        return {b"data": images.reshape(n, -1), b"labels": [int(v) for v in labels]}

    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(num_train // 5)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(num_test)))
    return root


def test_fedcog_on_three_channel_data_writes_the_grid(tmp_path):
    data_dir = _write_tiny_cifar10(tmp_path / "data")
    _, results, _ = _final_weights(tmp_path, data_dir, nodes=2, algorithm="moon+cog", dataset="cifar10",
                                   **{"cog-start-round": 2, "cog-grid-partition": 1, **SMALL_GEN})
    assert results.rounds[2]["stat-cog-generated"] > 0 and results.rounds[2]["stat-cog-disagreement"] == 1.0
    assert (results.path / "fedcog-generated.png").stat().st_size > 1000


def test_table5_ablations_run_and_differ_from_full_fedcog(tmp_path, tiny_data_dir):
    keys = {"num-server-rounds": 2, "cog-start-round": 2, **SMALL_GEN}
    full, _, _ = _final_weights(tmp_path / "full", tiny_data_dir, algorithm="fedcog", **keys)
    for ablation in ("noise", "global-only", "hard-label"):
        ablated, results, _ = _final_weights(tmp_path / ablation, tiny_data_dir, algorithm="fedcog",
                                             **{"cog-ablation": ablation, **keys})
        assert any(not np.array_equal(full[name], ablated[name]) for name in full), ablation
        last = results.rounds[2]
        assert last["stat-cog-disagreement"] == (0.0 if ablation in ("noise", "global-only") else 1.0)
        assert ("stat-cog-gen-loss-first" in last) == (ablation != "noise")


# ----- NIID-2: the pairs split in a federation ------------------------------------------


def test_on_pairs_every_client_holds_its_pair_and_generates_its_budget(tmp_path, tiny_data_dir):
    raw = base_config(tmp_path, tiny_data_dir, algorithm="fedavg+cog", partition="pairs", **{
        "num-server-rounds": 1, "cog-start-round": 1, "local-test-fraction": 0.0, **SMALL_GEN})
    _, results, strategy, grid = run_inprocess(raw, 10)
    from client_app.app import _setup

    for context in grid.contexts.values():  # each node's own data (its histogram stays on the node)
        _, node, data = _setup(context)
        held = [c for c, n in enumerate(data.label_counts(10)) if n > 0]
        assert held == [2 * (node.partition_id % 5), 2 * (node.partition_id % 5) + 1]
    # 24 inputs over the classes each client lacks (the 8 missing ones, and a few of its smaller held
    # class where the stand-in data's two classes differ in size): the budget up to per-class rounding
    assert 23.0 <= results.rounds[1]["stat-cog-generated"] <= 25.0


def test_pairs_with_a_node_count_that_does_not_divide_fails_the_handshake_with_the_reason(tmp_path, tiny_data_dir):
    from server_app.handshake import HandshakeError

    raw = base_config(tmp_path, tiny_data_dir, partition="pairs", **{"node-wait-timeout": 5.0})
    # the nodes load their data in the handshake; the in-process grid raises the ClientApp's error
    # where a deployment's handshake reports it (HandshakeError with the nodes' reasons)
    with pytest.raises((HandshakeError, ConfigError), match="multiple of 5"):
        run_inprocess(raw, 7)
