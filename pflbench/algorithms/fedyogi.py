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

from pflbench import register_algorithm
from pflbench.algorithms.fedadam import AdaptiveServerOptimizer, FedAdamHyperparameters, yogi_second_moment


@dataclass(frozen=True)
class FedYogiHyperparameters(FedAdamHyperparameters):
    """FedAdam's options and defaults (η = 10^-2, β₁ = 0.9, β₂ = 0.99, τ = 10^-3)."""


@register_algorithm("fedyogi")
class FedYogi(AdaptiveServerOptimizer):
    """FedAvg's clients; the server takes a Yogi step on the averaged update."""

    display_name = "FedYogi"
    paper = "Reddi et al., ICLR 2021"
    method_family = "global"
    hyperparameters = FedYogiHyperparameters
    second_moment = staticmethod(yogi_second_moment)
