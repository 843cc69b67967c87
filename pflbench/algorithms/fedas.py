"""FedAS — Yang, Huang & Ye, "FedAS: Bridging Inconsistency in Personalized Federated Learning",
CVPR 2024 (authors' code: github.com/xiyuanyang45/FedAS, built on PFLlib).

The model is a shared body (feature extractor φ) and a private head (the last ``--head-layers``
layers), as in FedPer. FedAS adds two steps.

**Federated parameter alignment** (client side, before local training). The received global body
φ_g knows nothing of the client's head. The client computes class prototypes with its *previous
local* body φ_l on its train split,

    p_c = mean_{(x, y) ∈ D_k, y = c} φ_l(x)                                  (``class_prototypes``)

and trains φ_g for ``--align-epochs`` epochs of SGD (``--align-lr``) on the prototype loss

    L_align = Σ_{c ∈ batch} MSE(φ_g(x_c), p_c)   (mean over the batch's samples of class c and
                                                  the feature dimensions) (``alignment_loss``)

so that the shared part "learns from the previous model". The aligned body and the client's own
head are then trained together for ``--local-epochs`` epochs (the run's optimizer).

**Client synchronisation** (server side). After training, each client measures how sensitive its
model is to its data by the trace of the empirical Fisher information, computed as the authors'
code does: one pass over its train split in eval mode, per minibatch the gradient of the mean
negative log-likelihood, summed over batches and parameters,

    F_k = Σ_batches Σ_params ‖∇_θ NLL_batch(θ_k)‖²

and uploads it with its body. The server aggregates the bodies weighted by it, so that
under-trained clients (stragglers, whose Fisher trace is small) weigh less:

    φ_g ← Σ_k (F_k / Σ_j F_j)·φ_k                                  (``fisher_weights``)

(sample weights n_k / Σ n if every F_k is 0).

Defaults and choices the paper leaves open, and what this file does:

- ``--align-lr 0.01`` and ``--align-epochs 1``, SGD without momentum: the authors' code. Its
  alignment batches are of 16; here the run's ``--batch-size``. The previous local body is the one
  the client trained at its last participation (kept on the client); a client that has never
  trained skips the alignment (the authors' code aligns towards its initial, untrained body).
- Fisher trace over every trainable parameter (body and head), as in the authors' code, using the
  same shuffled minibatches as an epoch of training.
- The authors' code also recomputes the Fisher trace of the clients not sampled in a round, but
  only the sampled clients' traces enter the aggregation; here only sampled clients compute it.
- Personalized model (``pers_acc``): the client's own last-trained body and head, as the
  authors' code evaluates (a client that never trained: the initial model). No global model
  (``global_acc`` null): the global body has no head of its own.

What travels: down, the global body; up, the trained body and F_k (one float32). Private
(ClientStateStore, never counted): the head, the last-trained body (``fedas.body.<name>``) and the
number of rounds the client trained (``fedas.rounds``).

New clients (``--new-clients``): the trained global body (frozen) with a fresh head trained on the
client's train split for ``--local-epochs`` epochs (``Algorithm``'s default, as FedPer).

Executors: the alignment is a custom local update, so ``--executor vmap`` refuses it; the
sequential and Ray executors give identical numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    OptimizerSpec,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
    weighted_average,
)
from pflbench.engine import LocalResult, LocalTrainer, standard_local_update
from pflbench.models.zoo import head_module_names, head_parameter_names

BODY = "fedas.body."  # the client's last-trained body, private
ROUNDS = "fedas.rounds"  # how many rounds the client trained, private (int64)
FISHER = "fedas.fisher"  # uploaded: the Fisher trace F_k (float32)
PROTOTYPE_CHUNK = 1024


def class_prototypes(features: torch.Tensor, labels: torch.Tensor) -> dict[int, torch.Tensor]:
    """p_c = the mean feature vector of the samples of class c, for each class present."""
    return {int(c): features[labels == c].mean(dim=0) for c in torch.unique(labels)}


def alignment_loss(
    features: torch.Tensor, labels: torch.Tensor, prototypes: dict[int, torch.Tensor]
) -> torch.Tensor | None:
    """Σ over the batch's classes c that have a prototype of MSE(features of class c, p_c);
    None when no class of the batch has one."""
    terms = [
        F.mse_loss(features[labels == c], prototypes[int(c)].expand_as(features[labels == c]))
        for c in torch.unique(labels)
        if int(c) in prototypes
    ]
    return torch.stack(terms).sum() if terms else None


def fisher_weights(traces: Sequence[float], num_samples: Sequence[int]) -> list[float]:
    """F_k / Σ_j F_j; the sample weights n_k / Σ n when the traces sum to 0 (or are not finite)."""
    total = sum(traces)
    if not (total > 0) or total == float("inf"):
        return [n / sum(num_samples) for n in num_samples]
    return [t / total for t in traces]


@dataclass(frozen=True)
class FedASHyperparameters:
    align_lr: float = option(0.01, "SGD learning rate of the parameter alignment (authors' code: 0.01).")
    align_epochs: int = option(1, "Epochs of parameter alignment of the received body (authors' code: 1; 0 = off).")

    def validate(self) -> None:
        if not self.align_lr > 0:
            raise ConfigError(f"--align-lr must be > 0, got {self.align_lr}")
        if self.align_epochs < 0:
            raise ConfigError(f"--align-epochs must be ≥ 0, got {self.align_epochs}")


class FedASProgram(ClientProgram[FedASHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the first module of the head: its input is the body's feature vector

    def features(self, trainer: LocalTrainer) -> Callable[[torch.Tensor], torch.Tensor]:
        """x ↦ φ(x) of the working model (the head's input, captured by a forward pre-hook)."""
        captured: list[torch.Tensor] = []
        head = trainer.model.get_submodule(self.head_module)

        def run(inputs: torch.Tensor) -> torch.Tensor:
            handle = head.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
            try:
                with trainer.autocast():  # --precision bf16: the forward as the batch loop's
                    trainer.model(inputs)
            finally:
                handle.remove()
            return captured.pop().flatten(1).float()

        return run

    @torch.no_grad()
    def prototypes(self, trainer: LocalTrainer, body: Tensors) -> dict[int, torch.Tensor]:
        """Class prototypes of the client's train split under ``body`` (eval mode)."""
        received = {n: trainer.state[n].detach().clone() for n in body}
        trainer.load(body)
        trainer.model.eval()
        features = self.features(trainer)
        indices = trainer.data.train_indices[trainer.job.client_id]
        parts, labels = [], []
        for start in range(0, len(indices), PROTOTYPE_CHUNK):
            inputs, targets = trainer.data.gather(indices[start : start + PROTOTYPE_CHUNK])
            parts.append(features(inputs))
            labels.append(targets)
        trainer.model.train()
        trainer.load(received)
        return class_prototypes(torch.cat(parts), torch.cat(labels))

    def align(self, trainer: LocalTrainer) -> None:
        """Parameter alignment of the received body towards the previous body's prototypes."""
        job = trainer.job
        body = {n: job.private[BODY + n] for n in self.layout.shared}
        prototypes = self.prototypes(trainer, body)
        names = frozenset(n for n in self.layout.shared if n in self.layout.trainable)
        params = trainer.train_only(names, self.layout.trainable)
        optimizer = trainer.optimizer(OptimizerSpec(kind="sgd", lr=self.hparams.align_lr), params)
        features = self.features(trainer)
        for _ in range(self.hparams.align_epochs):
            for inputs, targets in trainer.epoch():
                loss = alignment_loss(features(inputs), targets, prototypes)
                if loss is None:
                    continue
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)

    def fisher_trace(self, trainer: LocalTrainer) -> float:
        """Σ over one pass of minibatches of ‖∇ mean NLL‖² over every trainable parameter."""
        params = [trainer.params[n] for n in self.layout.trainable]
        trainer.model.eval()
        total = torch.zeros((), device=trainer.device)
        for inputs, targets in trainer.epoch():
            with trainer.autocast():
                nll = F.cross_entropy(trainer.model(inputs), targets)
            for gradient in torch.autograd.grad(nll, params):
                total += gradient.pow(2).sum()
        trainer.model.train()
        return float(total)

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        private = trainer.job.private
        trained_before = int(private[ROUNDS]) > 0
        if trained_before and self.hparams.align_epochs:
            self.align(trainer)
        result = standard_local_update(self, trainer)
        state = trainer.state
        upload = {n: state[n].detach().clone() for n in self.layout.shared}
        upload[FISHER] = torch.tensor(self.fisher_trace(trainer), dtype=torch.float32, device=trainer.device)
        kept = {n: state[n].detach().clone() for n in self.layout.private}
        kept.update({BODY + n: state[n].detach().clone() for n in self.layout.shared})
        kept[ROUNDS] = private[ROUNDS] + 1
        result.upload, result.private = upload, kept
        return result


