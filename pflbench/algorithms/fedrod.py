"""FedRoD — Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022 (arXiv:2107.00778).

The model's final classifier layer becomes two heads on the same features z = f(x; θ):
a generic head h_G(z; ψ) and a personalized head h_P(z; φ_k). Locally, per batch:

- body θ and generic head ψ minimise the balanced softmax (BSM) loss with the client's train
  label counts n_{k,c}:  ℓ_BSM = −log( n_{k,y}·e^{g_y} / Σ_c n_{k,c}·e^{g_c} )
  = CE(g + log n_k, y), g = h_G(z) (``balanced_softmax_loss``; a class the client lacks gets
  probability 0);
- the personalized head φ_k minimises the plain CE of the personalized prediction
  g + h_P(z), with z and g treated as constants (the paper's decoupled training: the personal
  loss trains only the P-head, on the detached features of the shared body).

The two losses touch disjoint parameters, so one optimizer step on their sum is exactly the two
separate steps (SGD and Adam alike). θ and ψ are averaged FedAvg-style (sample-weighted).

Personalized prediction: g + h_P(z) (body + generic head from the server, own P-head). Global
model: body + generic head. The P-head is initialised to zero, so the personalized prediction
starts as the generic one and the global model is the same module with h_P = 0.

State and bytes: body and generic head travel (counted); the P-head is private (ClientStateStore,
never counted). No hyperparameters of its own; the head is the model's final layer (it must be an
``nn.Linear``), so ``--head-layers`` other than 1 is refused.

New clients (``--new-clients``): body and generic head from the server (frozen) with a fresh
(zero) P-head trained on the client's train split for ``--local-epochs`` epochs with the CE of
g + h_P(z) — the personal loss of local training, which moves only the P-head (``Algorithm``'s
default). Before that training the prediction is the generic one (the paper's answer for new
clients).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    register_algorithm,
)
from pflbench.engine import standard_local_update
from pflbench.models.zoo import head_module_names


def balanced_softmax_loss(logits: torch.Tensor, targets: torch.Tensor, label_counts: torch.Tensor) -> torch.Tensor:
    """Mean of −log(n_y·e^{g_y} / Σ_c n_c·e^{g_c}) = CE(g + log n, y) (log 0 = −∞: p = 0)."""
    return F.cross_entropy(logits + label_counts.to(logits.dtype).log(), targets)


class TwoHeads(nn.Module):
    """Generic head (the model's classifier, shared) + personalized head (same shape, private,
    zero init) on the same features; returns g + h_P(z.detach()) and attaches (g, p)."""

    def __init__(self, generic: nn.Linear) -> None:
        super().__init__()
        self.generic = generic
        self.personal = nn.Linear(
            generic.in_features,
            generic.out_features,
            bias=generic.bias is not None,
            device=generic.weight.device,
            dtype=generic.weight.dtype,
        )
        with torch.no_grad():
            for tensor in self.personal.parameters():
                tensor.zero_()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        generic = self.generic(features)
        personal = self.personal(features.detach())
        output = generic + personal
        output.fedrod_heads = (generic, personal)  # read by the loss; the model returns it as is
        return output


class FedRoDProgram(ClientProgram):
    capabilities = ProgramCapabilities(model_upload=True)
    label_counts: torch.Tensor | None = None  # this job's n_{k,c} (set on a per-job copy)

    def loss_terms(self, forward, params, inputs, targets, received):
        output = forward(params, inputs)
        heads = getattr(output, "fedrod_heads", None)
        if heads is None:
            raise ConfigError("fedrod: the model's output is not its final layer's output")
        generic, personal = heads
        return {
            "generic_bsm": balanced_softmax_loss(generic, targets, self.label_counts),
            "personal_ce": F.cross_entropy(generic.detach() + personal, targets),
        }

    def local_update(self, trainer) -> LocalResult:
        """The engine's batch loop on a per-job copy holding the client's train label counts."""
        data, client = trainer.data, trainer.job.client_id
        job_program = copy.copy(self)
        job_program.label_counts = torch.bincount(data.labels[data.train_indices[client]], minlength=data.num_classes)
        return standard_local_update(job_program, trainer)


@register_algorithm("fedrod")
class FedRoD(Algorithm):
    """Shared body + generic head (balanced softmax), private personalized head (CE)."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedRoD"
    paper = "Chen & Chao, ICLR 2022"
    method_family = "decoupling"
    program_class = FedRoDProgram

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"fedrod's heads replace the final layer; --head-layers "
                f"{config.head_layers} would be ignored (leave it at 1)"
            )

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: Any) -> dict[str, Any]:
        record = super().configure_model(model, config, hparams)
        name = head_module_names(model, 1)[0]
        head = model.get_submodule(name)
        if not isinstance(head, nn.Linear):
            raise ConfigError(f"fedrod needs a linear final layer, {name!r} is a {type(head).__name__}")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, TwoHeads(head))
        return {**record, "fedrod_heads": f"{name}.generic (shared), {name}.personal (private)"}

    def select_shared(self, names: list[str]) -> list[str]:
        personal = f"{head_module_names(self.model, 1)[0]}.personal."
        if not any(name.startswith(personal) for name in names):
            raise ConfigError("fedrod: the model has no personalized head (configure_model not applied)")
        return [name for name in names if not name.startswith(personal)]

    def global_model(self) -> Tensors:
        """Body + generic head: the model with h_P = 0."""
        private = set(self.layout.private)
        return {n: torch.zeros_like(t) if n in private else t for n, t in super().global_model().items()}
