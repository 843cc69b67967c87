"""FedYogi — Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (arXiv:2003.00295).

FedAdam with Yogi's second moment (Zaheer et al., NeurIPS 2018): with Δ = Σ_k p_k·(w_k − w),

    m ← β₁·m + (1 − β₁)·Δ,   v ← v − (1 − β₂)·Δ²·sign(v − Δ²),   w ← w + η·m / (√v + τ)

(m⁰ = 0, v⁰ = τ²). Adam's v forgets geometrically (v ← β₂·v + (1 − β₂)·Δ²); Yogi's moves towards
Δ² by the additive amount (1 − β₂)·Δ², so the effective learning rate η/(√v + τ) changes more
slowly when an update is much larger than the past ones. Everything else — the weights p_k,
v⁰ = τ², no bias correction, the averaged float buffers, the defaults (β₁ = 0.9, β₂ = 0.99,
τ = 10^-3, η = 10^-2), state and bytes — is FedAdam's: see
``pflbench/algorithms/fedadam.py``.

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

from dataclasses import dataclass

from pflbench import Capabilities, option, register_algorithm
from pflbench.algorithms.fedadam import AdaptiveServerOptimizer, FedAdamHyperparameters, yogi_second_moment


@dataclass(frozen=True)
class FedYogiHyperparameters:
    """FedAdam's options and defaults (η = 10^-2, β₁ = 0.9, β₂ = 0.99, τ = 10^-3), written out
    (not subclassed) so that `pflbench run --help` reads them from this file without torch."""

    server_lr: float = option(1e-2, "η of the server step w ← w + η·m/(√v + τ).")
    server_beta1: float = option(0.9, "β₁ of the server's first moment m ← β₁·m + (1 − β₁)·Δ.")
    server_beta2: float = option(0.99, "β₂ of the server's second moment v (FedAdam, FedYogi).")
    server_tau: float = option(1e-3, "τ, the adaptivity: w ← w + η·m/(√v + τ); v starts at τ².")
    server_weighting: str = option(
        "samples",
        "Weights of the pseudo-gradient Δ = Σ p_k (w_k − w): samples (p_k ∝ n_k) or uniform (1/|S|).",
        choices=("samples", "uniform"),
    )

    def validate(self) -> None:
        FedAdamHyperparameters.validate(self)  # type: ignore[arg-type]  # the same fields


@register_algorithm("fedyogi")
class FedYogi(AdaptiveServerOptimizer):
    """FedAvg's clients; the server takes a Yogi step on the averaged update."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "FedYogi"
    paper = "Reddi et al., ICLR 2021"
    method_family = "global"
    hyperparameters = FedYogiHyperparameters
    second_moment = staticmethod(yogi_second_moment)
