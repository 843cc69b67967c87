"""FedAdam — Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295). This module also holds what FedAdam, FedYogi and
FedAdagrad share (the pure update rules and ``AdaptiveServerOptimizer``); ``fedyogi.py`` and
``fedadagrad.py`` only pick the second-moment rule and their defaults.

Clients train exactly as in FedAvg (the run's local optimizer, ``--local-epochs``) and upload
their model w_k. The server treats the averaged change as a pseudo-gradient and takes one step of
an adaptive optimizer on it (the paper's Algorithm 2, FedOpt with an adaptive SERVEROPT):

    Δ = Σ_k p_k·(w_k − w) = w̄ − w                                   (``AverageThenStep``: w̄)
    m ← β₁·m + (1 − β₁)·Δ                                           (``first_moment``)
    v ← v + Δ²                                   FedAdagrad         (``adagrad_second_moment``)
    v ← β₂·v + (1 − β₂)·Δ²                       FedAdam            (``adam_second_moment``)
    v ← v − (1 − β₂)·Δ²·sign(v − Δ²)             FedYogi            (``yogi_second_moment``)
    w ← w + η·m / (√v + τ)                                          (``adaptive_step``)

element-wise, with m⁰ = 0 and v⁰ = τ² (Algorithm 2 asks v₋₁ ≥ τ²; τ² is its smallest value).

Choices the paper leaves open, and ours:

- **Weights p_k.** Algorithm 1 averages uniformly over the round's clients (Δ = (1/|S|)·Σ Δ_k);
  the authors' experiment code (google-research/federated, ``optimization/shared/
  fed_avg_schedule.py``) weights each client's change by the number of examples it processed
  (n_k × epochs; Flower's reproduction weights by n_k). Default ``--server-weighting samples``
  (p_k = n_k/Σ n over the round's clients: FedAvg's weights, so that FedAvgM with β = 0, η = 1
  is FedAvg), ``uniform`` gives Algorithm 1's 1/|S|.
- **No bias correction.** Algorithm 2 has none; neither do we. The authors' code steps the server
  with Keras' optimizers, whose Adam does correct the bias (its step is scaled by
  √(1 − β₂ᵗ)/(1 − β₁ᵗ), and τ plays Keras' ε): a difference in the first rounds only.
- **v⁰ = τ²** (see above). An implementation starting from v⁰ = 0 differs by τ² (1e-6 at τ = 1e-3).
- **Float buffers** (BatchNorm statistics) have no gradient: they are averaged (FedAvg), the
  optimizer steps only the trainable tensors.
- **Defaults.** β₁ = 0.9 and β₂ = 0.99 (the paper's experiments, Section 5); the best τ and η
  depend on the task (its Appendix D grids: η over half-decades 10^-3 … 10^1, τ over 10^-10 …
  10^-1). FedAdam and FedYogi default to η = 10^-2, τ = 10^-3, FedAdagrad to η = 10^-1,
  τ = 10^-2 with β₁ = 0 (no momentum): the CIFAR-10 values of Flower's reproduction of the
  paper's experiments (``baselines/.../adaptive_federated_optimization/conf/cifar10``; it has no
  FedYogi CIFAR-10 file, and on CIFAR-100 gives FedAdam and FedYogi the same η = 1, τ = 10^-1:
  the best η spans decades across tasks, tune it). On digits (10 clients, α 0.5, 10 rounds, mlp, local
  SGD lr 0.1, seed 0) none of the three diverges at these defaults: global accuracy after 10
  rounds FedAdam 0.867, FedYogi 0.867, FedAdagrad 0.717 (FedAvg 0.865).

State and bytes: clients receive w and upload w_k, as in FedAvg (bytes up and down are a model
each); m and v never leave the server and are saved in checkpoints (``checkpoint_attributes``).
The round's average is folded in as each upload arrives (``streaming_aggregate``), so the server
holds one model's worth of uploads, like FedAvg. ``pflbench tune`` adds η to the local lr
(``search_space``: the paper's half-decade grid 10^-3 … 10^1).

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    Choice,
    ClientUpdate,
    ConfigError,
    Dimension,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine.streaming import StreamingWeightedAverage

WEIGHTINGS = ("samples", "uniform")


# ---- the pure update rules (one tensor at a time) ---------------------------------------------
def first_moment(m: torch.Tensor, delta: torch.Tensor, beta1: float) -> torch.Tensor:
    """m ← β₁·m + (1 − β₁)·Δ."""
    return beta1 * m + (1 - beta1) * delta


def adagrad_second_moment(v: torch.Tensor, delta: torch.Tensor, beta2: float) -> torch.Tensor:
    """v ← v + Δ² (``beta2`` unused: Adagrad accumulates)."""
    return v + delta.square()


def adam_second_moment(v: torch.Tensor, delta: torch.Tensor, beta2: float) -> torch.Tensor:
    """v ← β₂·v + (1 − β₂)·Δ²."""
    return beta2 * v + (1 - beta2) * delta.square()


def yogi_second_moment(v: torch.Tensor, delta: torch.Tensor, beta2: float) -> torch.Tensor:
    """v ← v − (1 − β₂)·Δ²·sign(v − Δ²): v moves towards Δ² by an additive (1 − β₂)·Δ²."""
    squared = delta.square()
    return v - (1 - beta2) * squared * torch.sign(v - squared)


def adaptive_step(model: torch.Tensor, m: torch.Tensor, v: torch.Tensor, lr: float, tau: float) -> torch.Tensor:
    """w + η·m / (√v + τ)."""
    return model + lr * m / (v.sqrt() + tau)


# ---- the round's average, folded in as uploads arrive -----------------------------------------
class AverageThenStep(StreamingWeightedAverage):
    """Σ_k p_k·w_k over the uploads added (p_k = n_k/Σ n, or 1/|S| for ``uniform``), in arrival order
    with ``weighted_average``'s kernels (FedAvg's stream); ``finish`` hands the average to ``step``
    (nothing when no update arrived, so the model stays as it is)."""

    def __init__(self, num_samples: list[int], weighting: str, step: Callable[[Tensors], None]) -> None:
        super().__init__({}, sum(num_samples))
        self.count, self.weighting, self.step = len(num_samples), weighting, step

    def weight(self, update: ClientUpdate) -> float:
        return 1 / self.count if self.weighting == "uniform" else update.num_samples / self.total_samples

    def add(self, update: ClientUpdate) -> None:
        if self.names is None:
            self.names = list(update.params)
            self.sum = [torch.zeros_like(update.params[n]) for n in self.names]
        if self.names:
            torch._foreach_add_(self.sum, [update.params[n] for n in self.names], alpha=self.weight(update))

    def finish(self) -> None:
        if self.names:
            self.step(dict(zip(self.names, self.sum)))
        self.sum = []


def check_server_settings(lr: float, weighting: str, **betas: float) -> None:
    """ConfigError (one line) for a server lr ≤ 0, a β outside [0, 1) or an unknown weighting."""
    if not (math.isfinite(lr) and lr > 0):  # inf: the first server step makes every weight inf
        raise ConfigError(f"--server-lr must be a finite number > 0, got {lr}")
    for name, beta in betas.items():
        if not 0 <= beta < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1), got {beta}")
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"--server-weighting {weighting!r} is not one of {', '.join(WEIGHTINGS)}")


# The paper's server learning rate grid (Appendix D): half-decades from 10^-3 to 10^1.
SERVER_LR_GRID = tuple(round(10 ** (k / 2), 6) for k in range(-6, 3))


class ServerOptimizerAlgorithm(Algorithm):
    """FedAvg's clients; the server steps its model with the round's average update Δ.

    Subclasses implement ``server_step(average)`` (w̄, the weighted average of the uploads, for each
    uploaded tensor) and name their state in ``checkpoint_attributes``. Not registered itself."""

    method_family = "global"

    @property
    def weighting(self) -> str:
        return self.hparams.server_weighting

    def optimized(self) -> list[str]:
        """The tensors the server optimizer steps: the shared trainable ones (buffers are averaged)."""
        trainable = set(self.layout.trainable)
        return [n for n in self.global_state if n in trainable]

    def streaming_aggregate(self, num_samples: list[int]) -> AverageThenStep:
        return AverageThenStep(num_samples, self.weighting, self.server_step)

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """The list version of the stream (same order, same kernels: the same numbers)."""
        stream = self.streaming_aggregate([u.num_samples for u in updates])
        for update in updates:
            stream.add(update)
        stream.finish()

    def server_step(self, average: Tensors) -> None:
        raise NotImplementedError

    @classmethod
    def search_space(cls, config: RunConfig, hparams: Any) -> dict[str, Dimension]:
        """lr around its default, and the server lr η over the paper's grid (10^-3 … 10^1)."""
        return {**super().search_space(config, hparams), "server_lr": Choice(SERVER_LR_GRID)}


