"""FedAdagrad — Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (arXiv:2003.00295).

FedAdam with Adagrad's second moment: with Δ = Σ_k p_k·(w_k − w),

    m ← β₁·m + (1 − β₁)·Δ,   v ← v + Δ²,   w ← w + η·m / (√v + τ)

(m⁰ = 0, v⁰ = τ²). v only grows, so every coordinate's step size η/(√v + τ) shrinks over the
rounds. Algorithm 2 writes the momentum m for all three optimizers; Adagrad has none, and
Flower's reproduction of the paper runs FedAdagrad with β₁ = 0 (m = Δ): our default, with
``--server-beta1`` to add momentum. There is no β₂. Defaults η = 10^-1 and τ = 10^-2 are that
reproduction's CIFAR-10 values; the rest — the weights p_k, no bias correction,
averaged float buffers, state and bytes — is FedAdam's: see ``pflbench/algorithms/fedadam.py``.

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

from dataclasses import dataclass

from pflbench import Capabilities, ConfigError, option, register_algorithm
from pflbench.algorithms.fedadam import (
    AdaptiveServerOptimizer,
    adagrad_second_moment,
    check_server_settings,
)


@dataclass(frozen=True)
class FedAdagradHyperparameters:
    server_lr: float = option(1e-1, "η of the server step w ← w + η·m/(√v + τ).")
    server_beta1: float = option(0.0, "β₁ of the server's first moment m ← β₁·m + (1 − β₁)·Δ.")
    server_tau: float = option(1e-2, "τ, the adaptivity: w ← w + η·m/(√v + τ); v starts at τ².")
    server_weighting: str = option(
        "samples",
        "Weights of the pseudo-gradient Δ = Σ p_k (w_k − w): samples (p_k ∝ n_k) or uniform (1/|S|).",
        choices=("samples", "uniform"),  # WEIGHTINGS, as a literal: `--help` reads it without torch
    )

    def validate(self) -> None:
        check_server_settings(self.server_lr, self.server_weighting, server_beta1=self.server_beta1)
        if not self.server_tau > 0:
            raise ConfigError(f"--server-tau must be > 0, got {self.server_tau}")


@register_algorithm("fedadagrad")
class FedAdagrad(AdaptiveServerOptimizer):
    """FedAvg's clients; the server takes an Adagrad step on the averaged update."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "FedAdagrad"
    paper = "Reddi et al., ICLR 2021"
    method_family = "global"
    hyperparameters = FedAdagradHyperparameters
    second_moment = staticmethod(adagrad_second_moment)
