"""FedProx — Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020
(arXiv:1812.06127).

FedAvg plus the proximal term (μ/2)·‖w_k − w‖² in every local loss; aggregation unchanged.

Defaults: ``--mu`` μ = 0.01, one value of the paper's grid {0.001, 0.01, 0.1, 1} (the paper tunes
μ per data set; which one is this suite's choice).

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pflbench import (
    Capabilities,
    Choice,
    ClientProgram,
    ConfigError,
    Dimension,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.algorithms.fedavg import FedAvg


def proximal_term(params: Tensors, anchor: Tensors, mu: float) -> torch.Tensor:
    """(μ/2)·Σ_name ‖params[name] − anchor[name]‖² over the anchor's tensors."""
    differences = [params[n] - anchor[n] for n in anchor if n in params]  # per tensor: vmap-able
    return 0.5 * mu * sum(d.pow(2).sum() for d in differences)


@dataclass(frozen=True)
class FedProxHyperparameters:
    mu: float = option(0.01, "Proximal coefficient μ (the paper tunes 0.001, 0.01, 0.1, 1).")

    def validate(self) -> None:
        if not (math.isfinite(self.mu) and self.mu >= 0):  # inf: the first local loss is inf
            raise ConfigError(f"--mu must be ≥ 0 (a finite number), got {self.mu}")


class FedProxProgram(ClientProgram[FedProxHyperparameters]):
    capabilities = ProgramCapabilities(batch_loop=True, model_upload=True)

    def loss_terms(self, forward, params, inputs, targets, received):
        terms = super().loss_terms(forward, params, inputs, targets, received)
        terms["proximal"] = proximal_term(params, received, self.hparams.mu)
        return terms


@register_algorithm("fedprox")
class FedProx(FedAvg):
    """FedAvg with (μ/2)·‖w_k − w‖² added to every local loss."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedProx"
    paper = "Li et al., MLSys 2020"
    method_family = "regularization"
    hyperparameters = FedProxHyperparameters
    program_class = FedProxProgram

    @classmethod
    def search_space(cls, config: RunConfig, hparams: FedProxHyperparameters) -> dict[str, Dimension]:
        """lr around its default, and μ over the paper's grid {0.001, 0.01, 0.1, 1}."""
        return {**super().search_space(config, hparams), "mu": Choice((0.001, 0.01, 0.1, 1.0))}
