"""SGD and Adam for local training: the updates of torch.optim's single-tensor paths, without torch.optim.

Why not torch.optim itself: its optimizers import `torch._dynamo` on first use
(the `_disable_dynamo` and `_use_grad_for_differentiable` wrappers around
`__init__`, `zero_grad` and `step`), 1.8 s on the 2-core machines here. In
Flower's deployment engine every ClientApp message runs in a new process, so
that import was a third of each message's life (`benchmarks/deployment.py`).
The updates below are the same elementwise operations in the same order as
`torch.optim.sgd._single_tensor_sgd` and `torch.optim.adam._single_tensor_adam`
(non-capturable, non-differentiable, no amsgrad/nesterov/maximize), so the
numbers are bitwise torch.optim's on the CPU (tests/test_optimizers.py).

Both take `clip_grad_norm` (0: off): before the update, the gradients are
scaled so that their global L2 norm is at most that value, with
`torch.nn.utils.clip_grad_norm_` (which does not import torch._dynamo), as
the OledFL/DisPFL code base does "to avoid nan loss". Clipping acts on the
loss gradient, before weight decay is added, as it does when
`clip_grad_norm_` is called between `backward()` and `torch.optim`'s `step()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

class _Optimizer:
    """Holds the parameters; `zero_grad` as torch.optim's (set_to_none by default)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float,
                 clip_grad_norm: float = 0.0) -> None:
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        if clip_grad_norm < 0:
            raise ValueError(f"clip_grad_norm must be >= 0 (0: off), got {clip_grad_norm}")
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.clip_grad_norm = float(clip_grad_norm)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def clip_gradients(self) -> float | None:
        """Scale the .grad tensors in place to global L2 norm <= clip_grad_norm; returns the norm before (None: off)."""
        if self.clip_grad_norm <= 0:
            return None
        grads = [p for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.nn.utils.clip_grad_norm_(grads, self.clip_grad_norm))

    def _with_gradients(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(index, parameter, gradient with L2 weight decay added) of every parameter that has a gradient.

        Clips the gradients first when `clip_grad_norm` is set.
        """
        self.clip_gradients()
        for index, p in enumerate(self.params):
            if p.grad is not None:
                yield index, p, self._decayed(p)

    def _decayed(self, p: torch.Tensor) -> torch.Tensor:
        """The gradient with L2 weight decay added (a new tensor; p.grad is left as it is)."""
        return p.grad.add(p, alpha=self.weight_decay) if self.weight_decay != 0 else p.grad


class SGD(_Optimizer):
    """SGD with heavy-ball momentum (dampening 0) and L2 weight decay, as `torch.optim.SGD`."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, clip_grad_norm: float = 0.0) -> None:
        super().__init__(params, lr, weight_decay, clip_grad_norm)
        self.momentum = float(momentum)
        self.momentum_buffers: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        for index, p, grad in self._with_gradients():
            if self.momentum != 0:
                buffer = self.momentum_buffers.get(index)
                if buffer is None:
                    buffer = self.momentum_buffers[index] = grad.detach().clone()
                else:
                    buffer.mul_(self.momentum).add_(grad, alpha=1.0)
                grad = buffer
            p.add_(grad, alpha=-self.lr)


class Adam(_Optimizer):
    """Adam with L2 (not decoupled) weight decay, as `torch.optim.Adam`."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, clip_grad_norm: float = 0.0) -> None:
        super().__init__(params, lr, weight_decay, clip_grad_norm)
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)
        self.steps: dict[int, float] = {}
        self.exp_avgs: dict[int, torch.Tensor] = {}
        self.exp_avg_sqs: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        for index, p, grad in self._with_gradients():
            if index not in self.steps:
                self.steps[index] = 0.0
                self.exp_avgs[index] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self.exp_avg_sqs[index] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.steps[index] += 1.0
            step = self.steps[index]
            exp_avg, exp_avg_sq = self.exp_avgs[index], self.exp_avg_sqs[index]
            exp_avg.lerp_(grad, 1 - self.beta1)
            exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            bias_correction1 = 1 - self.beta1**step
            bias_correction2 = 1 - self.beta2**step
            step_size = self.lr / bias_correction1
            denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(self.eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)


def make_optimizer(params: Iterable[torch.Tensor], kind: str, lr: float, momentum: float = 0.0,
                   weight_decay: float = 0.0, clip_grad_norm: float = 0.0) -> SGD | Adam:
    """`sgd` (with momentum) or `adam`; a new one per use, so no optimizer state outlives a round."""
    if kind == "adam":
        return Adam(params, lr=lr, weight_decay=weight_decay, clip_grad_norm=clip_grad_norm)
    if kind == "sgd":
        return SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, clip_grad_norm=clip_grad_norm)
    raise ValueError(f"unknown optimizer {kind!r}; one of sgd, adam")
