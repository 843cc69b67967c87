"""Ditto — Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021 (arXiv:2012.04221).

Two models per client. The global model w is trained exactly as in FedAvg (``--local-epochs``
epochs of the run's local optimizer from the received w^t; uploaded; the server averages
w ← Σ_k n_k·w_k / Σ_k n_k). Besides it, each client keeps a personal model v_k and trains it for
``--personal-epochs`` epochs on

    h_k(v; w^t) = f_k(v) + (λ/2)·‖v − w^t‖²,   i.e.  v ← v − η·(∇f_k(v) + λ·(v − w^t))

(w^t = the global model the client received this round, not its locally updated copy; with SGD
this is the paper's Algorithm 1 step; other ``--optimizer`` choices get this gradient).

Hyperparameters: ``--lam`` λ (default 0.1; the paper selects λ per data set from a small grid,
so no single paper value exists — 0.1 is this suite's choice), ``--personal-epochs`` (default:
``--local-epochs``; the paper runs the personal solver for as many local iterations as the
global one).

State: shared = the global model w (sent down and uploaded: bytes_down/bytes_up count w only);
private, never sent = the personal model v_k (``ditto.v.<name>``, one full model state per client,
initialised to the initial model w⁰). Evaluation: pers_acc uses v_k; global_acc uses w.

New clients (``--new-clients``): Ditto's personal objective with the global model fixed — v starts
at the final w and is trained for ``--personal-epochs`` epochs on f(v) + (λ/2)·‖v − w‖² over the
client's train split (``DittoNewClientProgram``; the standard batch loop with the proximal term
gives exactly the personal step above), then tested.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalPhase,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.algorithms.fedprox import proximal_term
from pflbench.engine import LocalResult, LocalTrainer, apply_gradients, mean_terms, standard_local_update

PERSONAL = "ditto.v."


def ditto_personal_gradient(task_gradient: Tensors, personal: Tensors, anchor: Tensors, lam: float) -> Tensors:
    """∇_v [f(v) + (λ/2)·‖v − w^t‖²] = ∇f(v) + λ·(v − w^t), per tensor."""
    return {n: task_gradient[n] + lam * (personal[n] - anchor[n]) for n in task_gradient}


@dataclass(frozen=True)
class DittoHyperparameters:
    lam: float = option(
        0.1,
        "λ of the proximal term (λ/2)·‖personal − global‖² (Ditto: personal "
        "model v vs the received w; pFedMe: Moreau envelope θ vs w).",
    )
    personal_epochs: int | None = option(
        None, "Epochs of the personal model per round [default: --local-epochs, as in the paper]."
    )

    def validate(self) -> None:
        if not self.lam >= 0:
            raise ConfigError(f"--lam must be ≥ 0, got {self.lam}")
        if self.personal_epochs is not None and self.personal_epochs < 0:
            raise ConfigError(f"--personal-epochs must be ≥ 0, got {self.personal_epochs}")


class DittoProgram(ClientProgram[DittoHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        """FedAvg's local epochs on w (uploaded), then the personal epochs on v (kept)."""
        job = trainer.job
        result = standard_local_update(self, trainer)  # the global model: plain FedAvg
        upload = self.upload(trainer.state, job.received)
        names = [n for n in self.layout.trainable]
        personal = {n: job.private[PERSONAL + n].clone() for n in names}
        personal_buffers = {n: job.private[PERSONAL + n] for n in self.layout.shared if n not in personal}
        trainer.load(personal_buffers)  # v's own buffers (e.g. BatchNorm statistics) while it trains
        leaves = {n: t.requires_grad_(True) for n, t in personal.items()}
        spec = self.optimizer()
        optimizer = trainer.optimizer(spec, leaves)
        epochs = self.local.epochs if self.hparams.personal_epochs is None else self.hparams.personal_epochs
        total, sums, steps = torch.zeros((), device=trainer.device), {}, 0
        for _ in range(epochs):
            for inputs, targets in trainer.epoch():
                loss, gradient = trainer.gradient(leaves, inputs, targets)
                with torch.no_grad():
                    direction = ditto_personal_gradient(gradient, leaves, job.received, self.hparams.lam)
                apply_gradients(optimizer, leaves, direction, spec.max_grad_norm)
                total += loss
                steps += 1
        personal_result = mean_terms(total, sums, steps)
        kept = {PERSONAL + n: t.detach().clone() for n, t in leaves.items()}
        kept.update({PERSONAL + n: trainer.state[n].detach().clone() for n in personal_buffers})
        kept.update({n: trainer.state[n].detach().clone() for n in self.layout.private})
        terms = {"task": result.loss, **({"personal_task": personal_result.loss} if steps else {})}
        return LocalResult(result.loss, terms, upload=upload, private=kept)


class DittoNewClientProgram(ClientProgram[DittoHyperparameters]):
    """A new client's personal model: from the received global w, ``--personal-epochs`` epochs of
    f(v) + (λ/2)·‖v − w‖² (w fixed), then v uploaded (the model it is tested with)."""

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        epochs = self.local.epochs if self.hparams.personal_epochs is None else self.hparams.personal_epochs
        return [LocalPhase(epochs, frozenset(self.layout.trainable))]

    def loss_terms(self, forward, params, inputs, targets, received):
        terms = super().loss_terms(forward, params, inputs, targets, received)
        anchor = {n: received[n] for n in self.layout.trainable}
        terms["proximal"] = proximal_term(params, anchor, self.hparams.lam)
        return terms

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        return {name: state[name].detach().clone() for name in received}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}


@register_algorithm("ditto")
class Ditto(Algorithm[DittoHyperparameters]):
    """FedAvg global model + a personal model per client pulled toward it by (λ/2)·‖v − w‖²."""

    capabilities = Capabilities(same_broadcast=True, fedavg_aggregate=True, diagnostics_without_uploads=True)

    display_name = "Ditto"
    paper = "Li et al., ICML 2021"
    method_family = "regularization"
    hyperparameters = DittoHyperparameters
    program_class = DittoProgram

    def extra_private_state(self) -> Tensors:
        """v⁰ = w⁰: the initial model, trainable tensors and float buffers."""
        names = list(self.layout.trainable) + [n for n in self.layout.shared if n not in self.layout.trainable]
        return {PERSONAL + n: self.initial_state[n].detach().clone() for n in names}

    def new_client_program(self) -> ClientProgram:
        """v trained from the global w on the personal objective (``new_client_model``: w)."""
        return DittoNewClientProgram(self.layout, self.hparams, self.config.local_spec)

    def personal_model(self, client_id: int) -> Tensors:
        state = self.store.get(client_id)
        model = self.model_state(self.program.assemble(self.broadcast(client_id), state))
        model.update({n[len(PERSONAL) :]: t for n, t in state.items() if n.startswith(PERSONAL)})
        return model
