"""APFL — Deng, Kamani & Mahdavi, "Adaptive Personalized Federated Learning", 2020
(arXiv:2003.13461).

Each client k keeps a local model v_k and a mixing weight α_k ∈ [0, 1]; its personalized model is
the parameter mixture v̄_k = α_k·v_k + (1 − α_k)·w. Every local step draws one batch ξ and, from the
current (w, v, α), updates simultaneously (the paper's Algorithm 1):

    w ← w − η·∇f(w; ξ)                       (the global model's local copy: plain local SGD)
    v ← v − η·∇_v f(v̄; ξ) = v − η·α·∇f(v̄; ξ)
    α ← α − η_α·∇_α f(v̄; ξ),   ∇_α f(v̄) = ⟨∇f(v̄), ∂v̄/∂α⟩ = ⟨v − w, ∇f(v̄)⟩   (then clipped to [0, 1])

The α-gradient is the chain rule through v̄(α) = α·v + (1 − α)·w, whose derivative in α is v − w,
summed over every parameter tensor (one scalar α per client). Here it is computed from ∇f(v̄) with
that formula (``apfl_gradients``), not by differentiating through the mixture. w and v step with
the run's local optimizer (SGD = the paper's update); α with plain SGD at ``--alpha-lr``. The
server averages the uploaded w: w ← Σ_k n_k·w_k / Σ_k n_k.

Hyperparameters: ``--alpha-init`` α⁰ (default 0.5: the authors' released code's default; the paper
also reports fixed α ∈ {0.25, 0.5, 0.75}), ``--alpha-lr`` η_α (default: the run's ``--lr``, one
step size for all three updates as in the paper's algorithm), ``--adaptive-alpha`` (default on;
off = APFL with a fixed α).

State: shared = w (sent down and uploaded, counted in bytes); private, never sent = v_k
(``apfl.v.<name>``, initialised to w⁰) and α_k (``apfl.alpha``). Evaluation: pers_acc uses
v̄_k = α_k·v_k + (1 − α_k)·w with the current global w; global_acc uses w. Buffers (e.g. BatchNorm
statistics) are those of w.

New clients (``--new-clients``): APFL learns v and α only in a client's local rounds, so a client
that never trained has neither; it falls back to fine-tuning: the global w trained for
``--local-epochs`` epochs on the client's train split with the run's local optimizer, then tested.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import FineTuneProgram, LocalResult, LocalTrainer, apply_gradients

LOCAL = "apfl.v."
ALPHA = "apfl.alpha"


def apfl_mixture(local: Tensors, shared: Tensors, alpha: torch.Tensor | float) -> Tensors:
    """v̄ = α·v + (1 − α)·w, per tensor."""
    return {n: alpha * local[n] + (1 - alpha) * shared[n] for n in local}


def apfl_gradients(
    mixture_gradient: Tensors, local: Tensors, shared: Tensors, alpha: torch.Tensor | float
) -> tuple[Tensors, torch.Tensor]:
    """From g = ∇f(v̄): (∇_v f(v̄) = α·g per tensor, ∇_α f(v̄) = Σ_tensors ⟨v − w, g⟩)."""
    local_gradient = {n: alpha * g for n, g in mixture_gradient.items()}
    alpha_gradient = sum(((local[n] - shared[n]) * g).sum() for n, g in mixture_gradient.items())
    return local_gradient, alpha_gradient


@dataclass(frozen=True)
class APFLHyperparameters:
    alpha_init: float = option(
        0.5, "Initial mixing weight α of every client (the authors' code default; v̄ = α·v + (1 − α)·w)."
    )
    alpha_lr: float | None = option(None, "Step size of α's SGD update [default: --lr].")
    adaptive_alpha: bool = option(True, "Learn α per client (off: α stays at --alpha-init).")

    def validate(self) -> None:
        if not 0 <= self.alpha_init <= 1:
            raise ConfigError(f"--alpha-init must be in [0, 1], got {self.alpha_init}")
        if self.alpha_lr is not None and not self.alpha_lr > 0:
            raise ConfigError(f"--alpha-lr must be > 0, got {self.alpha_lr}")


class APFLProgram(ClientProgram[APFLHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        job = trainer.job
        names = [n for n in self.layout.trainable if n in set(self.layout.shared)]
        shared = trainer.train_only(frozenset(names), self.layout.trainable)  # w: live parameters
        local = {n: job.private[LOCAL + n].clone().requires_grad_(True) for n in names}
        alpha = job.private[ALPHA].clone()
        spec = self.optimizer()
        shared_optimizer, local_optimizer = trainer.optimizer(spec, shared), trainer.optimizer(spec, local)
        alpha_lr = self.local.lr if self.hparams.alpha_lr is None else self.hparams.alpha_lr
        total = torch.zeros((), device=trainer.device)
        mixture_total = torch.zeros((), device=trainer.device)
        steps = 0
        trainer.model.train()
        for _ in range(self.local.epochs):
            for inputs, targets in trainer.epoch():
                loss, shared_gradient = trainer.gradient(shared, inputs, targets)
                with torch.no_grad():
                    mixture = apfl_mixture(local, shared, alpha)
                mixture_loss, mixture_gradient = trainer.gradient(mixture, inputs, targets)
                with torch.no_grad():
                    local_gradient, alpha_gradient = apfl_gradients(mixture_gradient, local, shared, alpha)
                apply_gradients(shared_optimizer, shared, shared_gradient, spec.max_grad_norm)
                apply_gradients(local_optimizer, local, local_gradient, spec.max_grad_norm)
                if self.hparams.adaptive_alpha:
                    alpha = (alpha - alpha_lr * alpha_gradient).clamp(0.0, 1.0)
                total += loss
                mixture_total += mixture_loss
                steps += 1
        trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)
        means = (torch.stack([total, mixture_total]) / max(steps, 1)).tolist()
        private = {n: trainer.state[n].detach().clone() for n in self.layout.private}
        private.update({LOCAL + n: t.detach().clone() for n, t in local.items()})
        private[ALPHA] = alpha.detach().clone()
        terms = {"task": means[0], "personalized_task": means[1]} if steps else {}
        return LocalResult(means[0] if steps else float("nan"), terms, private=private)


@register_algorithm("apfl")
class APFL(Algorithm[APFLHyperparameters]):
    """Per-client mixture α·v + (1 − α)·w of a local and the global model, α learned."""

    capabilities = Capabilities(same_broadcast=True, fedavg_aggregate=True, diagnostics_without_uploads=True)

    display_name = "APFL"
    paper = "Deng et al., arXiv:2003.13461, 2020"
    method_family = "model_combination"
    hyperparameters = APFLHyperparameters
    program_class = APFLProgram

    @classmethod
    def inert_hyperparameters(cls, config: RunConfig, hparams: APFLHyperparameters) -> dict[str, str]:
        """α's step size is read only while α is learned."""
        if hparams.adaptive_alpha:
            return {}
        return {"alpha_lr": "--no-adaptive-alpha keeps α at --alpha-init (--adaptive-alpha learns it)"}

    def extra_private_state(self) -> Tensors:
        names = [n for n in self.layout.trainable if n in set(self.layout.shared)]
        state = {LOCAL + n: self.initial_state[n].detach().clone() for n in names}
        device = next(iter(self.initial_state.values())).device
        state[ALPHA] = torch.tensor(float(self.hparams.alpha_init), device=device)
        return state

    def new_client_program(self) -> ClientProgram:
        """The fallback: the global model fine-tuned for ``--local-epochs`` epochs."""
        return FineTuneProgram(self.layout.trainable, self.config.local_spec, self.config.local_epochs)

    def personal_model(self, client_id: int) -> Tensors:
        private = self.store.get(client_id)
        model = self.model_state(self.program.assemble(self.broadcast(client_id), private))
        local = {n[len(LOCAL) :]: t for n, t in private.items() if n.startswith(LOCAL)}
        model.update(apfl_mixture(local, model, private[ALPHA]))
        return model

    def final_report(self):
        """clients.csv: each client's final α (the initial α for clients never sampled)."""
        return {}, {"apfl_alpha": [float(self.store.get(k)[ALPHA]) for k in range(self.config.num_clients)]}
