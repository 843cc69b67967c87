"""MOON — Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021 (arXiv:2103.16257).

FedAvg plus a model-contrastive term in every local loss:

    ℓ = CE(w; x, y) + μ·ℓ_con,
    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )

with sim the cosine similarity and z, z_glob, z_prev the representation of x under the model
being trained, the received global model and the client's previous local model
(``contrastive_loss``; mean over the batch). z_glob and z_prev are constants (no gradient).
``--mu`` μ defaults to 1 (the paper uses μ = 1 on CIFAR-100 / Tiny-ImageNet and 5 on CIFAR-10);
``--temperature`` τ = 0.5 (the paper's).

Representation: the paper's network is base encoder → projection head (a 2-layer MLP) → output
layer, with z the projection head's output. pflbench adds no layers: z is the input of the
model's final classifier layer (the last entry of ``layer_order``), i.e. the layers below the
classifier act as encoder + projection head. For the zoo CNN (conv, conv, fc 256, fc 128,
classifier) this is the paper's layout; the same model is then compared across algorithms.

State and bytes: like FedAvg, the full model travels both ways (counted). Each client's previous
local model (every model tensor after its last local training) is extra private state in the
ClientStateStore (``moon.prev.<name>``); a client with no previous model yet (its first round)
uses the received global model, so ℓ_con = log 2 with zero gradient. Evaluation: the global
model on every client (MOON's paper evaluates the global model).

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    Choice,
    ClientProgram,
    ConfigError,
    Dimension,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import standard_local_update
from pflbench.models.zoo import head_module_names

PREVIOUS = "moon.prev."  # the client's last local model, private


def contrastive_loss(
    z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Mean over the batch of −log(e^{s_g/τ} / (e^{s_g/τ} + e^{s_p/τ})), s = cosine similarity
    of the flattened representations."""
    positive = F.cosine_similarity(z.flatten(1), z_global.flatten(1), dim=1) / temperature
    negative = F.cosine_similarity(z.flatten(1), z_previous.flatten(1), dim=1) / temperature
    return (torch.logsumexp(torch.stack([positive, negative]), dim=0) - positive).mean()


@dataclass(frozen=True)
class MoonHyperparameters:
    mu: float = option(
        1.0, "Weight μ of the model-contrastive loss (the paper: 1 on CIFAR-100 and Tiny-ImageNet, 5 on CIFAR-10)."
    )
    temperature: float = option(0.5, "Temperature τ of the model-contrastive loss (the paper's 0.5).")

    def validate(self) -> None:
        if not self.mu >= 0:
            raise ConfigError(f"--mu must be ≥ 0, got {self.mu}")
        if not self.temperature > 0:
            raise ConfigError(f"--temperature must be > 0, got {self.temperature}")


class MoonProgram(ClientProgram[MoonHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the classifier layer whose input is the representation (make_program)
    # per-job (set on a copy in local_update): the two reference models and the captured inputs
    reference_models: tuple[Tensors, Tensors] = ({}, {})
    captured: list[torch.Tensor] | None = None

    def __init__(self, layout, hparams, local) -> None:
        super().__init__(layout, hparams, local)
        self.loss_weights = {"contrastive": hparams.mu}

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        return {n: t for n, t in {**received, **private}.items() if not n.startswith(PREVIOUS)}

    def representation(self, forward, params: Tensors, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, z): the model's output and the input of its classifier layer."""
        logits = forward(params, inputs)
        return logits, self.captured.pop()

    def loss_terms(self, forward, params, inputs, targets, received):
        logits, z = self.representation(forward, params, inputs)
        global_model, previous_model = self.reference_models
        with torch.no_grad():
            _, z_global = self.representation(forward, global_model, inputs)
            _, z_previous = self.representation(forward, previous_model, inputs)
        return {
            "task": F.cross_entropy(logits, targets),
            "contrastive": contrastive_loss(z, z_global, z_previous, self.hparams.temperature),
        }

    def local_update(self, trainer) -> LocalResult:
        """The engine's batch loop on a per-job copy that sees the classifier's input (a forward
        pre-hook) and the two reference models (copies: BatchNorm in train mode updates the
        running statistics of the tensors it is given, never the server's)."""
        received, private = trainer.job.received, trainer.job.private
        names = self.layout.shared + self.layout.private
        global_model = {n: received[n].detach().clone() for n in self.layout.shared}
        global_model.update({n: private[n].detach().clone() for n in self.layout.private})
        if all(PREVIOUS + n in private for n in names):
            previous_model = {n: private[PREVIOUS + n].clone() for n in names}
        else:  # no previous local model yet: the global one
            previous_model = {n: t.clone() for n, t in global_model.items()}
        job_program = copy.copy(self)
        job_program.reference_models = (global_model, previous_model)
        job_program.captured = []
        head = trainer.model.get_submodule(self.head_module)
        handle = head.register_forward_pre_hook(lambda module, args: job_program.captured.append(args[0]))
        try:
            result = standard_local_update(job_program, trainer)
        finally:
            handle.remove()
        state = trainer.state
        result.private = {n: state[n].detach().clone() for n in self.layout.private}
        result.private.update({PREVIOUS + n: state[n].detach().clone() for n in names})
        return result


@register_algorithm("moon")
class Moon(Algorithm[MoonHyperparameters]):
    """FedAvg with a model-contrastive loss against the global and the previous local model."""

    capabilities = Capabilities.of_defaults()

    display_name = "MOON"
    paper = "Li et al., CVPR 2021"
    method_family = "global"
    hyperparameters = MoonHyperparameters
    program_class = MoonProgram

    @classmethod
    def search_space(cls, config: RunConfig, hparams: MoonHyperparameters) -> dict[str, Dimension]:
        """lr around its default, and μ over the grid the paper tunes it on, {0.1, 1, 5, 10}."""
        return {**super().search_space(config, hparams), "mu": Choice((0.1, 1.0, 5.0, 10.0))}

    personal_model_is_received = True  # the previous local model only shapes training

    def __init__(self, config: RunConfig, hparams: MoonHyperparameters, model: nn.Module, num_train: list[int]) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)

    def make_program(self) -> MoonProgram:
        program = super().make_program()
        program.head_module = self.head_module
        return program

    def run_info(self) -> dict[str, Any]:
        return {"moon_representation": f"input of {self.head_module}"}
