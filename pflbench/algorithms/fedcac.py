"""FedCAC — Wu, Liu, Zhang, Wang, Liu & Sun, "Bold but Cautious: Unlocking the Potential of
Personalized Federated Learning through Cautiously Aggressive Collaboration", ICCV 2023
(arXiv:2309.11103).

Every client k keeps its own model θ_k. After its local training (``--local-epochs`` of the run's
optimizer from the model it received, θ_k^start) it scores each parameter's sensitivity with the
paper's first-order estimate, the update times the parameter (the authors' code: Δθ stands for
the gradient),

    s_k = |(θ_k − θ_k^start) ⊙ θ_k|                                       (``sensitivity``)

and marks as *critical* the top τ fraction of every parameter tensor (``critical_mask``):
m_k = [s_k ≥ ν], ν the ⌊τ·numel⌋-th largest score of the tensor (none when ⌊τ·numel⌋ = 0); when
ν ≤ 1e-10 the smallest score > 1e-20 replaces it (the authors' guard against a tensor that barely
moved). It uploads θ_k and m_k. Over the round's clients the server measures how much the
critical positions of two clients overlap,

    o_kj = 1 − ‖m_k − m_j‖₁ / (2·‖m_k‖₁)                                  (``overlap_matrix``)

and, with ō and o_max the mean and the maximum over the ordered pairs k ≠ j, a threshold that
rises with the round t (``collaboration_threshold``)

    ν_t = ō + (t / β)·(o_max − ō)

so that client k's collaboration set is C_k = {k} ∪ {j : o_kj ≥ ν_t} (``collaboration_sets``):
many clients early, only close ones later, none but itself once t ≥ β. The server forms

    θ̄ = Σ_j n_j·θ_j / Σ_j n_j          (the global model: FedAvg over the round's uploads)
    θ̃_k = (1/|C_k|)·Σ_{j ∈ C_k} θ_j     (k's customized global model: a plain mean)

and client k starts its next round from (``combine``)

    θ_k ← m_k ⊙ θ̃_k + (1 − m_k) ⊙ θ̄:

its critical parameters collaborate only with clients whose critical parameters sit where its
own do, its non-critical ones with everyone.

Defaults: τ = 0.5 and β = 100 (``--tau``, ``--beta``: the authors' CIFAR-10 configuration in their
FLing code; β is an integer there, as here). Where they come from for the rest: the top-τ rule
per tensor, the 1e-10/1e-20 guard, the overlap, the threshold (t counts from 1 at the first
aggregation, the authors' ``epoch + 1``) and the plain mean θ̃_k follow the authors' code and
PFLlib's ``servercac.py``; θ̄ is sample-weighted as PFLlib's ``aggregate_parameters``.

Choices the paper leaves open, and what this file does:

- Masks and mixing cover the trainable parameters; float buffers (BatchNorm statistics) stay each
  client's own (private), as in the authors' code, which mixes ``named_parameters`` only.
- Overlaps, the threshold and θ̃_k are computed over the round's reporting clients (PFLlib: the
  selected clients). A client not in the round keeps its last mask and θ̃_k and combines them
  with the newest θ̄ when it is next sampled (PFLlib's ``set_parameters``). With one reporting
  client C_k = {k}. When ‖m_k‖₁ = 0 (τ so small that no tensor has a critical entry) o_kj = 0.
- t is the number of rounds in which clients reported (the round number under full
  availability): the server hook ``aggregate`` is not told the round (an engine limitation).
- Transport: the paper sends θ̃_k and θ̄ and the client combines them with its mask; here the
  server holds the uploaded masks and sends the combination (the same numbers, one model down
  instead of two). bytes_up: θ_k plus the mask (one byte per parameter).

Evaluation: ``pers_acc`` uses m_k ⊙ θ̃_k + (1 − m_k) ⊙ θ̄ with k's own buffers (the model it
starts its next round from, PFLlib's evaluation); a client never trained uses θ̄. ``global_acc``
uses θ̄ with the initial buffers. (Each client is evaluated with its own mixed model: until
2026-11-28 the engine's one-pass shortcut for algorithms without private tensors evaluated every
client with θ̄, so FedCAC's pers_acc was its global model's; runs from before are stale.) New clients (``--new-clients``): the paper has no rule; a new
client has no mask, so it trains θ̄ for ``--local-epochs`` epochs on its train split (its first
round's local update) and is tested with the result (``FineTuneProgram``).

Executors: the local update is the engine's batch loop (the mask is computed in ``upload``), so
``--executor vmap`` hosts it. Refused: ``--dp``, model poisoning and ``--robust-agg`` (the upload
carries the mask and the customized models read every raw upload, not one averaged update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    Choice,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    Dimension,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import FineTuneProgram, weighted_average

MASK = "fedcac.mask."  # uploaded: the client's critical-parameter mask (bool) per parameter tensor
ZERO_THRESHOLD = 1e-10  # the authors' guard: a threshold this small is replaced by ...
NONZERO = 1e-20  # ... the smallest score above this


# ---- the math ----------------------------------------------------------------------------
def sensitivity(trained: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """s = |(θ − θ^start) ⊙ θ|: the update as the gradient's stand-in, times the parameter."""
    return ((trained - start) * trained).abs()


