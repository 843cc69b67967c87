"""FLUTE — Liu, Shen & Yang, "Federated Representation Learning in the Under-Parameterized
Regime", ICML 2024 (arXiv:2406.04596).

FedRep's split — a shared representation φ (the body, FedAvg-averaged) and a private linear head
h_k(z) = W_k·z + b_k per client (the final layer, W_k ∈ ℝ^{C×D}) — with regularisers that push
each head towards a simplex equiangular tight frame on the classes the client holds (neural
collapse), keep the heads small and the representations small. With y_k ∈ {0, 1}^C the client's
class indicator (1 where its train split holds the class), ⊙ the entrywise product and ‖·‖ the
Frobenius norm:

    r1(W_k) = ‖ W_kW_kᵀ/‖W_kW_kᵀ‖ − (1/√(C−1))·(I_C − (1/C)·11ᵀ) ⊙ (y_k y_kᵀ) ‖      (``etf_distance``)
    r2(W_k) = ‖W_k‖²,     r3(φ; B) = ‖φ(X_B)‖² = Σ_{x ∈ B} ‖φ(x)‖²   (a minibatch B)

Client k minimises, per minibatch, CE(h_k(φ(x)), y) + λ1·r1 + λ2·r2 + λ3·r3: first
``--local-epochs`` − ``--rep-epochs`` epochs on the head alone (the body frozen; r3 has no gradient
in the head), then ``--rep-epochs`` epochs on head and body together. It uploads the body, its head
weight W_k and y_k. The server averages the bodies by sample count and takes one gradient step on
the round's heads (the paper's server-side neural-collapse step):

    W_i ← W_i − η_s·∇_{W_i} (1/M)·Σ_{j=1..M} r1(W_j; y_j)    (M reporting clients; ``server_head_step``)

and W_i is client i's head from then on (it is i's evaluation head, and what i trains next).

Defaults — the authors' code (RenpuLiu/flute, ``models/Update.py``) and FL-bench's FLUTE agree:
λ1 = 0.25 (``--etf-weight``), λ2 = 0.0025 (``--head-norm-weight``), λ3 = 0.0005
(``--feature-norm-weight``), 1 representation epoch (``--rep-epochs``; the authors'
``--local_rep_ep``, FL-bench's ``rep_round``), η_s = 0.5 (``--server-head-lr``; their ``nc2_lr``).

Departures, each for a stated reason:
- The authors' local loop steps only in the representation epochs (its head-epoch branch never
  calls ``backward``) and its server step overwrites the heads' biases with random numbers; we
  follow the paper and FL-bench: the head epochs train the head (CE + λ1·r1 + λ2·r2), the server
  step leaves the biases alone.
- FL-bench keeps stepping the frozen body in the head epochs (zeroed gradients under weight
  decay and momentum); here the body is not in the head phase's optimizer at all.
- The local optimizer is the run's (the authors: SGD momentum 0.5, weight decay 1e-4 on weights).
- r3 is logged in the head epochs too (it has no gradient there, as in FL-bench where it is only
  added in the representation epochs; the update is the same).

What travels: down, the body; up, the body, W_k and y_k (C numbers). New clients
(``--new-clients``): the trained body (frozen) with a fresh head trained for ``--local-epochs``
epochs on cross-entropy (``Algorithm``'s default for private heads, as FedPer; the paper does not
serve new clients). No global model (a body without a head): ``global_acc`` null.
Refused: ``--head-layers`` other than 1 (the regularisers act on the final linear layer and its
input), a final layer that is not ``nn.Linear``, ``--executor vmap`` (r3 reads the representation
through a forward hook: a custom local update), ``--dp``, ``--attack`` model poisoning and
``--robust-agg`` (the server step reads each raw head; the engine's predicate refuses them).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Capabilities,
    Choice,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    Dimension,
    LocalPhase,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    option,
    register_algorithm,
    standard_local_update,
)
from pflbench.algorithms.fedper import FedPer
from pflbench.models.zoo import final_linear_layer, head_module_names

HEAD = "flute.head"  # the uploaded head weight W_k
CLASSES = "flute.classes"  # the uploaded class indicator y_k


# ---- the math ----------------------------------------------------------------------------
def etf_target(indicator: torch.Tensor) -> torch.Tensor:
    """(1/√(C−1))·(I_C − (1/C)·11ᵀ) ⊙ (y yᵀ): the simplex ETF's Gram matrix on the held classes."""
    classes = indicator.numel()
    eye = torch.eye(classes, dtype=indicator.dtype, device=indicator.device)
    centred = eye - torch.ones_like(eye) / classes
    return centred * torch.outer(indicator, indicator) / math.sqrt(classes - 1)


def etf_distance(weight: torch.Tensor, indicator: torch.Tensor) -> torch.Tensor:
    """r1 = ‖WWᵀ/‖WWᵀ‖ − etf_target(y)‖ (Frobenius)."""
    gram = weight @ weight.t()
    return torch.linalg.matrix_norm(gram / torch.linalg.matrix_norm(gram) - etf_target(indicator.to(weight.dtype)))


def server_head_step(heads: list[torch.Tensor], indicators: list[torch.Tensor], lr: float) -> list[torch.Tensor]:
    """One gradient step of lr on (1/M)·Σ_j r1(W_j; y_j) for every head W_i."""
    stacked = torch.stack([h.detach().double() for h in heads]).requires_grad_(True)
    loss = torch.stack([etf_distance(stacked[j], indicators[j].double()) for j in range(len(heads))]).mean()
    (gradient,) = torch.autograd.grad(loss, stacked)
    return [(stacked[j] - lr * gradient[j]).detach().to(heads[j].dtype) for j in range(len(heads))]


