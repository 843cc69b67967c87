"""Functional SGD and Adam over stacked per-client tensors (leading dimension = clients).

The same arithmetic as ``torch.optim.SGD`` / ``torch.optim.Adam`` (single-tensor path) and
``torch.nn.utils.clip_grad_norm_``, applied to every client at once from an ``OptimizerSpec``:
per-name learning rates from its param groups, momentum, weight decay, betas, and the gradient
norm clipped per client. The state is fresh per local phase, as the sequential executor's.
"""

from __future__ import annotations

import torch

from pflbench.engine.optim import adam_update_
from pflbench.engine.types import OptimizerSpec, Tensors

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def per_client(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` [clients] shaped to broadcast against ``like`` [clients, ...]."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def clip_per_client(grads: Tensors, max_norm: float) -> Tensors:
    """Each client's gradients scaled by min(1, max_norm / (‖its gradient‖ + 1e-6))."""
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(len(g), -1), 2, dim=1) for g in grads.values()], dim=1)
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

    def step_(self, params: Tensors, grads: Tensors, step: int, rows: slice) -> None:
        """Update ``params`` in place (the clients ``rows`` of the stack, views) by their
        ``step``-th step (1-based; the same for every client of one call)."""
        spec = self.spec
        if spec.max_grad_norm is not None:
            grads = clip_per_client(grads, spec.max_grad_norm)
        for n, param in params.items():
            g = grads[n]
            if spec.weight_decay:
                g = g.add(param, alpha=spec.weight_decay)
            if spec.kind == "adam":
                self._adam_(n, param, g, step, rows)
                continue
            if spec.momentum:
                (buffer,) = (s[rows] for s in self.state[n])
                if step == 1:
                    buffer.copy_(g)
                else:
                    buffer.mul_(spec.momentum).add_(g)
                g = buffer
            param.add_(g, alpha=-self.lr[n])

    def _adam_(self, n: str, param: torch.Tensor, g: torch.Tensor, step: int, rows: slice) -> None:
        exp_avg, exp_avg_sq = (s[rows] for s in self.state[n])
        adam_update_(param, g, exp_avg, exp_avg_sq, step, self.lr[n], self.spec.betas)