@register_algorithm("fedas")
class FedAS(Algorithm[FedASHyperparameters]):
    """Body/head; the received body aligned to local prototypes; bodies averaged by Fisher trace."""

    capabilities = Capabilities(same_broadcast=True)

    display_name = "FedAS"
    paper = "Yang et al., CVPR 2024"
    method_family = "model_combination"
    hyperparameters = FedASHyperparameters
    program_class = FedASProgram
    has_global_model = False  # a body without a head has no accuracy of its own
    uses_head_layers = True

    def select_shared(self, names: list[str]) -> list[str]:
        head = head_parameter_names(self.model, self.config.head_layers)
        return [name for name in names if name not in head]

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module = head_module_names(self.model, self.config.head_layers)[0]  # type: ignore[attr-defined]
        return program

    def extra_private_state(self) -> Tensors:
        body = {BODY + n: self.initial_state[n].detach().clone() for n in self.global_state}
        return {**body, ROUNDS: torch.zeros((), dtype=torch.int64)}

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        traces = [float(u.params[FISHER]) for u in updates]
        weights = fisher_weights(traces, [u.num_samples for u in updates])
        names = list(self.global_state)
        average = weighted_average([{n: u.params[n] for n in names} for u in updates], weights)
        for n in names:
            self.global_state[n].copy_(average[n])

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        traces = [float(u.params[FISHER]) for u in updates if FISHER in u.params]
        if not traces:
            return {}
        weights = fisher_weights(traces, [u.num_samples for u in updates])
        return {
            "fedas_fisher_mean": sum(traces) / len(traces),
            "fedas_fisher_min": min(traces),
            "fedas_fisher_max": max(traces),
            "fedas_weight_max": max(weights),
        }

    def personal_model(self, client_id: int) -> Tensors:
        """The client's own last-trained body and head (the initial model if it never trained)."""
        state = self.store.get(client_id)
        model = {**self.global_state, **{n: state[n] for n in self.layout.private}}
        model.update({n: state[BODY + n] for n in self.global_state})
        return self.model_state(model)