def class_indicator(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """y ∈ {0, 1}^C: 1 for the classes present in ``labels``."""
    return (torch.bincount(labels, minlength=num_classes) > 0).float()


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FLUTEHyperparameters:
    etf_weight: float = option(0.25, "λ1: weight of the head's distance to the simplex ETF (the authors' 0.25).")
    head_norm_weight: float = option(0.0025, "λ2: weight of ‖W_k‖² (the authors' 0.0025).")
    feature_norm_weight: float = option(0.0005, "λ3: weight of the batch's ‖φ(X)‖² (the authors' 0.0005).")
    rep_epochs: int = option(1, "Representation epochs (head and body) at the end of --local-epochs (the authors' 1).")
    server_head_lr: float = option(0.5, "η_s: the server's step on the heads' ETF distance (the authors' 0.5).")

    def validate(self) -> None:
        for flag, value in (
            ("--etf-weight", self.etf_weight),
            ("--head-norm-weight", self.head_norm_weight),
            ("--feature-norm-weight", self.feature_norm_weight),
            ("--server-head-lr", self.server_head_lr),
        ):
            if not value >= 0:
                raise ConfigError(f"{flag} must be ≥ 0, got {value}")
        if self.rep_epochs < 0:
            raise ConfigError(f"--rep-epochs must be ≥ 0, got {self.rep_epochs}")


class FLUTEProgram(ClientProgram[FLUTEHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the final linear layer (make_program)
    captured: list[torch.Tensor] | None = None  # per-job copy: φ(x) of the current batch
    indicator: torch.Tensor | None = None  # per-job copy: y_k

    def __init__(self, layout, hparams, local) -> None:
        super().__init__(layout, hparams, local)
        self.loss_weights = {
            "etf": hparams.etf_weight,
            "head_norm": hparams.head_norm_weight,
            "feature_norm": hparams.feature_norm_weight,
        }

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        """The head for E − rep epochs (body frozen), then head and body for rep epochs."""
        head = frozenset(n for n in self.layout.trainable if n.startswith(f"{self.head_module}."))
        joint = max(0, min(self.hparams.rep_epochs, self.local.epochs))
        return [LocalPhase(self.local.epochs - joint, head), LocalPhase(joint, frozenset(self.layout.trainable))]

    def loss_terms(self, forward, params, inputs, targets, received):
        logits = forward(params, inputs)
        features = self.captured.pop()  # type: ignore[union-attr]
        weight = params[f"{self.head_module}.weight"]
        assert self.indicator is not None
        return {
            "task": F.cross_entropy(logits, targets),
            "etf": etf_distance(weight, self.indicator.to(weight.device)),
            "head_norm": weight.pow(2).sum(),
            "feature_norm": features.float().pow(2).sum(),
        }

    def local_update(self, trainer) -> LocalResult:
        data, client = trainer.data, trainer.job.client_id
        job_program = copy.copy(self)
        job_program.captured = []
        job_program.indicator = class_indicator(data.labels[data.train_indices[client]], data.num_classes)
        head = trainer.model.get_submodule(self.head_module)
        handle = head.register_forward_pre_hook(lambda module, args: job_program.captured.append(args[0]))
        try:
            result = standard_local_update(job_program, trainer)
        finally:
            handle.remove()
        state = trainer.state
        upload = {n: state[n].detach().clone() for n in self.layout.shared}
        upload[HEAD] = state[f"{self.head_module}.weight"].detach().clone()
        upload[CLASSES] = job_program.indicator.to(upload[HEAD].device)
        result.upload = upload
        return result


# ---- server ------------------------------------------------------------------------------
@register_algorithm("flute")
class FLUTE(FedPer):
    """FedRep-style shared body and private heads, heads regularised towards a simplex ETF on the
    client's classes, plus a server step on the heads."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "FLUTE"
    paper = "Liu et al., ICML 2024"
    method_family = "decoupling"
    hyperparameters = FLUTEHyperparameters
    program_class = FLUTEProgram

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"flute regularises the final linear layer and its input; --head-layers {config.head_layers} "
                "would be ignored (leave it at 1)"
            )

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: Any) -> dict[str, Any]:
        final_linear_layer(model, "flute")  # a ConfigError naming the layer unless it is nn.Linear
        return super().configure_model(model, config, hparams)

    @classmethod
    def search_space(cls, config: RunConfig, hparams: Any) -> dict[str, Dimension]:
        """lr around its default; λ1 and λ3 over a decade either side of the authors' values."""
        return {
            **super().search_space(config, hparams),
            "etf_weight": Choice((0.025, 0.25, 2.5)),
            "feature_norm_weight": Choice((0.00005, 0.0005, 0.005)),
        }

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module, num_train: list[int]) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module = self.head_module  # type: ignore[attr-defined]
        return program

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """FedAvg of the bodies; one server step on the round's heads, stored as their heads."""
        if not updates:
            return
        bodies = [
            ClientUpdate(u.client_id, u.num_samples, {n: u.params[n] for n in self.layout.shared}, u.loss_terms)
            for u in updates
        ]
        super().aggregate(bodies)
        stepped = server_head_step(
            [u.params[HEAD] for u in updates], [u.params[CLASSES] for u in updates], self.hparams.server_head_lr
        )
        name = f"{self.head_module}.weight"
        for update, weight in zip(updates, stepped):
            state = dict(self.store.get(update.client_id))
            state[name] = weight.to(state[name].device)
            self.store.put(update.client_id, state)