def critical_mask(score: torch.Tensor, tau: float) -> torch.Tensor:
    """The top ⌊τ·numel⌋ scores of one tensor (ties at the threshold included) as a bool mask;
    a threshold ≤ 1e-10 is replaced by the smallest score > 1e-20 (if any)."""
    flat = score.reshape(-1)
    count = int(tau * flat.numel())
    if count == 0:
        return torch.zeros_like(score, dtype=torch.bool)
    threshold = torch.topk(flat, count).values[-1]
    if threshold <= ZERO_THRESHOLD:
        nonzero = flat[flat > NONZERO]
        if nonzero.numel():
            threshold = nonzero.min()
    return score >= threshold


def overlap_matrix(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """o_kj = 1 − ‖m_k − m_j‖₁ / (2·‖m_k‖₁) for flattened 0/1 masks (float64; diagonal 1; a row
    whose mask is empty is 0 off the diagonal)."""
    stacked = torch.stack([m.reshape(-1).to(torch.float64) for m in masks])
    differences = torch.cdist(stacked, stacked, p=1)  # ‖m_k − m_j‖₁
    sizes = stacked.sum(dim=1, keepdim=True)
    overlap = torch.where(sizes > 0, 1 - differences / (2 * sizes.clamp(min=1)), torch.zeros_like(differences))
    overlap.fill_diagonal_(1.0)
    return overlap


def collaboration_threshold(overlap: torch.Tensor, round_index: int, beta: int) -> float:
    """ν_t = ō + (t/β)·(o_max − ō) over the ordered pairs k ≠ j (needs ≥ 2 clients)."""
    n = overlap.shape[0]
    off = overlap[~torch.eye(n, dtype=torch.bool)]
    mean, largest = float(off.mean()), float(off.max())
    return mean + round_index / beta * (largest - mean)


def collaboration_sets(overlap: torch.Tensor, round_index: int, beta: int) -> list[list[int]]:
    """C_k = {k} ∪ {j ≠ k : o_kj ≥ ν_t}, as sorted positions; {k} alone for a single client."""
    n = overlap.shape[0]
    if n < 2:
        return [[k] for k in range(n)]
    threshold = collaboration_threshold(overlap, round_index, beta)
    return [sorted({k} | {j for j in range(n) if j != k and float(overlap[k, j]) >= threshold}) for k in range(n)]


def combine(mask: Tensors, customized: Tensors, global_model: Tensors) -> Tensors:
    """m ⊙ θ̃ + (1 − m) ⊙ θ̄ per tensor."""
    return {n: torch.where(mask[n], customized[n], global_model[n]) for n in mask}


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedCACHyperparameters:
    tau: float = option(0.5, "τ: fraction of each parameter tensor marked critical (authors' CIFAR-10 config: 0.5).")
    beta: int = option(
        100, "β: the collaboration threshold rises from the mean to the max overlap over β rounds (authors: 100)."
    )

    def validate(self) -> None:
        if not 0 < self.tau <= 1:
            raise ConfigError(f"--tau must be in (0, 1], got {self.tau}")
        if self.beta < 1:
            raise ConfigError(f"--beta must be an integer ≥ 1, got {self.beta}")


class FedCACProgram(ClientProgram[FedCACHyperparameters]):
    """The engine's batch loop; the upload adds the critical mask of the trained parameters."""

    capabilities = ProgramCapabilities(batch_loop=True)

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        upload = {n: state[n].detach().clone() for n in self.layout.shared}
        for n in self.layout.shared:
            score = sensitivity(state[n].detach(), received[n])
            upload[MASK + n] = critical_mask(score, self.hparams.tau)
        return upload


# ---- server ------------------------------------------------------------------------------
@register_algorithm("fedcac")
class FedCAC(Algorithm[FedCACHyperparameters]):
    """Critical parameters (|Δθ ⊙ θ|, top τ) mixed with like-masked clients, the rest with all."""

    display_name = "FedCAC"
    paper = "Wu et al., ICCV 2023"
    method_family = "decoupling"
    hyperparameters = FedCACHyperparameters
    program_class = FedCACProgram
    # the mask travels, and θ̃_k reads every raw upload
    capabilities = Capabilities(received_personal_model=True, averaged_upload=False)
    checkpoint_attributes = ("masks", "customized", "rounds_done")
    transient_attributes = ("last_sets",)  # this round's collaboration sets, for rounds.jsonl only

    @classmethod
    def search_space(cls, config: RunConfig, hparams: FedCACHyperparameters) -> dict[str, Dimension]:
        """lr around its default; τ and β over the values the paper's sensitivity study covers."""
        return {
            **super().search_space(config, hparams),
            "tau": Choice((0.1, 0.3, 0.5, 0.7, 0.9)),
            "beta": Choice((10, 50, 100, 170, 250)),
        }

    def __init__(self, config, hparams: FedCACHyperparameters, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        self.masks: dict[str, torch.Tensor] = {}  # "k/name": client k's latest critical mask
        self.customized: dict[str, torch.Tensor] = {}  # "k/name": client k's latest θ̃_k
        self.rounds_done = 0
        self.last_sets: list[int] = []

    def select_shared(self, names: list[str]) -> list[str]:
        """The trainable parameters travel (masked); float buffers stay each client's own."""
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return [n for n in names if n in trainable]

    def client_tensors(self, store: dict[str, torch.Tensor], client_id: int) -> Tensors | None:
        prefix = f"{client_id}/"
        names = self.layout.shared
        if not names or prefix + names[0] not in store:
            return None
        return {n: store[prefix + n] for n in names}

    def broadcast(self, client_id: int) -> Tensors:
        """m_k ⊙ θ̃_k + (1 − m_k) ⊙ θ̄; θ̄ for a client that has no mask yet."""
        mask = self.client_tensors(self.masks, client_id)
        customized = self.client_tensors(self.customized, client_id)
        if mask is None or customized is None:
            return self.global_state
        return combine(mask, customized, self.global_state)

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        names = self.layout.shared
        models = [{n: u.params[n] for n in names} for u in updates]
        masks = [{n: u.params[MASK + n] for n in names} for u in updates]
        total = sum(u.num_samples for u in updates)
        average = weighted_average(models, [u.num_samples / total for u in updates])
        for n in names:
            self.global_state[n].copy_(average[n])
        self.rounds_done += 1
        overlap = overlap_matrix([torch.cat([m[n].reshape(-1) for n in names]) for m in masks])
        sets = collaboration_sets(overlap, self.rounds_done, self.hparams.beta)
        for update, members, mask in zip(updates, sets, masks):
            customized = weighted_average([models[j] for j in members], [1.0 / len(members)] * len(members))
            for n in names:
                self.masks[f"{update.client_id}/{n}"] = mask[n].detach().clone()
                self.customized[f"{update.client_id}/{n}"] = customized[n].detach().clone()
        self.last_sets = [len(members) for members in sets]

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        """|C_k| of the round's clients (mean, max): 1 = no collaboration on critical parameters."""
        sizes, self.last_sets = self.last_sets, []
        if not sizes:
            return {}
        return {"fedcac_collaborators_mean": sum(sizes) / len(sizes), "fedcac_collaborators_max": max(sizes)}

    def new_client_program(self) -> ClientProgram:
        """No mask yet: θ̄ trained for ``--local-epochs`` epochs, as in a client's first round."""
        return FineTuneProgram(self.layout.trainable, self.config.local_spec, self.config.local_epochs)
