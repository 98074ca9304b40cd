"""The classifiers of SPEC 3.3, each split into a feature extractor and a head.

Every model exposes `features(x)` (the penultimate representation) and `head`,
so that MOON can add a projection head and FedCOG / FedSynSAM can reuse the
same networks. Shapes come from `DatasetInfo`, so a model that cannot take a
dataset's images is refused before any training (`check_model_fits`).

A user's own model is named `package.module:factory`: the factory is called
with `num_classes`, `channels` and `image_size` (keywords) and must return an
`nn.Module` (SPEC 3.3). The module must be importable wherever the model is
built: on the server and on every SuperNode (inside the Flower app that
`flwr run` ships, or installed on every host).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from common.data.datasets import DatasetInfo
from common.models.classifier_names import (  # noqa: F401 - the names, re-exported beside the models they name
    DEFAULT_GN_GROUPS, MODELS, check_model_fits, cnn_side, is_user_model, user_factory,
)

class Classifier(nn.Module):
    """features -> head; `forward` returns logits."""

    def __init__(self, features: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = features
        self.head = head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate representation of a batch."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MoonClassifier(nn.Module):
    """MOON's network: base features -> projection head z -> output layer.

    As in the MOON reference network, the output layer reads the projection,
    and the contrastive loss is computed on the projection `z`.
    """

    def __init__(self, base: Classifier, feature_dim: int, projection_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = base.body
        self.projection = nn.Sequential(
            nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, projection_dim)
        )
        self.head = nn.Linear(projection_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The projection z used by the contrastive loss."""
        return self.projection(self.body(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def simple_cnn(info: DatasetInfo) -> tuple[Classifier, int]:
    """The FL 'simple CNN': conv5-6, pool, conv5-16, pool, fc120, fc84, fc classes."""
    side_h, side_w = cnn_side(info.height), cnn_side(info.width)
    body = nn.Sequential(
        nn.Conv2d(info.channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side_h * side_w, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(84, info.num_classes)), 84


def simple_cnn_groupnorm(info: DatasetInfo) -> tuple[Classifier, int]:
    """The simple CNN with GroupNorm(2, C) after each convolution.

    The OledFL paper follows DisPFL's code, whose models use GroupNorm
    (its ResNet-18 here: `resnet18`, GroupNorm(2, C)); this is the same change
    at the size of the simple CNN, for the 28x28 datasets on CPU. GroupNorm
    normalises each sample on its own, so, unlike BatchNorm, it has no
    running statistics to average across nodes.
    """
    side_h, side_w = cnn_side(info.height), cnn_side(info.width)
    body = nn.Sequential(
        nn.Conv2d(info.channels, 6, 5), nn.GroupNorm(2, 6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.GroupNorm(2, 16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side_h * side_w, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(84, info.num_classes)), 84


def two_layer_mlp(info: DatasetInfo) -> tuple[Classifier, int]:
    """FedSynSAM's MLP for Fashion-MNIST as the project read "two-layer MLP": 784 -> 200 -> classes."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU())
    return Classifier(body, nn.Linear(200, info.num_classes)), 200


def mcmahan_2nn(info: DatasetInfo) -> tuple[Classifier, int]:
    """McMahan et al.'s 2NN, the usual reading of "two-layer MLP": 784 -> 200 -> 200 -> classes.

    Two hidden layers of 200 with ReLU; 199,210 parameters for 10 classes
    (FedAvg, McMahan et al. 2017). `mlp` is the one-hidden-layer reading.
    """
    body = nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU())
    return Classifier(body, nn.Linear(200, info.num_classes)), 200


def distillation_convnet(info: DatasetInfo, depth: int = 3, width: int = 128) -> tuple[Classifier, int]:
    """The dataset-distillation ConvNet: [conv3-128, instance norm, ReLU, avgpool2] x depth, linear."""
    layers: list[nn.Module] = []
    channels, side_h, side_w = info.channels, info.height, info.width
    for _ in range(depth):
        layers += [
            nn.Conv2d(channels, width, 3, padding=1),
            nn.GroupNorm(width, width, affine=True),  # instance norm, written as GroupNorm(C, C)
            nn.ReLU(),
            nn.AvgPool2d(2),
        ]
        channels, side_h, side_w = width, side_h // 2, side_w // 2
    layers.append(nn.Flatten())
    feature_dim = width * side_h * side_w
    return Classifier(nn.Sequential(*layers), nn.Linear(feature_dim, info.num_classes)), feature_dim


def resnet18_groupnorm(info: DatasetInfo, gn_groups: int = DEFAULT_GN_GROUPS) -> tuple[Classifier, int]:
    """torchvision ResNet-18, BatchNorm -> GroupNorm(gn_groups, C), CIFAR stem (3x3 conv, no max-pool).

    The project's default is 2 groups; DisPFL's code, which OledFL builds on,
    uses 32. Every width (64 to 512) must be divisible by the group count.
    """
    from torchvision.models import resnet18  # imported here: torchvision costs seconds to import

    if gn_groups < 1 or 64 % gn_groups:
        raise ValueError(f"resnet18 needs a GroupNorm group count that divides 64, got {gn_groups}")
    net = resnet18(num_classes=info.num_classes, norm_layer=lambda c: nn.GroupNorm(gn_groups, c))
    net.conv1 = nn.Conv2d(info.channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    head = net.fc
    net.fc = nn.Identity()
    return Classifier(net, head), 512


_BUILDERS = {
    "cnn": simple_cnn,
    "cnn-gn": simple_cnn_groupnorm,
    "mlp": two_layer_mlp,
    "mlp2": mcmahan_2nn,
    "convnet": distillation_convnet,
    "resnet18": resnet18_groupnorm,
}


def is_allocation_failure(err: BaseException) -> bool:
    """Whether `err` says memory could not be allocated: Python's MemoryError, torch's CPU allocator
    ("can't allocate memory") or its CUDA out-of-memory error."""
    return (isinstance(err, (MemoryError, torch.OutOfMemoryError))
            or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err)))


def model_size(model: nn.Module) -> str:
    """A model's size in words: its parameter count and the bytes of its arrays."""
    arrays = model.state_dict().values()
    parameters = sum(p.numel() for p in model.parameters())
    size = sum(a.numel() * a.element_size() for a in arrays)
    return f"{parameters:,} parameters, {size / 2**30:.2f} GiB of arrays"


def build_user_model(name: str, info: DatasetInfo) -> nn.Module:
    """A user's model: its factory called with the class count, channels and image size, checked to be a Module.

    A factory (or its checks: a second build, a forward pass) that cannot allocate its model is refused naming
    the model and, where it was built once, its size: the server and every node hold it more than once."""
    factory = user_factory(name)
    call = (f"{name.partition(':')[2]}(num_classes={info.num_classes}, channels={info.channels}, "
            f"image_size={info.height})")
    try:
        model = factory(num_classes=info.num_classes, channels=info.channels, image_size=info.height)
    except Exception as err:  # noqa: BLE001 - the user's code: say whose call failed
        if is_allocation_failure(err):
            raise ValueError(f"model {name!r}: the factory could not allocate its model on this host "
                             f"({type(err).__name__}: {str(err)[:200]}; it is called as {call})") from None
        raise ValueError(f"model {name!r}: the factory raised {type(err).__name__}: {err} (it is called as "
                         f"{call})") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    try:
        return _checked_user_model(name, info, model, factory)
    except Exception as err:  # noqa: BLE001 - only an allocation failure is translated here
        if not is_allocation_failure(err):
            raise
        raise ValueError(f"model {name!r}: its model ({model_size(model)}) was built once, but this host cannot "
                         f"allocate what checking and training it take (a second build, a forward pass; "
                         f"{type(err).__name__}: {str(err)[:200]})") from None


def _checked_user_model(name: str, info: DatasetInfo, model: nn.Module, factory: Callable[..., object]) -> nn.Module:
    """`model`, the factory's first build, once this process has checked the factory (kept for next calls)."""
    key = (name, info.num_classes, info.channels, info.height, info.width)
    if key not in _FITTING_USER_MODELS:
        problem = initial_weights_problem(model) or same_architecture_problem(model, lambda: factory(
            num_classes=info.num_classes, channels=info.channels, image_size=info.height))
        if problem:
            raise ValueError(f"model {name!r}: the factory {problem}")
        problem = output_width_problem(model, info)
        if problem:
            raise ValueError(f"model {name!r}: {problem}; its factory is called with num_classes="
                             f"{info.num_classes}: give its last layer that many outputs")
        _FITTING_USER_MODELS.add(key)
    return model


# (name, classes, channels, height, width) of the user models whose output width this process has checked
_FITTING_USER_MODELS: set[tuple[str, int, int, int, int]] = set()


def initial_weights_problem(model: nn.Module) -> str | None:
    """Why a factory's fresh model cannot start a run, or None: every initial weight must be finite.

    A NaN or an infinity at round 0 stays in the global model whatever the lr, so the run would end
    blaming the optimiser; said here, it names the factory.
    """
    for array_name, value in model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return (f"returns a model whose initial weights hold a NaN or an infinity (in '{array_name}'): "
                    "fix its initialisation")
    return None


def same_architecture_problem(model: nn.Module, build_again: Callable[[], object]) -> str | None:
    """Why a factory cannot be used, or None: a second call must give the same arrays (names, shapes, dtypes).

    The server and every node build the model with the factory, and a node loads the server's arrays into
    its own; a factory that builds another architecture on each call would otherwise fail there with
    torch's "size mismatch ... from checkpoint", though no checkpoint is involved. The second call runs
    under a forked RNG, so the run's random draws stay as they were.
    """
    with torch.random.fork_rng(devices=[]):
        other = build_again()
    if not isinstance(other, nn.Module):
        return f"returned {type(other).__name__} on its second call, not a torch.nn.Module"
    first = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    second = {k: (tuple(v.shape), v.dtype) for k, v in other.state_dict().items()}
    if first == second:
        return None
    where = next(k for k in [*first, *second] if first.get(k) != second.get(k))  # the first, in the model's order
    return (f"builds a different architecture on each call (array '{where}': {_shape_of(first, where)} on one call, "
            f"{_shape_of(second, where)} on the next); it must build the same model every time, since the server "
            "and every node build it and exchange its arrays")


def _shape_of(arrays: dict[str, tuple[tuple[int, ...], Any]], name: str) -> str:
    return f"shape {arrays[name][0]}, {str(arrays[name][1]).replace('torch.', '')}" if name in arrays else "absent"


def output_width_problem(model: nn.Module, info: DatasetInfo) -> str | None:
    """Why a classifier does not fit the task's class count, or None: its logits must be (batch, num_classes).

    A model with more outputs than classes trains silently on the first ones (a site once reached 0.30,
    status ok); one with fewer fails mid-round ("Target 6 is out of bounds"). One forward pass on a zero
    batch, in eval mode and without gradients, tells before any training.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output = model(torch.zeros(2, info.channels, info.height, info.width))
    except Exception as err:  # noqa: BLE001 - the user's code: say what the call was
        if is_allocation_failure(err):  # not the model's shape: the host's memory (build_user_model says so)
            raise
        return (f"a batch of {info.channels}x{info.height}x{info.width} images fails its forward pass "
                f"({type(err).__name__}: {err})")
    finally:
        model.train(was_training)
    if not isinstance(output, torch.Tensor):
        return f"its forward pass returns {type(output).__name__}, not a tensor of logits"
    if output.ndim != 2 or output.shape[0] != 2:
        return f"its output has shape {tuple(output.shape)} for a batch of 2, not (2, {info.num_classes})"
    if output.shape[1] != info.num_classes:
        return f"it has {output.shape[1]} outputs but the federation has {info.num_classes} classes"
    return None


def build_model(
    name: str, info: DatasetInfo, *, moon_projection_dim: int = 0, gn_groups: int = DEFAULT_GN_GROUPS
) -> nn.Module:
    """A freshly initialised model; with `moon_projection_dim` > 0, MOON's variant; `gn_groups`: resnet18's."""
    if is_user_model(name):
        if moon_projection_dim > 0:
            raise ValueError(f"model {name!r}: MOON needs a model split into `features` and `head` (a built-in: "
                             f"{', '.join(MODELS)})")
        return build_user_model(name, info)
    check_model_fits(name, info)
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    model, feature_dim = resnet18_groupnorm(info, gn_groups) if name == "resnet18" else builder(info)
    if moon_projection_dim > 0:
        return MoonClassifier(model, feature_dim, moon_projection_dim, info.num_classes)
    return model