class AdaptiveServerOptimizer(ServerOptimizerAlgorithm):
    """FedOpt with an adaptive server optimizer; ``second_moment`` picks Adagrad, Adam or Yogi."""

    checkpoint_attributes = ("first_moment_state", "second_moment_state")  # m and v (checkpoints)

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module, num_train: list[int]) -> None:
        super().__init__(config, hparams, model, num_train)
        tau = hparams.server_tau
        names = self.optimized()
        self.first_moment_state = {n: torch.zeros_like(self.global_state[n]) for n in names}  # m⁰ = 0
        self.second_moment_state = {n: torch.full_like(self.global_state[n], tau**2) for n in names}  # v⁰ = τ²

    def server_step(self, average: Tensors) -> None:
        hp = self.hparams
        beta2 = getattr(hp, "server_beta2", 0.0)  # FedAdagrad has no β₂
        for name, mean in average.items():
            model = self.global_state[name]
            if name not in self.first_moment_state:
                model.copy_(mean)  # a float buffer: averaged
                continue
            delta = mean - model  # Σ p_k·(w_k − w) = w̄ − w, as Σ p_k = 1
            m = first_moment(self.first_moment_state[name], delta, hp.server_beta1)
            v = type(self).second_moment(self.second_moment_state[name], delta, beta2)
            self.first_moment_state[name].copy_(m)
            self.second_moment_state[name].copy_(v)
            model.copy_(adaptive_step(model, m, v, hp.server_lr, hp.server_tau))

    @staticmethod
    def second_moment(v: torch.Tensor, delta: torch.Tensor, beta2: float) -> torch.Tensor:
        """v's update: Adagrad, Adam or Yogi (set by each subclass)."""
        raise NotImplementedError


