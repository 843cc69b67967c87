"""Streaming aggregation: fold each client's upload into the round's result as it arrives.

Holding every upload of a round until ``Algorithm.aggregate`` costs one model copy per sampled
client (1,000 FedRep clients: gigabytes). When the rule is the sample-weighted average and the
round's total of samples is known up front, the average is a running sum in arrival (= job)
order with the same weights and kernels as ``weighted_average``: bit-for-bit the same result,
with memory of one model instead of one per client.
"""

from __future__ import annotations

import torch

from pflbench.engine.types import ClientUpdate, Tensors


class StreamingWeightedAverage:
    """w ← Σ_k (n_k / total)·w_k over the updates added, written into ``target`` by ``finish``."""

    def __init__(self, target: Tensors, total_samples: int) -> None:
        self.target, self.total_samples = target, total_samples
        self.names: list[str] | None = None
        self.sum: list[torch.Tensor] = []

    def add(self, update: ClientUpdate) -> None:
        if self.names is None:
            self.names = list(update.params)
            self.sum = [torch.zeros_like(update.params[n]) for n in self.names]
        if self.names:
            weight = update.num_samples / self.total_samples
            torch._foreach_add_(self.sum, [update.params[n] for n in self.names], alpha=weight)

    def finish(self) -> None:
        """Copy the average into ``target`` (nothing when no update uploaded anything)."""
        if self.names:
            torch._foreach_copy_([self.target[n] for n in self.names], self.sum)
        self.sum = []
