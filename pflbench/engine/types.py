"""The data that crosses the executor seam: plain tensors, dataclasses and their helpers.

Everything here is picklable: a ``ClientJob`` goes to an executor (in this process, a vectorized
batch or a Ray worker), a ``ClientUpdate`` comes back. The optimizer is described as data
(``OptimizerSpec``), so an executor that does not use ``torch.optim`` can run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
Forward = Callable[[Tensors, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NoHyperparameters:
    """An algorithm without hyperparameters of its own."""


@dataclass(frozen=True)
class LocalPhase:
    """``epochs`` passes over the client's train split updating only ``trainable`` params."""

    epochs: int
    trainable: frozenset[str]


@dataclass(frozen=True)
class ParamGroup:
    """Parameters sharing one learning rate; ``lr=None`` takes the optimizer's ``lr``."""

    names: frozenset[str]
    lr: float | None = None


@dataclass(frozen=True)
class OptimizerSpec:
    """A local optimizer as data: ``kind`` sgd|adam, its settings and optional param groups.

    Parameters in no group use ``lr``. A fresh optimizer is built for every local phase of every
    round (no optimizer state crosses rounds). ``max_grad_norm``: clip the step's gradient norm."""

    kind: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    groups: tuple[ParamGroup, ...] = ()
    max_grad_norm: float | None = None


@dataclass(frozen=True)
class ParamLayout:
    """Which state tensors train, travel and stay on the client (the picklable part of a model).

    ``groups`` holds named subsets an algorithm adds (e.g. FedSDG's ``gates``)."""

    trainable: tuple[str, ...]
    shared: tuple[str, ...]
    private: tuple[str, ...]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientJob:
    """One client's local training this round: what it received, its private state, its seed."""

    client_id: int
    round: int
    seed: int
    received: Tensors
    private: Tensors
    max_steps: int | None = None  # partial work (--deadline-policy partial): at most this many local steps
    # --dp sample: DP-SGD's clip and noise in the batch loop (``engine.privacy.SampleLevelDP``),
    # given by the round loop with each job (the client program is the plugin's: never written to)
    sample_privacy: Any = None


@dataclass
class ClientUpdate:
    client_id: int
    num_samples: int
    params: Tensors  # exactly what the client uploaded (counted in bytes_up)
    loss_terms: dict[str, float]  # mean over local steps of each named term (unweighted)
    loss: float = float("nan")  # mean over local steps of the minimised (weighted) total
    private: Tensors = field(default_factory=dict)  # the client's private state after training
    local_steps: int | None = None  # optimizer steps the engine's batch loop took (None: not counted)


@dataclass(frozen=True)
class EvalJob:
    """Evaluate the model ``state`` (loaded over the initial model) on ``client_ids``' ``split``
    splits: ``test`` (default) or ``val`` (``FederatedData.eval_indices``)."""

    state: Tensors
    client_ids: tuple[int, ...]
    split: str = "test"


def tensor_bytes(tensors: Tensors) -> int:
    """Bytes on the wire: Σ numel × element size."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weighted_average(updates: list[Tensors], weights: Iterable[float]) -> Tensors:
    """Σ_k w_k · params_k per tensor (the weights are used as given), using foreach kernels."""
    weights = list(weights)
    names = list(updates[0])
    total = [torch.zeros_like(updates[0][n]) for n in names]
    for update, weight in zip(updates, weights):
        torch._foreach_add_(total, [update[n] for n in names], alpha=weight)
    return dict(zip(names, total))


def sample_weights(updates: list[ClientUpdate]) -> list[float]:
    """n_k / Σ n over the updates."""
    total = sum(u.num_samples for u in updates)
    return [u.num_samples / total for u in updates]


@torch.no_grad()
def load_into(target: Tensors, source: Tensors) -> None:
    """Copy ``source``'s tensors into ``target``'s tensors of the same names, in place."""
    if source:
        torch._foreach_copy_([target[n] for n in source], list(source.values()))


def clone_tensors(tensors: Tensors) -> Tensors:
    return {n: t.detach().clone() for n, t in tensors.items()}
