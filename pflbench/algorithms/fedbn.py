"""FedBN — Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021 (arXiv:2102.07623).

Every BatchNorm layer stays on its client: its affine weight γ and bias β *and* its running
statistics (running_mean, running_var) are private and never travel. Everything else is FedAvg:
w ← Σ_k n_k·w_k / Σ_k n_k over the non-BN tensors.

State: shared (uploaded, averaged, counted in bytes_up and bytes_down) = every tensor outside a
BatchNorm layer; private (the ClientStateStore, never counted) = the BN tensors. A client that
has never trained evaluates with the initial BN (γ = 1, β = 0, mean 0, var 1). BN's integer
``num_batches_tracked`` counter is not state the engine moves (it only matters for
``momentum=None`` BN, which the zoo does not use).

Evaluation: each client with the current shared weights and its own BN layers. There is no
global model (a model without its BN statistics has no accuracy of its own), so global_acc is
null. A model without BatchNorm layers is refused (ConfigError): FedBN on it would silently be
FedAvg. Use ``--model cnn_bn`` (or a timm model with BN, e.g. resnet18).

Hyperparameters: none of its own (the run's local settings apply).

New clients (``--new-clients``): the shared weights (frozen) with fresh BatchNorm layers (γ = 1,
β = 0, fresh statistics) trained on the client's train split for ``--local-epochs`` epochs, the
running statistics updated as in training (``Algorithm``'s default: the private part is BN).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pflbench import Algorithm, Capabilities, ConfigError, RunConfig, register_algorithm


def batchnorm_state_names(model: nn.Module) -> set[str]:
    """Names of every parameter and buffer of the model's BatchNorm layers (1d/2d/3d, sync)."""
    names: set[str] = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            prefix = f"{module_name}." if module_name else ""
            names.update(prefix + n for n, _ in module.named_parameters(recurse=False))
            names.update(prefix + n for n, _ in module.named_buffers(recurse=False))
    return names


def require_batchnorm(model: nn.Module) -> set[str]:
    names = batchnorm_state_names(model)
    if not names:
        raise ConfigError(
            "fedbn keeps the BatchNorm layers local, but this model has none (FedBN "
            "would silently be FedAvg); use a model with BatchNorm, e.g. --model cnn_bn"
        )
    return names


@register_algorithm("fedbn")
class FedBN(Algorithm):
    """FedAvg on everything but the BatchNorm layers, which stay local (incl. running stats)."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedBN"
    paper = "Li et al., ICLR 2021"
    method_family = "decoupling"
    has_global_model = False  # the shared weights need a client's BN layers to predict

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: Any) -> dict[str, Any]:
        record = super().configure_model(model, config, hparams)
        require_batchnorm(model)  # refused before any training (and before pretraining)
        return record

    def select_shared(self, names: list[str]) -> list[str]:
        local = require_batchnorm(self.model)
        return [name for name in names if name not in local]
