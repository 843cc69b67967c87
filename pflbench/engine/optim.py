"""The local optimizers: SGD and Adam of an ``OptimizerSpec``, as small classes of our own.

The arithmetic is ``torch.optim.SGD`` / ``torch.optim.Adam``'s single-tensor path, op for op
(the path torch takes on a CPU), so the numbers are bit-identical to torch's on a CPU (tested).
Why not ``torch.optim`` itself: constructing its first optimizer imports ``torch._dynamo``
(1.7 s on a quiet 2-core machine, up to 14 s on a busy one), paid by every run, sweep worker and
Ray worker; these classes need nothing beyond tensor ops and have less per-step overhead.

The interface is what client programs use: ``zero_grad(set_to_none=True)``, ``step()`` and
``param_groups`` (dicts with ``params`` and ``lr``, as torch's).
"""

from __future__ import annotations

import torch
from torch import nn

ADAM_EPS = 1e-8  # torch.optim.Adam's default


def adam_update_(
    param: torch.Tensor,
    gradient: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float],
) -> None:
    """torch.optim.Adam's single-tensor update of ``param`` (in place; ``step`` ≥ 1). Also the
    vmap executor's, on stacked per-client rows."""
    beta1, beta2 = betas
    exp_avg.lerp_(gradient, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
    step_size = lr / (1 - beta1 ** float(step))
    denom = (exp_avg_sq.sqrt() / (1 - beta2 ** float(step)) ** 0.5).add_(ADAM_EPS)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class LocalOptimizer:
    """Base: parameter groups, ``zero_grad``; subclasses implement ``update`` (one parameter)."""

    def __init__(self, groups: list[tuple[list[nn.Parameter], float]], weight_decay: float) -> None:
        self.param_groups = [{"params": params, "lr": lr} for params, lr in groups]
        self.weight_decay = weight_decay
        self.state: dict[nn.Parameter, list[torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One step for every parameter that has a gradient (torch skips the others too)."""
        for group in self.param_groups:
            lr = group["lr"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                gradient = param.grad
                if self.weight_decay != 0:
                    gradient = gradient.add(param, alpha=self.weight_decay)
                self.update(param, gradient, lr)

    def update(self, param: nn.Parameter, gradient: torch.Tensor, lr: float) -> None:
        raise NotImplementedError


class SGD(LocalOptimizer):
    """``torch.optim.SGD`` (dampening 0, no Nesterov): buf ← m·buf + g (buf₁ = g); p ← p − lr·buf."""

    def __init__(self, groups: list[tuple[list[nn.Parameter], float]], momentum: float, weight_decay: float) -> None:
        super().__init__(groups, weight_decay)
        self.momentum = momentum

    def update(self, param: nn.Parameter, gradient: torch.Tensor, lr: float) -> None:
        if self.momentum != 0:
            state = self.state.get(param)
            if state is None:
                buffer = gradient.detach().clone()
                self.state[param] = [buffer]
            else:
                buffer = state[0]
                buffer.mul_(self.momentum).add_(gradient, alpha=1)
            gradient = buffer
        param.add_(gradient, alpha=-lr)


class Adam(LocalOptimizer):
    """``torch.optim.Adam`` (no AMSGrad, L2 weight decay added to the gradient)."""

    def __init__(
        self, groups: list[tuple[list[nn.Parameter], float]], betas: tuple[float, float], weight_decay: float
    ) -> None:
        super().__init__(groups, weight_decay)
        self.betas = betas
        self.steps: dict[nn.Parameter, int] = {}

    def update(self, param: nn.Parameter, gradient: torch.Tensor, lr: float) -> None:
        state = self.state.get(param)
        if state is None:
            state = self.state[param] = [torch.zeros_like(param), torch.zeros_like(param)]
        step = self.steps[param] = self.steps.get(param, 0) + 1
        adam_update_(param, gradient, state[0], state[1], step, lr, self.betas)
