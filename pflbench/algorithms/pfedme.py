"""pFedMe — T. Dinh, Tran & Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020 (arXiv:2006.08848).

Each client minimises the Moreau envelope F_k(w) = min_θ f_k(θ) + (λ/2)·‖θ − w‖². Local training
(the paper's Algorithm 1), for every minibatch D of ``--local-epochs`` passes (R local steps):

    θ̂ ≈ argmin_θ  f_k(θ; D) + (λ/2)·‖θ − w‖²    by K = ``--inner-steps`` gradient steps
        θ ← θ − ν·(∇f_k(θ; D) + λ·(θ − w) [+ μ·θ])  (ν = ``--personal-lr``; ``pfedme_inner_solve``)
    w ← w − η·λ·(w − θ̂)                          (η = ``--lr``)

λ·(w − θ̂(w)) is the gradient of the envelope F_k at w, so the w step is taken by the run's local
optimizer with that gradient (SGD gives exactly the update above). θ starts the round at the
received w and is warm-started from the previous batch's θ̂ (as in the authors' code). Server:
w ← (1 − β)·w + β·Σ_k (n_k/Σn)·w_k (``pfedme_server_update``; the sample-weighted average of the
authors' code — the paper writes the plain mean over the sampled clients).

The bracketed μ·θ term (``--inner-mu`` μ, default 0 = off = the paper) is not in the paper: the
authors' released code (``pFedMeOptimizer``, whose μ defaults to 0.001) adds it to every inner
step, an L2 pull of θ towards 0 (weight decay of the personalized model), and PFLlib's pFedMe does
the same. ``--inner-mu 0.001`` reproduces their inner step; it applies wherever θ̂ is solved
(local training and new clients). At 0 the term is skipped (not added as 0), so runs that leave
it unset keep their numbers and their run folders (``omit_at_default``).

Hyperparameters (the argument defaults of the authors' released code; λ = 15 and K = 5 are also
the paper's MNIST settings): ``--lam`` λ = 15, ``--inner-steps`` K = 5, ``--personal-lr`` ν = 0.01,
``--beta`` β = 1 (plain averaging; the paper also reports β = 2, which accelerates). The paper
tunes η (``--lr``) per data set; the suite's ``--lr`` default is kept.

State: shared = w (sent down and uploaded, counted in bytes); private, never sent = each client's
last θ̂ (``pfedme.theta.<name>``), its personalized model, as the paper evaluates it: pers_acc uses
θ̂_k (the initial model for clients never sampled), global_acc uses w.

New clients (``--new-clients``): a new client's personalized model is the paper's θ̂(w) for the
final global w: the inner problem min_θ f(θ) + (λ/2)·‖θ − w‖² solved over its train split as in
local training (per minibatch K inner steps, warm-started, ``--local-epochs`` passes) with w fixed
(no w step), then tested (``PFedMeNewClientProgram``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
    sample_weights,
    weighted_average,
)
from pflbench.engine import LocalResult, LocalTrainer, apply_gradients

THETA = "pfedme.theta."
Gradient = Callable[[Tensors], tuple[torch.Tensor, Tensors]]


@torch.no_grad()
def pfedme_inner_solve(
    gradient: Gradient, theta: Tensors, anchor: Tensors, lam: float, lr: float, steps: int, mu: float = 0.0
) -> tuple[Tensors, torch.Tensor | None]:
    """K steps of θ ← θ − ν·(∇f(θ) + λ·(θ − w) + μ·θ) from ``theta`` (w = ``anchor``; μ·θ only when
    μ ≠ 0: the authors' code's term, not the paper's); returns θ̂ and the loss f at the last
    step's start. ``gradient(θ) -> (f(θ), ∇f(θ))``."""
    loss = None
    theta = {n: t.clone() for n, t in theta.items()}
    for _ in range(steps):
        with torch.enable_grad():
            loss, task_gradient = gradient(theta)
        for n, t in theta.items():
            step = task_gradient[n] + lam * (t - anchor[n])
            t.sub_(lr * (step + mu * t if mu else step))
    return theta, loss


def pfedme_envelope_gradient(w: Tensors, theta_hat: Tensors, lam: float) -> Tensors:
    """∇F(w) = λ·(w − θ̂): the w step w ← w − η·λ·(w − θ̂) is SGD on it."""
    return {n: lam * (w[n].detach() - theta_hat[n]) for n in theta_hat}


@torch.no_grad()
def pfedme_server_update(global_state: Tensors, average: Tensors, beta: float) -> None:
    """w ← (1 − β)·w + β·average, in place."""
    for name, value in average.items():
        global_state[name].mul_(1 - beta).add_(value, alpha=beta)


@dataclass(frozen=True)
class PFedMeHyperparameters:
    lam: float = option(
        15.0,
        "λ of the proximal term (λ/2)·‖personal − global‖² (Ditto: personal "
        "model v vs the received w; pFedMe: Moreau envelope θ vs w).",
    )
    inner_steps: int = option(5, "K: gradient steps that approximate θ̂ per batch (paper: 5).")
    personal_lr: float = option(0.01, "ν: step size of the inner steps (paper: 0.01).")
    beta: float = option(
        1.0, "β: Per-FedAvg's outer (meta) step size; pFedMe's server mixing w ← (1 − β)·w + β·avg(w_k)."
    )
    inner_mu: float = option(
        0.0,
        "μ of the μ·θ term the authors' code adds to every inner step (0 = off, the paper; their code: 0.001).",
        omit_at_default=True,
    )

    def validate(self) -> None:
        if not self.lam > 0:
            raise ConfigError(f"--lam must be > 0, got {self.lam}")
        if self.inner_steps < 1:
            raise ConfigError(f"--inner-steps must be ≥ 1, got {self.inner_steps}")
        if not self.personal_lr > 0:
            raise ConfigError(f"--personal-lr must be > 0, got {self.personal_lr}")
        if not self.beta > 0:
            raise ConfigError(f"--beta must be > 0, got {self.beta}")
        if not self.inner_mu >= 0:
            raise ConfigError(f"--inner-mu must be ≥ 0, got {self.inner_mu}")


class PFedMeProgram(ClientProgram[PFedMeHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        job, hparams = trainer.job, self.hparams
        names = [n for n in self.layout.trainable if n in set(self.layout.shared)]
        w = trainer.train_only(frozenset(names), self.layout.trainable)
        spec = self.optimizer()
        optimizer = trainer.optimizer(spec, w)
        theta = {n: p.detach().clone() for n, p in w.items()}
        total, steps = torch.zeros((), device=trainer.device), 0
        trainer.model.train()
        for _ in range(self.local.epochs):
            for inputs, targets in trainer.epoch():
                theta, loss = pfedme_inner_solve(
                    lambda params, x=inputs, y=targets: trainer.gradient(params, x, y),
                    theta,
                    {n: p.detach() for n, p in w.items()},
                    hparams.lam,
                    hparams.personal_lr,
                    hparams.inner_steps,
                    hparams.inner_mu,
                )
                apply_gradients(optimizer, w, pfedme_envelope_gradient(w, theta, hparams.lam), spec.max_grad_norm)
                total += loss
                steps += 1
        trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)
        private = {n: trainer.state[n].detach().clone() for n in self.layout.private}
        if steps:  # clients without a step keep their previous θ̂
            private.update({THETA + n: t.detach().clone() for n, t in theta.items()})
        else:
            private.update({n: t for n, t in job.private.items() if n.startswith(THETA)})
        loss = (total / max(steps, 1)).item() if steps else float("nan")
        return LocalResult(loss, {"task": loss} if steps else {}, private=private)


class PFedMeNewClientProgram(ClientProgram[PFedMeHyperparameters]):
    """A new client: θ̂(w) from the received global w (fixed), by local training's inner solves
    without the w step; uploads the model with θ̂ (the model it is tested with)."""

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        job, hparams = trainer.job, self.hparams
        names = [n for n in self.layout.trainable if n in job.received]
        anchor = {n: job.received[n] for n in names}
        theta = {n: trainer.params[n].detach().clone() for n in names}
        total, steps = torch.zeros((), device=trainer.device), 0
        trainer.model.train()
        for _ in range(self.local.epochs):
            for inputs, targets in trainer.epoch():
                theta, loss = pfedme_inner_solve(
                    lambda params, x=inputs, y=targets: trainer.gradient(params, x, y),
                    theta,
                    anchor,
                    hparams.lam,
                    hparams.personal_lr,
                    hparams.inner_steps,
                    hparams.inner_mu,
                )
                total += loss
                steps += 1
        trainer.load(theta)
        upload = {n: trainer.state[n].detach().clone() for n in job.received}
        loss = (total / max(steps, 1)).item() if steps else float("nan")
        return LocalResult(loss, {"task": loss} if steps else {}, upload=upload, private={})


@register_algorithm("pfedme")
class PFedMe(Algorithm[PFedMeHyperparameters]):
    """Moreau-envelope personalization: inner θ̂ per batch, w pulled toward it, β-mixing server."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True)

    display_name = "pFedMe"
    paper = "T. Dinh et al., NeurIPS 2020"
    method_family = "regularization"
    hyperparameters = PFedMeHyperparameters
    program_class = PFedMeProgram

    def extra_private_state(self) -> Tensors:
        names = [n for n in self.layout.trainable if n in set(self.layout.shared)]
        return {THETA + n: self.initial_state[n].detach().clone() for n in names}

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        average = weighted_average([u.params for u in updates], sample_weights(updates))
        pfedme_server_update(self.global_state, average, self.hparams.beta)

    def new_client_program(self) -> ClientProgram:
        """θ̂(w) for the final global w (``new_client_model``: w)."""
        return PFedMeNewClientProgram(self.layout, self.hparams, self.config.local_spec)

    def personal_model(self, client_id: int) -> Tensors:
        private = self.store.get(client_id)
        model = self.model_state(self.program.assemble(self.broadcast(client_id), private))
        model.update({n[len(THETA) :]: t for n, t in private.items() if n.startswith(THETA)})
        return model
