"""FedPAC — Xu, Tong & Huang, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration", ICLR 2023 (arXiv:2306.11867).

A shared feature extractor (the body, FedAvg-averaged) and a private linear classifier per
client (the final layer), with two additions:

1. **Feature alignment.** Client k's local loss for the body is FedProto's (``fedproto.py``):
   CE(h_k(z), y) + λ·ℓ_R(z, c_y), with c_j the global prototype of class j — the per-class mean
   representation z (the classifier's input) aggregated over the round's clients weighted by
   their class sample counts (as the paper and the authors' ``protos_aggregation`` do).
   Local training is two phases: the classifier for ``--head-epochs`` epochs (the paper's 1) with
   the body frozen, then the body for ``--local-epochs`` epochs with the classifier frozen (the
   prototype term has no gradient in the classifier, so the first phase is plain CE).
2. **Classifier collaboration.** Before training, with the received model, client i computes
   feature statistics of its train data (``feature_statistics``): with p_i(k) the share of class
   k, μ_{i,k} the mean and E_i[‖z‖² | k] the mean squared norm of its class-k representations,

       h_i = [p_i(k)·μ_{i,k}]_k   (C × D),
       V_i = (1/n_i)·Σ_k (p_i(k)·E_i[‖z‖² | k] − p_i(k)²·‖μ_{i,k}‖²)

   (V_i exactly as the authors' ``statistics_extraction`` computes it). The server then gives
   each participating client i the head Σ_j α_{ij}·φ_j of the round's uploaded heads φ_j, with
   α_i the solution of the simplex-constrained quadratic program (the paper's bias–variance
   estimate of the combined head's error)

       α_i = argmin_{α ≥ 0, Σα = 1}  Σ_j α_j²·V_j + ‖Σ_j α_j·(h_i − h_j)‖²_F  =  αᵀ(diag(V) + G_i)α,
       G_i[j, j'] = ⟨h_i − h_j, h_i − h_{j'}⟩        (``combination_matrix``).

   We solve it ourselves (``simplex_qp``: accelerated projected gradient in float64, no solver
   dependency); then, as the authors do, weights below 1e-3 are set to 0 and the rest
   renormalised (``combination_weights``). diag(V) + G_i is positive semi-definite by
   construction (V ≥ 0, G_i a Gram matrix), so the authors' eigenvalue clipping never applies.

Choices the paper leaves open, and what the authors' code (JianXu95/FedPAC) and PFLlib do:

- λ (``--proto-weight``) = 1 (the authors' ``--lam``). Their classifier phase uses a fixed
  lr 0.1 and both phases SGD momentum 0.5, weight decay 5e-4; we use the run's optimizer for
  both phases (one optimizer setting for every algorithm).
- Classes without a global prototype: the authors' body loss pulls them to the client's own
  pre-training prototype, PFLlib leaves them out; we leave them out (term 0), as FedProto does.
  In round 1 there are no global prototypes: plain CE.
- Local prototypes: after local training, one pass over the train split in eval mode (both codes).
- The authors skip the head combination in the last round; we combine in every round.
- The combined head reaches client i when it is next sampled (counted in that round's
  bytes_down); it is i's evaluation head from the round it was computed (``personal_model``).

Bytes: up — the body, the classifier, the prototypes and class counts (C·D + C), h_i (C·D) and V_i
(1 float); down — the body, the global prototypes with their mass (C·D + C) and, once combined,
the client's combined classifier. The local update is custom (statistics, two phases,
prototypes), so ``--executor vmap`` is refused; ``--head-layers`` other than 1 is refused (the
classifier is the final layer).

New clients (``--new-clients``): the trained body with a fresh (initial) classifier trained on
the client's train split for ``--local-epochs`` epochs with the body frozen (``Algorithm``'s
default for private heads). No global model (a body without a classifier): ``global_acc`` null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    LocalPhase,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
    sample_weights,
    standard_local_update,
    weighted_average,
)
from pflbench.algorithms.fedproto import (
    UPLOADED_COUNTS,
    UPLOADED_PROTOTYPES,
    FedProto,
    FedProtoProgram,
    class_sums,
)

HEAD = "fedpac.head."  # a client's trained classifier (upload)
COMBINED = "fedpac.combined."  # the classifier the server combined for the client (broadcast)
VARIANCE = "fedpac.variance"  # V_i, shape [1] (upload)
CENTROIDS = "fedpac.centroids"  # h_i, C × D (upload)
SMALL_WEIGHT = 1e-3  # combination weights below this are dropped (the authors' eps)


# ---- the math ----------------------------------------------------------------------------
def feature_statistics(
    sums: torch.Tensor, square_sums: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(V_i [1], h_i [C × D]) from per-class Σz [C × D], Σ‖z‖² [C] and counts [C]:
    h = p(k)·μ_k, V = (1/n)·Σ_k (p(k)·E[‖z‖² | k] − p(k)²·‖μ_k‖²)."""
    total = counts.sum()
    share = counts / total
    means = sums / counts.clamp(min=1).unsqueeze(1)
    mean_square_norm = square_sums / counts.clamp(min=1)
    variance = (share * mean_square_norm - share.pow(2) * means.pow(2).sum(dim=1)).sum() / total
    return variance.reshape(1), share.unsqueeze(1) * means


