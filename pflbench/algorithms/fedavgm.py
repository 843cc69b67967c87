"""FedAvgM — Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution for
Federated Visual Classification", arXiv:1909.06335 (2019); also the SGD-with-momentum server of
Reddi et al., "Adaptive Federated Optimization", ICLR 2021.

Clients train exactly as in FedAvg and upload their model w_k. With the round's average update
Δ = Σ_k p_k·(w_k − w) = w̄ − w (w̄ = Σ_k p_k·w_k, p_k = n_k/Σ n), the server keeps a momentum
buffer v (v⁰ = 0) and steps

    v ← β·v + Δ,        w ← w + η·v                                   (``momentum_step``)

β = ``--server-momentum``, η = ``--server-lr``. Hsu et al. write it with the opposite sign
(Δw = w − w̄, w ← w − η·v): the same update. β = 0, η = 1 is FedAvg, exactly: the new model
is computed as w̄ + (η·v − Δ) (= w + η·v), which for β = 0, η = 1 is w̄ plus an exact zero, so
the numbers are FedAvg's bit for bit (tested).

Choices the paper leaves open, and ours:

- **Defaults β = 0.9, η = 1.** Hsu et al.'s algorithm box steps with η = 1 and their sweeps vary
  β ∈ {0, 0.7, 0.9, 0.97, 0.99, 0.997} and η, reading the results by the effective rate
  η/(1 − β); β = 0.9 is the value Reddi et al. use for FedAvgM. With η = 1 the effective rate
  is 10. On digits (10 clients, α 0.5, 10 rounds, mlp, local SGD lr 0.1, seed 0) it does not
  diverge: train loss 0.41 after 10 rounds against FedAvg's 0.78, global accuracy 0.843 against
  0.865 (its loss still oscillates); lower ``--server-lr`` for larger local steps.
- **Weights p_k**: by samples (FedAvg's, Hsu et al.'s); ``--server-weighting uniform`` gives 1/|S|.
- **Float buffers** (BatchNorm statistics) have no gradient: they are averaged (FedAvg).
- **Nesterov**: not used (neither paper uses it).

State and bytes: as FedAvg (a model down, a model up per client); v stays on the server and is
saved in checkpoints (``checkpoint_attributes``). ``pflbench tune`` adds η over the
half-decade grid 10^-3 … 10^1 of Reddi et al.'s Appendix D (``search_space``).
``algorithms/example_server_state.py`` is the same method written as a minimal teaching plugin.

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pflbench import Capabilities, RunConfig, Tensors, option, register_algorithm
from pflbench.algorithms.fedadam import ServerOptimizerAlgorithm, check_server_settings


def momentum_step(
    model: torch.Tensor, average: torch.Tensor, velocity: torch.Tensor, momentum: float, lr: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(new model, new v): Δ = w̄ − w, v ← β·v + Δ, w ← w + η·v, computed as w̄ + (η·v − Δ) so
    that β = 0, η = 1 returns w̄ exactly (FedAvg)."""
    delta = average - model
    velocity = momentum * velocity + delta
    return average + (lr * velocity - delta), velocity


@dataclass(frozen=True)
class FedAvgMHyperparameters:
    server_momentum: float = option(0.9, "β of the server's momentum v ← β·v + Δ (Δ = w_avg − w).")
    server_lr: float = option(1.0, "η of the server step w ← w + η·v (η = 1, β = 0: FedAvg).")
    server_weighting: str = option(
        "samples",
        "Weights of the pseudo-gradient Δ = Σ p_k (w_k − w): samples (p_k ∝ n_k) or uniform (1/|S|).",
        choices=("samples", "uniform"),  # WEIGHTINGS, as a literal: `--help` reads it without torch
    )

    def validate(self) -> None:
        check_server_settings(self.server_lr, self.server_weighting, server_momentum=self.server_momentum)


@register_algorithm("fedavgm")
class FedAvgM(ServerOptimizerAlgorithm):
    """FedAvg with server momentum on the averaged update."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "FedAvgM"
    paper = "Hsu et al., arXiv:1909.06335"
    method_family = "global"
    hyperparameters = FedAvgMHyperparameters
    checkpoint_attributes = ("velocity",)  # the server's momentum buffer (checkpoints)

    def __init__(
        self, config: RunConfig, hparams: FedAvgMHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        super().__init__(config, hparams, model, num_train)
        self.velocity = {n: torch.zeros_like(self.global_state[n]) for n in self.optimized()}  # v⁰ = 0

    def server_step(self, average: Tensors) -> None:
        for name, mean in average.items():
            model = self.global_state[name]
            if name not in self.velocity:
                model.copy_(mean)  # a float buffer: averaged
                continue
            new_model, velocity = momentum_step(
                model, mean, self.velocity[name], self.hparams.server_momentum, self.hparams.server_lr
            )
            self.velocity[name].copy_(velocity)
            model.copy_(new_model)
