"""FID feature extractors (common/metrics/fid_features.py): the offline classifier, its cache, and Inception's weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.metrics import fid_features
from common.data.datasets import load_dataset
from common.models.diffusion import to_diffusion_input
from common.metrics.fid_features import (
    InceptionWeightsMissing,
    classifier_extractor,
    classifier_path,
    extractor_from_weights,
    extractor_weights,
    inception_extractor,
    make_extractor,
    random_extractor,
    train_reference_stats,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def extractor_and_data(tiny_data_dir, tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("fidcache"))
    extractor = classifier_extractor("fashion-mnist", 16, str(tiny_data_dir), cache)
    data = load_dataset("fashion-mnist", tiny_data_dir)
    return extractor, to_diffusion_input(data.x_train, 16), to_diffusion_input(data.x_test, 16), cache


def test_classifier_fid_separates_real_images_from_noise(extractor_and_data):
    extractor, train, test, _ = extractor_and_data
    reference = extractor.stats(train)
    noise = np.random.default_rng(0).uniform(-1, 1, size=test.shape).astype(np.float32)
    real_vs_real = extractor.fid(test, reference)
    noise_vs_real = extractor.fid(noise, reference)
    assert extractor.features(test).shape == (len(test), 128)
    assert real_vs_real < 0.1 * noise_vs_real
    assert extractor.fid(train, reference) == pytest.approx(0.0, abs=1e-6 * np.trace(reference.cov))
    assert float(extractor.info["test-accuracy"]) > 0.5  # the embedding knows the classes


def test_classifier_is_cached_on_disk_and_reloaded(extractor_and_data, tiny_data_dir, monkeypatch):
    extractor, train, _, cache = extractor_and_data
    assert classifier_path("fashion-mnist", 16, str(tiny_data_dir), cache).is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("the cached classifier must be reused")

    monkeypatch.setattr(fid_features, "train_feature_classifier", no_training)
    again = classifier_extractor("fashion-mnist", 16, str(tiny_data_dir), cache)
    np.testing.assert_array_equal(again.features(train[:20]), extractor.features(train[:20]))
    assert again.info == extractor.info


def test_reference_stats_are_cached(extractor_and_data, tiny_data_dir, monkeypatch):
    extractor, train, _, cache = extractor_and_data
    first = train_reference_stats(extractor, "fashion-mnist", 16, str(tiny_data_dir), cache)
    np.testing.assert_allclose(first.mean, extractor.stats(train).mean, atol=1e-10)
    monkeypatch.setattr("common.data.datasets.load_dataset", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    second = train_reference_stats(extractor, "fashion-mnist", 16, str(tiny_data_dir), cache)
    np.testing.assert_array_equal(second.cov, first.cov)
    assert second.count == first.count == len(train)


def test_inception_without_weights_says_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(InceptionWeightsMissing) as info:
        make_extractor("inception", "fashion-mnist", 16, cache_dir=str(tmp_path / "cache"))
    message = str(info.value)
    assert "inception_v3_google-0cc3c7bd.pth" in message and str(tmp_path / "cache" / "fid") in message
    assert str(tmp_path / "torch") in message and "classifier" in message


def test_inception_loads_local_weights_and_gives_pool_features(tmp_path, monkeypatch):
    from torchvision.models import inception_v3

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    target = tmp_path / "cache" / "fid" / fid_features.INCEPTION_FILE
    target.parent.mkdir(parents=True)
    torch.save(inception_v3(weights=None, aux_logits=True, init_weights=False).state_dict(), target)
    extractor = inception_extractor(str(tmp_path / "cache"))
    features = extractor.features(np.zeros((2, 1, 16, 16), dtype=np.float32))
    assert features.shape == (2, 2048) and np.all(np.isfinite(features))
    assert extractor.info["weights"] == str(target)


def test_unknown_extractor_is_refused():
    with pytest.raises(ValueError, match="classifier, random, inception"):
        make_extractor("clip", "fashion-mnist", 16)


def test_classifier_trains_to_convergence_and_reports_its_accuracy(extractor_and_data):
    """Training stops when the held-out accuracy has not improved for CLASSIFIER_PATIENCE epochs (or at the cap);
    the cache records the epochs, the best epoch, the held-out and the test accuracy."""
    extractor, _, _, _ = extractor_and_data
    info = extractor.info
    epochs, best = int(info["epochs"]), int(info["best-epoch"])
    assert 1 <= best <= epochs <= fid_features.CLASSIFIER_MAX_EPOCHS
    assert epochs == fid_features.CLASSIFIER_MAX_EPOCHS or epochs - best == fid_features.CLASSIFIER_PATIENCE
    assert 0 < float(info["holdout-accuracy"]) <= 1 and 0 < float(info["test-accuracy"]) <= 1


def test_stopping_keeps_the_best_epoch_by_hand(monkeypatch):
    """Held-out accuracies 0.5, 0.7, 0.6, 0.65 with patience 2: stop after epoch 4, keep epoch 2."""
    accuracies = iter([0.5, 0.7, 0.6, 0.65, 0.9])
    monkeypatch.setattr(fid_features, "classifier_accuracy", lambda *a, **k: next(accuracies))
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, size=(60, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, size=60)
    _, report = fid_features.train_feature_classifier(x, y, 3, max_epochs=10, patience=2)
    assert (report.epochs, report.best_epoch, report.holdout_accuracy) == (4, 2, 0.7)


def test_classifier_labels_images_for_the_class_histogram(extractor_and_data, tiny_data_dir):
    extractor, _, test, _ = extractor_and_data
    data = load_dataset("fashion-mnist", tiny_data_dir)
    predicted = extractor.predict(extractor.features(test))
    assert predicted.shape == (len(test),) and np.mean(predicted == data.y_test) == pytest.approx(
        float(extractor.info["test-accuracy"]), abs=1e-4)


def test_reference_features_for_kid_are_a_cached_fixed_subset(extractor_and_data, tiny_data_dir, monkeypatch):
    extractor, train, _, cache = extractor_and_data
    first = fid_features.train_reference_features(extractor, "fashion-mnist", 16, str(tiny_data_dir), cache, count=100)
    assert first.shape == (100, 128)
    monkeypatch.setattr("common.data.datasets.load_dataset", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    np.testing.assert_array_equal(
        fid_features.train_reference_features(extractor, "fashion-mnist", 16, str(tiny_data_dir), cache, count=100),
        first)


def test_the_random_extractor_is_fixed_travels_exactly_and_needs_no_data(extractor_and_data):
    """Issue 33: the extractor of a server without images; every node must compute the same features."""
    _, train, test, _ = extractor_and_data
    torch.manual_seed(123)  # the global RNG state must not matter
    first = random_extractor(1)
    torch.manual_seed(456)
    second = make_extractor("random", "own", 16, channels=1)
    for (name, a), b in zip(first.net.state_dict().items(), second.net.state_dict().values()):
        assert torch.equal(a, b), name
    sent = extractor_from_weights("random", extractor_weights(first), channels=1)
    np.testing.assert_array_equal(sent.features(test), first.features(test))
    assert first.features(test).shape == (len(test), 128) and first.head is None
    assert random_extractor(3).features(np.zeros((2, 3, 16, 16), dtype=np.float32)).shape == (2, 128)
    with pytest.raises(ValueError, match="does not travel"):
        extractor_from_weights("inception", {}, channels=1)


def test_the_random_extractor_separates_real_images_from_noise_and_from_a_class_subset(extractor_and_data,
                                                                                         tiny_data_dir):
    """Fashion-MNIST's test split at 8 and 28 px (benchmarks/results/fid-random.md): 0.03-0.05 real vs real,
    7-9 for two classes only, 38-51 for uniform noise; here the tiny dataset at 16 px."""
    _, train, test, _ = extractor_and_data
    extractor = random_extractor(1)
    reference = extractor.stats(train)
    noise = np.random.default_rng(0).uniform(-1, 1, size=test.shape).astype(np.float32)
    labels = load_dataset("fashion-mnist", tiny_data_dir).y_test
    two_classes = test[np.isin(labels, [0, 1])]
    real = extractor.fid(test, reference)
    assert real < 0.2 * extractor.fid(two_classes, reference) and real < 0.02 * extractor.fid(noise, reference)