@dataclass(frozen=True)
class FedAdamHyperparameters:
    server_lr: float = option(1e-2, "η of the server step w ← w + η·m/(√v + τ).")
    server_beta1: float = option(0.9, "β₁ of the server's first moment m ← β₁·m + (1 − β₁)·Δ.")
    server_beta2: float = option(0.99, "β₂ of the server's second moment v (FedAdam, FedYogi).")
    server_tau: float = option(1e-3, "τ, the adaptivity: w ← w + η·m/(√v + τ); v starts at τ².")
    server_weighting: str = option(
        "samples",
        "Weights of the pseudo-gradient Δ = Σ p_k (w_k − w): samples (p_k ∝ n_k) or uniform (1/|S|).",
        choices=("samples", "uniform"),  # WEIGHTINGS, as a literal: `--help` reads it without torch
    )

    def validate(self) -> None:
        check_server_settings(
            self.server_lr, self.server_weighting, server_beta1=self.server_beta1, server_beta2=self.server_beta2
        )
        if not self.server_tau > 0:
            raise ConfigError(f"--server-tau must be > 0, got {self.server_tau}")


@register_algorithm("fedadam")
class FedAdam(AdaptiveServerOptimizer):
    """FedAvg's clients; the server takes an Adam step (no bias correction) on the averaged update."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "FedAdam"
    paper = "Reddi et al., ICLR 2021"
    method_family = "global"
    hyperparameters = FedAdamHyperparameters
    second_moment = staticmethod(adam_second_moment)