def combination_matrix(variances: torch.Tensor, centroids: torch.Tensor, client: int) -> torch.Tensor:
    """diag(V) + G_i with G_i[j, j'] = ⟨h_i − h_j, h_i − h_j'⟩ (``centroids``: M × C × D)."""
    differences = (centroids[client].unsqueeze(0) - centroids).flatten(1).double()
    return torch.diag(variances.double()) + differences @ differences.t()


def project_to_simplex(vector: np.ndarray) -> np.ndarray:
    """The Euclidean projection onto {α ≥ 0, Σα = 1} (sort-based, Duchi et al. 2008)."""
    ordered = np.sort(vector)[::-1]
    cumulative = np.cumsum(ordered) - 1
    support = int(np.nonzero(ordered - cumulative / np.arange(1, len(vector) + 1) > 0)[0].max())
    return np.maximum(vector - cumulative[support] / (support + 1), 0.0)


def simplex_qp(matrix: torch.Tensor, iterations: int = 100_000, tolerance: float = 1e-12) -> torch.Tensor:
    """argmin αᵀPα over the probability simplex (P symmetric PSD): projected gradient with
    Nesterov momentum (restarted whenever a step would increase the objective), step 1/L with
    L = 2·λ_max(P), float64, until no weight moves by more than ``tolerance``."""
    p = matrix.detach().double().cpu().numpy()
    p = (p + p.T) / 2
    lipschitz = 2 * max(float(np.linalg.eigvalsh(p).max()), 1e-12)
    alpha = np.full(p.shape[0], 1.0 / p.shape[0])
    point, momentum = alpha.copy(), 1.0
    for _ in range(iterations):
        new_alpha = project_to_simplex(point - (2 * p @ point) / lipschitz)
        if momentum > 1 and new_alpha @ p @ new_alpha > alpha @ p @ alpha:
            point, momentum = alpha.copy(), 1.0  # restart: the next step is a plain (monotone) one
            continue
        change = float(np.abs(new_alpha - alpha).max())
        new_momentum = (1 + (1 + 4 * momentum**2) ** 0.5) / 2
        point = new_alpha + (momentum - 1) / new_momentum * (new_alpha - alpha)
        alpha, momentum = new_alpha, new_momentum
        if change < tolerance:
            break
    return torch.from_numpy(alpha)


def combination_weights(variances: torch.Tensor, centroids: torch.Tensor, client: int) -> torch.Tensor:
    """α_i: the QP's solution with weights below 1e-3 dropped and the rest renormalised."""
    alpha = simplex_qp(combination_matrix(variances, centroids, client))
    kept = torch.where(alpha < SMALL_WEIGHT, torch.zeros_like(alpha), alpha)
    return kept / kept.sum() if bool(kept.any()) else alpha  # (all below 1e-3 only past 1000 clients)


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedPACHyperparameters:
    proto_weight: float = option(1.0, "λ: weight of the feature alignment to the global prototypes (the authors' 1).")
    head_epochs: int = option(1, "Epochs of the classifier phase before the body's (the paper's 1).")

    def validate(self) -> None:
        if not self.proto_weight >= 0:
            raise ConfigError(f"--proto-weight must be ≥ 0, got {self.proto_weight}")
        if self.head_epochs < 0:
            raise ConfigError(f"--head-epochs must be ≥ 0, got {self.head_epochs}")


