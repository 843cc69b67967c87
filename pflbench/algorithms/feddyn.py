"""FedDyn — Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021
(arXiv:2111.04263).

Client k in round t starts from the server model θ^{t−1} and minimises the dynamically
regularised objective

    L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)·‖θ − θ^{t−1}‖²

(loss terms ``task``, ``linear``, ``dynamic``), then updates its first-order state

    ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α·(θ_k^t − θ^{t−1})           (``linear_state_update``)

(init 0). With P_t the round's clients and m the number of all clients that train (new clients,
``--new-clients``, excluded), the server updates

    h^t = h^{t−1} − α·(1/m)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})             (``server_update``, h⁰ = 0)
    θ^t = (1/|P_t|)·Σ_{k∈P_t} θ_k^t − (1/α)·h^t

``--feddyn-alpha`` α (the paper's α; named so because ``--alpha`` is the Dirichlet
concentration) defaults to 0.01, from the paper's grid {0.1, 0.01, 0.001}. Both terms act on the
trainable parameters; float buffers (BatchNorm statistics) are averaged uniformly.

State and bytes: θ travels down and θ_k up (counted; nothing else travels). Each client's
∇L_k (same size as the model) is extra private state in the ClientStateStore
(``feddyn.grad.<param>``); h lives on the server. Evaluation: the server model θ^t on every
client (FedDyn has no personal model).

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    Choice,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    Dimension,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
    weighted_average,
)
from pflbench.engine import standard_local_update

LINEAR = "feddyn.grad."  # ∇L_k(θ_k^{t−1}), private


def linear_term(params: Tensors, coefficients: Tensors) -> torch.Tensor:
    """−Σ_name ⟨coefficients[name], params[name]⟩ (the −⟨∇L_k(θ_k^{t−1}), θ⟩ term)."""
    return -sum((coefficients[n] * params[n]).sum() for n in coefficients)


def dynamic_term(params: Tensors, anchor: Tensors, alpha: float) -> torch.Tensor:
    """(α/2)·Σ_name ‖params[name] − anchor[name]‖² over the anchor's tensors."""
    return 0.5 * alpha * sum((params[n] - anchor[n]).pow(2).sum() for n in anchor)


def linear_state_update(
    gradient: torch.Tensor, local: torch.Tensor, server: torch.Tensor, alpha: float
) -> torch.Tensor:
    """∇L_k ← ∇L_k − α·(θ_k^t − θ^{t−1})."""
    return gradient - alpha * (local - server)


def server_update(
    h: Tensors, previous: Tensors, client_models: list[Tensors], alpha: float, num_clients: int
) -> tuple[Tensors, Tensors]:
    """(h^t, θ^t): h − α·(1/m)·Σ_k (θ_k − θ^{t−1}) and mean_k θ_k − h^t/α."""
    sampled = len(client_models)
    mean = weighted_average(client_models, [1 / sampled] * sampled)
    new_h = {n: h[n] - alpha * (sampled / num_clients) * (mean[n] - previous[n]) for n in h}
    return new_h, {n: mean[n] - new_h[n] / alpha for n in h}


@dataclass(frozen=True)
class FedDynHyperparameters:
    feddyn_alpha: float = option(
        0.01, "FedDyn's α: weight of the dynamic regulariser (the paper searches 0.1, 0.01, 0.001)."
    )

    def validate(self) -> None:
        if not self.feddyn_alpha > 0:
            raise ConfigError(f"--feddyn-alpha must be > 0, got {self.feddyn_alpha}")


class FedDynProgram(ClientProgram[FedDynHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    linear_coefficients: Tensors | None = None  # this job's ∇L_k(θ_k^{t−1}) (set on a per-job copy)

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        return {n: t for n, t in {**received, **private}.items() if not n.startswith(LINEAR)}

    def loss_terms(self, forward, params, inputs, targets, received):
        terms = super().loss_terms(forward, params, inputs, targets, received)
        names = self.layout.groups["regularized"]
        terms["linear"] = linear_term(params, self.linear_coefficients)
        terms["dynamic"] = dynamic_term(params, {n: received[n] for n in names}, self.hparams.feddyn_alpha)
        return terms

    def local_update(self, trainer) -> LocalResult:
        """The engine's batch loop on a per-job copy that holds ∇L_k, then the state update."""
        received, private = trainer.job.received, trainer.job.private
        names = self.layout.groups["regularized"]
        job_program = copy.copy(self)
        job_program.linear_coefficients = {n: private[LINEAR + n] for n in names}
        result = standard_local_update(job_program, trainer)
        state = trainer.state
        result.private = {n: state[n].detach().clone() for n in self.layout.private}
        result.private.update(
            {
                LINEAR + n: linear_state_update(
                    private[LINEAR + n], state[n].detach(), received[n], self.hparams.feddyn_alpha
                )
                for n in names
            }
        )
        return result


@register_algorithm("feddyn")
class FedDyn(Algorithm[FedDynHyperparameters]):
    """Dynamic regularisation: per-client linear term + proximal term, server state h."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "FedDyn"
    paper = "Acar et al., ICLR 2021"
    method_family = "global"
    hyperparameters = FedDynHyperparameters
    program_class = FedDynProgram
    checkpoint_attributes = ("h",)  # server state across rounds (checkpoints)
    personal_model_is_received = True  # ∇L_k is not a model: every client evaluates θ^t
    # The linear term blows up at the small models' lr 0.1 on digits (chance again before round
    # 50); 0.05 learns within the default 50 rounds (docs/guides/configuration.md, "Defaults that learn").
    defaults_by_family = {"small": {"lr": 0.05}}

    @classmethod
    def search_space(cls, config: RunConfig, hparams: FedDynHyperparameters) -> dict[str, Dimension]:
        """lr around its default, and α over the paper's search {0.1, 0.01, 0.001}."""
        return {**super().search_space(config, hparams), "feddyn_alpha": Choice((0.1, 0.01, 0.001))}

    def __init__(self, config: RunConfig, hparams: FedDynHyperparameters, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        self.h = {n: torch.zeros_like(self.global_state[n]) for n in self.layout.groups["regularized"]}

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """``regularized``: the trainable shared parameters."""
        return {"regularized": tuple(n for n, p in self.model.named_parameters() if p.requires_grad)}

    def extra_private_state(self) -> Tensors:
        return {LINEAR + n: torch.zeros_like(self.global_state[n]) for n in self.layout.groups["regularized"]}

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        names = list(self.h)
        self.h, model = server_update(
            self.h,
            {n: self.global_state[n] for n in names},
            [{n: u.params[n] for n in names} for u in updates],
            self.hparams.feddyn_alpha,
            self.config.num_training_clients,  # m: the clients that train (new clients never do)
        )
        buffers = [n for n in self.layout.shared if n not in self.h]
        if buffers:
            model.update(
                weighted_average(
                    [{n: u.params[n] for n in buffers} for u in updates], [1 / len(updates)] * len(updates)
                )
            )
        for n, value in model.items():
            self.global_state[n].copy_(value)
