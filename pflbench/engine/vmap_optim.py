"""Functional SGD and Adam over stacked per-client tensors (leading dimension = clients).

The same arithmetic as ``torch.optim.SGD`` / ``torch.optim.Adam`` (single-tensor path) and
``torch.nn.utils.clip_grad_norm_``, applied to every client at once from an ``OptimizerSpec``:
per-name learning rates from its param groups, momentum, weight decay, betas, and the gradient
norm clipped per client. The state is fresh per local phase, as the sequential executor's.
"""
from __future__ import annotations

import math

import torch

from .types import OptimizerSpec, Tensors

ADAM_EPS = 1e-8  # torch.optim.Adam's default
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def per_client(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` [clients] shaped to broadcast against ``like`` [clients, ...]."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def clip_per_client(grads: Tensors, max_norm: float) -> Tensors:
    """Each client's gradients scaled by min(1, max_norm / (‖its gradient‖ + 1e-6))."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads.values()], dim=1)
    total = torch.linalg.vector_norm(norms, 2, dim=1)
    coefficient = (max_norm / (total + CLIP_EPS)).clamp(max=1.0)
    return {n: g * per_client(coefficient, g) for n, g in grads.items()}


class FunctionalOptimizer:
    """One local phase's optimizer over ``names`` of the stacked state."""

    def __init__(self, spec: OptimizerSpec, names: list[str], params: Tensors) -> None:
        if spec.kind not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer kind {spec.kind!r}; valid: sgd, adam")
        self.spec = spec
        self.lr = {n: spec.lr for n in names}
        for group in spec.groups:
            for n in group.names:
                if n in self.lr:
                    self.lr[n] = group.lr or spec.lr
        self.state: dict[str, list[torch.Tensor]] = {}
        if spec.kind == "adam":
            self.state = {n: [torch.zeros_like(params[n]), torch.zeros_like(params[n])] for n in names}
        elif spec.momentum:
            self.state = {n: [torch.zeros_like(params[n])] for n in names}

    def step(self, params: Tensors, grads: Tensors, step: int, rows: torch.Tensor | None) -> Tensors:
        """New values of ``params`` (the clients ``rows`` of the stack, None: all) after their
        ``step``-th step (1-based; the same for every client of one call)."""
        spec = self.spec
        if spec.max_grad_norm is not None:
            grads = clip_per_client(grads, spec.max_grad_norm)
        new = {}
        for n, param in params.items():
            g = grads[n]
            if spec.weight_decay:
                g = g.add(param, alpha=spec.weight_decay)
            if spec.kind == "adam":
                new[n] = self._adam(n, param, g, step, rows)
                continue
            if spec.momentum:
                (buffer,) = self._take(n, rows)
                buffer = g.clone() if step == 1 else buffer.mul(spec.momentum).add_(g)
                self._put(n, rows, [buffer])
                g = buffer
            new[n] = param.add(g, alpha=-self.lr[n])
        return new

    def _adam(self, n: str, param: torch.Tensor, g: torch.Tensor, step: int,
              rows: torch.Tensor | None) -> torch.Tensor:
        beta1, beta2 = self.spec.betas
        exp_avg, exp_avg_sq = self._take(n, rows)
        exp_avg = exp_avg.lerp(g, 1 - beta1)
        exp_avg_sq = exp_avg_sq.mul(beta2).addcmul_(g, g, value=1 - beta2)
        self._put(n, rows, [exp_avg, exp_avg_sq])
        step_size = self.lr[n] / (1 - beta1 ** step)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(ADAM_EPS)
        return param.addcdiv(exp_avg, denom, value=-step_size)

    def _take(self, n: str, rows: torch.Tensor | None) -> list[torch.Tensor]:
        return self.state[n] if rows is None else [s.index_select(0, rows) for s in self.state[n]]

    def _put(self, n: str, rows: torch.Tensor | None, values: list[torch.Tensor]) -> None:
        if rows is None:
            self.state[n] = values
        else:
            for target, value in zip(self.state[n], values):
                target.index_copy_(0, rows, value)