class FedPACProgram(FedProtoProgram):
    capabilities = ProgramCapabilities(model_upload=True)
    prototype_buffers: tuple[str, ...] = ()  # set by make_program

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """Global body and prototypes, the client's classifier — the combined one when the
        server sent it."""
        state = {**received, **private}
        for name in self.layout.private:
            if COMBINED + name in received:
                state[name] = received[COMBINED + name]
        return state

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        head = frozenset(self.layout.private) & frozenset(self.layout.trainable)
        body = frozenset(self.layout.trainable) - head
        return [LocalPhase(self.hparams.head_epochs, head), LocalPhase(self.local.epochs, body)]

    @torch.no_grad()
    def statistics(self, trainer) -> tuple[torch.Tensor, torch.Tensor]:
        """(V_i, h_i) of the train split under the received model (eval mode)."""
        num_classes = trainer.data.num_classes
        totals: list[torch.Tensor] | None = None
        trainer.model.eval()
        for inputs, targets in trainer.epoch():
            with trainer.autocast():  # --precision bf16: the forward as the batch loop's
                trainer.model(inputs)
            representations = self.captured.pop().float()  # type: ignore[union-attr]
            sums, counts = class_sums(representations, targets, num_classes)
            squares, _ = class_sums(representations.pow(2).sum(dim=1, keepdim=True), targets, num_classes)
            batch = [sums, squares.squeeze(1), counts]
            totals = batch if totals is None else [a + b for a, b in zip(totals, batch)]
        trainer.model.train()
        assert totals is not None, "a client without training samples"
        return feature_statistics(*totals)

    def local_update(self, trainer) -> LocalResult:
        """Statistics of the received model, the classifier then the body, then the prototypes."""
        job_program, handle = self.with_capture(trainer)
        try:
            variance, centroids = job_program.statistics(trainer)
            result = standard_local_update(job_program, trainer)
            prototypes, counts = job_program.local_prototypes(trainer)
        finally:
            handle.remove()
        state = trainer.state
        upload = {n: state[n].detach().clone() for n in self.layout.shared if n not in self.prototype_buffers}
        upload.update({HEAD + n: state[n].detach().clone() for n in self.layout.private})
        upload.update(
            {UPLOADED_PROTOTYPES: prototypes, UPLOADED_COUNTS: counts, VARIANCE: variance, CENTROIDS: centroids}
        )
        result.upload = upload
        return result


# ---- server ------------------------------------------------------------------------------
@register_algorithm("fedpac")
class FedPAC(FedProto):
    """Shared body aligned to global prototypes; private classifiers combined by a QP per client."""

    capabilities = Capabilities(received_personal_model=True)

    display_name = "FedPAC"
    paper = "Xu et al., ICLR 2023"
    method_family = "representation"
    hyperparameters = FedPACHyperparameters
    program_class = FedPACProgram
    checkpoint_attributes = ("combined_heads",)
    transient_attributes = ("self_weights",)

    @classmethod
    def nearest_prototype_inference(cls, hparams: Any) -> bool:
        return False  # FedPAC predicts with the (combined) classifier

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module, num_train: list[int]) -> None:
        super().__init__(config, hparams, model, num_train)
        self.combined_heads: dict[str, torch.Tensor] = {}  # "client/name" → combined classifier
        self.self_weights: list[float] = []  # this round's α_ii (a diagnostic)

    def select_shared(self, names: list[str]) -> list[str]:
        """The body and the global prototypes; the final layer's weights are private."""
        prototypes = super().select_shared(names)
        head = f"{self.head_module}."
        return [n for n in names if not n.startswith(head)] + prototypes

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.prototype_buffers = tuple(self.prototype_names())  # type: ignore[attr-defined]
        return program

    def broadcast(self, client_id: int) -> Tensors:
        combined = {
            COMBINED + n: self.combined_heads[f"{client_id}/{n}"]
            for n in self.layout.private
            if f"{client_id}/{n}" in self.combined_heads
        }
        return {**self.global_state, **combined} if combined else self.global_state

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        prototype_buffers = set(self.prototype_names())
        body = [n for n in self.layout.shared if n not in prototype_buffers]
        average = weighted_average([{n: u.params[n] for n in body} for u in updates], sample_weights(updates))
        torch._foreach_copy_([self.global_state[n] for n in average], list(average.values()))
        self.aggregate_prototypes(updates)
        variances = torch.cat([u.params[VARIANCE] for u in updates])
        centroids = torch.stack([u.params[CENTROIDS] for u in updates])
        heads = [{n: u.params[HEAD + n] for n in self.layout.private} for u in updates]
        self.self_weights = []
        for i, update in enumerate(updates):
            alpha = combination_weights(variances, centroids, i).tolist()
            self.self_weights.append(alpha[i])
            for name, tensor in weighted_average(heads, alpha).items():
                self.combined_heads[f"{update.client_id}/{name}"] = tensor

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        """The mean weight α_ii a client's combined classifier gives its own classifier (1: no
        collaboration, 1/M: uniform averaging)."""
        return {"fedpac_self_weight": sum(self.self_weights) / len(self.self_weights)} if self.self_weights else {}

    def new_client_program(self) -> ClientProgram | None:
        return Algorithm.new_client_program(self)  # a fresh classifier on the trained body
