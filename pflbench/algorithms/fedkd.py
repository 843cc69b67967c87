"""FedKD — Wu, Wu, Lyu, Qi, Huang & Xie, "Communication-efficient federated learning via
knowledge distillation", Nature Communications 13, 2032 (2022) (arXiv:2108.13323).

Each client k keeps a private *mentor* (teacher) model θ_t,k and trains, together with it, a
shared *mentee* (student) θ_s that is averaged at the server. On every minibatch both models learn
from the labels and from each other (adaptive mutual distillation):

    L_t^t = CE(y, ŷ_t)            L_t^s = CE(y, ŷ_s)                          (task losses)
    L_d^t = KL(ŷ_s ‖ ŷ_t) / (L_t^t + L_t^s)    L_d^s = KL(ŷ_t ‖ ŷ_s) / (L_t^t + L_t^s)
    L_h^t = L_h^s = MSE(H_t, H_s) / (L_t^t + L_t^s)                          (hidden states)
    L = L_t^t + L_d^t + L_h^t + L_t^s + L_d^s + L_h^s                        (``mutual_distillation_terms``)

ŷ the softmax outputs, KL(p ‖ q) = Σ_c p_c·log(p_c/q_c) averaged over the batch, H the input of
the final classifier layer. The distillation weight 1/(L_t^t + L_t^s) is small while the models
still predict poorly (their soft labels are unreliable) and grows as their task losses fall.

The mentee's update Δ_k = θ_s,k − θ_s is compressed by SVD before it is uploaded
(``--compression svd``, the paper's FedKD; ``none`` uploads the mentee as FedAvg does): each
matrix Δ = U·Σ·Vᵀ keeps its K largest singular values, K the smallest with
Σ_{i≤K} σ_i² ≥ T·Σ_i σ_i² (``kept_rank``), the energy threshold T rising linearly from T_start to
T_end over the run: T(t) = T_start + (t/R)·(T_end − T_start) for round t of R (``energy_threshold``;
``--energy-start`` 0.95 and ``--energy-end`` 0.98, the paper's). The server rebuilds each Δ_k from its
factors, averages them sample-weighted and adds the mean to θ_s.

Choices the paper leaves open, and what the authors' code (wuch15/FedKD, news recommendation
with BERT) and PFLlib (``clientkd``/``serverkd``) do:

- Mentee architecture. The paper's mentee is a smaller model (a 4-layer vs a 12-layer BERT). Here
  the mentee is the run's ``--model`` and the mentor the same architecture (a ``--mentee-model``
  would need a second zoo model inside the client program; not offered), as in PFLlib, which
  also uses one architecture. Both start from the run's initial weights (PFLlib does the same), so
  in a client's first round they stay equal (L is symmetric; the KL and hidden terms are 0) until the
  mentee it receives is the average of other clients' mentees.
- Gradients. The authors' code minimises the sum L of both models' losses with one optimizer and
  nothing detached (the KL targets and the adaptive weight carry gradients); we do the same. The
  authors' ``nn.KLDivLoss()`` averages over batch *and classes* (KL/C); we use the KL per sample
  (``batchmean``), the paper's KL.
- Hidden-state loss. The authors' code takes the MSE between the mentee's layers and every third
  mentor layer (hidden states and attention maps, no projection; the paper's W_h maps widths when
  they differ). With one architecture, H is the input of the final classifier layer (as in PFLlib,
  whose projection W_h is square); no projection is needed. ``--hidden-weight`` scales L_h (1 =
  the paper's; 0 switches it off).
- Compression. The authors compress the update of each ≥ 2-D tensor (PFLlib compresses the
  parameters themselves, batching SVDs over conv kernel positions); we compress the update,
  flattening a conv kernel to out × (in·kh·kw). A tensor whose factors (K·(m + n + 1) numbers)
  would not be smaller than the dense update is sent dense (exact and cheaper), as are 1-D tensors.
  The authors' server also compresses the aggregated update it sends down, which only works while
  every client holds the previous global mentee (they train all clients every round); with client
  sampling a returning client would miss updates, so here the server sends the full mentee
  (bytes_down count it) and only the uplink is compressed. The authors average uniformly (their
  clients hold equal data); we weight by n_k as FedAvg does.
- Optimizer: the run's local optimizer over both models, fresh every round (the engine's
  convention); ``--max-grad-norm`` clips each model's gradient separately.

State and bytes: shared = the mentee (model tensors and float buffers); private, never sent = the
mentor (``fedkd.mentor.<name>``, one full model per client). Up: the compressed factors (``svd``)
or the mentee (``none``); down: the mentee. Evaluation: ``pers_acc`` uses each client's mentor (the
model that stays with the client and which PFLlib evaluates); ``global_acc`` the mentee.

Defaults: the paper's — ``--compression svd`` (its energy thresholds above) and the hidden-state
loss at weight 1 (``--hidden-weight``; 0 switches it off).

New clients (``--new-clients``): a new client has no mentor; it is served by the global mentee as
it is (with ``--finetune-epochs E`` also fine-tuned: ``new_acc_ft``). The local update is its own
loop (two models), so ``--executor vmap`` and ``--dp`` refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    LocalResult,
    ParamLayout,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import LocalTrainer, mean_terms
from pflbench.engine.types import sample_weights, weighted_average
from pflbench.models.zoo import head_module_names

if TYPE_CHECKING:
    from pflbench.config.groups import LocalSpec

MENTOR = "fedkd.mentor."  # the client's private mentor model
FACTOR_U, FACTOR_S, FACTOR_V = "fedkd.u.", "fedkd.s.", "fedkd.v."  # Δ ≈ U·diag(S)·Vᵀ, uploaded
DENSE = "fedkd.delta."  # an update sent as it is, uploaded
TERM_WEIGHTS = {"distill_mentor": 1.0, "distill_mentee": 1.0}  # + "hidden": 2·--hidden-weight


# ---- the math ----------------------------------------------------------------------------
def mutual_distillation_terms(
    mentor_logits: torch.Tensor,
    mentee_logits: torch.Tensor,
    mentor_hidden: torch.Tensor | None,
    mentee_hidden: torch.Tensor | None,
    targets: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The named terms of L: task losses, KL(ŷ_s ‖ ŷ_t)/(L_t^t + L_t^s) for the mentor,
    KL(ŷ_t ‖ ŷ_s)/(…) for the mentee, and MSE(H_t, H_s)/(…) (counted once; L has it twice)."""
    mentor_task = F.cross_entropy(mentor_logits, targets)
    mentee_task = F.cross_entropy(mentee_logits, targets)
    scale = mentor_task + mentee_task
    mentor_log, mentee_log = F.log_softmax(mentor_logits, dim=1), F.log_softmax(mentee_logits, dim=1)
    terms = {
        "task_mentor": mentor_task,
        "task_mentee": mentee_task,
        "distill_mentor": F.kl_div(mentor_log, mentee_log, reduction="batchmean", log_target=True) / scale,
        "distill_mentee": F.kl_div(mentee_log, mentor_log, reduction="batchmean", log_target=True) / scale,
    }
    if mentor_hidden is not None and mentee_hidden is not None:
        terms["hidden"] = F.mse_loss(mentor_hidden, mentee_hidden) / scale
    return terms


def energy_threshold(round_index: int, rounds: int, start: float, end: float) -> float:
    """T(t) = T_start + (t/R)·(T_end − T_start) for round t of R (the authors' schedule)."""
    return start + (round_index / rounds) * (end - start)


def kept_rank(singular_values: torch.Tensor, energy: float) -> int:
    """The smallest K ≥ 1 with Σ_{i≤K} σ_i² ≥ energy·Σ σ_i² (σ sorted descending); at most all."""
    squares = singular_values.double().pow(2)
    cumulative = squares.cumsum(0)
    reached = (cumulative >= energy * cumulative[-1]).nonzero()
    return int(reached[0]) + 1 if len(reached) else len(singular_values)


def compress_update(name: str, update: torch.Tensor, energy: float) -> Tensors:
    """The tensors that carry ``update``: SVD factors truncated by ``kept_rank`` for a ≥ 2-D
    tensor when they are fewer numbers than the update, else the update itself."""
    if update.dim() < 2 or min(update.shape[0], update[0].numel()) < 2:
        return {DENSE + name: update}
    matrix = update.reshape(update.shape[0], -1)
    left, values, right = torch.linalg.svd(matrix, full_matrices=False)
    if not bool(values.any()):  # a zero update: its rank is 0
        return {DENSE + name: update}
    rank = kept_rank(values, energy)
    rows, columns = matrix.shape
    if rank * (rows + columns + 1) >= rows * columns:
        return {DENSE + name: update}
    return {
        FACTOR_U + name: left[:, :rank].contiguous(),
        FACTOR_S + name: values[:rank].contiguous(),
        FACTOR_V + name: right[:rank].contiguous(),
    }


def decompress_update(name: str, upload: Tensors, shape: torch.Size) -> torch.Tensor:
    """The update ``compress_update`` sent: U·diag(S)·Vᵀ reshaped, or the dense tensor."""
    if DENSE + name in upload:
        return upload[DENSE + name]
    left, values, right = upload[FACTOR_U + name], upload[FACTOR_S + name], upload[FACTOR_V + name]
    return ((left * values) @ right).reshape(shape)


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedKDHyperparameters:
    compression: str = option(
        "svd",
        "Mentee upload: svd (the update's SVD factors at the energy threshold, the paper's FedKD) "
        "or none (the mentee as it is).",
        choices=("svd", "none"),
    )
    energy_start: float = option(0.95, "T_start: energy kept by the SVD in the first rounds (the paper's 0.95).")
    energy_end: float = option(0.98, "T_end: energy kept by the SVD in the last round (the paper's 0.98).")
    hidden_weight: float = option(1.0, "Weight of the adaptive hidden-state loss (1: the paper's; 0: off).")

    def validate(self) -> None:
        for name in ("energy_start", "energy_end"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(self, name)}")
        if not self.hidden_weight >= 0:
            raise ConfigError(f"--hidden-weight must be ≥ 0, got {self.hidden_weight}")


class FedKDProgram(ClientProgram[FedKDHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the final classifier layer; H is its input (make_program)
    rounds: int = 1  # R of the energy schedule (make_program)

    def __init__(self, layout: ParamLayout, hparams: FedKDHyperparameters, local: LocalSpec) -> None:
        super().__init__(layout, hparams, local)
        self.loss_weights = {**TERM_WEIGHTS, "hidden": 2.0 * hparams.hidden_weight}

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        return {n: t for n, t in {**received, **private}.items() if not n.startswith(MENTOR)}

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        """Mutual distillation of the mentee (the live model) and the mentor (its own tensors,
        through ``functional_call``) over ``--local-epochs`` epochs; then the mentee's upload."""
        job, spec = trainer.job, self.optimizer()
        names = self.layout.shared + self.layout.private
        mentor = {n: job.private[MENTOR + n].clone() for n in names}
        mentor_params = {n: mentor[n].requires_grad_(True) for n in self.layout.trainable}
        mentee_params = trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)
        everything: dict[str, Any] = {**mentee_params, **{MENTOR + n: p for n, p in mentor_params.items()}}
        optimizer = trainer.optimizer(spec, everything)  # one optimizer over both models, as the authors
        captured: list[torch.Tensor] = []
        hook = trainer.model.get_submodule(self.head_module).register_forward_pre_hook(
            lambda module, args: captured.append(args[0])
        )
        hidden = self.hparams.hidden_weight > 0
        total, steps = torch.zeros((), device=trainer.device), 0
        sums: dict[str, torch.Tensor] = {}
        trainer.model.train()
        try:
            for _ in range(self.local.epochs):
                for inputs, targets in trainer.epoch():
                    if steps == job.max_steps:
                        break
                    with trainer.autocast():  # --precision bf16: forwards and losses, as the batch loop
                        mentee_logits = trainer.model(inputs)
                        mentee_hidden = captured.pop()
                        mentor_logits = functional_call(trainer.model, mentor, (inputs,))
                        mentor_hidden = captured.pop()
                        terms = mutual_distillation_terms(
                            mentor_logits,
                            mentee_logits,
                            mentor_hidden if hidden else None,
                            mentee_hidden if hidden else None,
                            targets,
                        )
                        loss = sum(self.loss_weights.get(n, 1.0) * t for n, t in terms.items())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()  # type: ignore[union-attr]
                    if spec.max_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(list(mentee_params.values()), spec.max_grad_norm)
                        torch.nn.utils.clip_grad_norm_(list(mentor_params.values()), spec.max_grad_norm)
                    optimizer.step()
                    total += loss.detach()  # type: ignore[union-attr]
                    for n, value in terms.items():
                        sums[n] = sums[n] + value.detach() if n in sums else value.detach()
                    steps += 1
        finally:
            hook.remove()
        result = mean_terms(total, sums, steps)
        result.upload = self.mentee_upload(trainer.state, job.received, job.round)
        result.private = {MENTOR + n: t.detach().clone() for n, t in mentor.items()}
        return result

    @torch.no_grad()
    def mentee_upload(self, state: Tensors, received: Tensors, round_index: int) -> Tensors:
        if self.hparams.compression == "none":
            return self.upload(state, received)
        energy = energy_threshold(round_index, self.rounds, self.hparams.energy_start, self.hparams.energy_end)
        upload: Tensors = {}
        for name in self.layout.shared:
            upload.update(compress_update(name, state[name].detach() - received[name], energy))
        return upload


# ---- server ------------------------------------------------------------------------------
@register_algorithm("fedkd")
class FedKD(Algorithm[FedKDHyperparameters]):
    """A shared mentee averaged from SVD-compressed updates; a private mentor per client; mutual KD."""

    display_name = "FedKD"
    paper = "Wu et al., Nature Communications 2022"
    method_family = "distillation"
    hyperparameters = FedKDHyperparameters
    program_class = FedKDProgram
    # the mentor trains beside the mentee; the upload is compressed
    capabilities = Capabilities(same_broadcast=True, averaged_upload=False)

    @classmethod
    def check_config(cls, config: RunConfig, hparams: FedKDHyperparameters) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"fedkd's hidden-state loss reads the final layer's input; --head-layers {config.head_layers} "
                "would be ignored (leave it at 1)"
            )

    @classmethod
    def inert_hyperparameters(cls, config: RunConfig, hparams: FedKDHyperparameters) -> dict[str, str]:
        """The energy schedule only sets the SVD's rank."""
        if hparams.compression == "none":
            why = "--compression none uploads the mentee as it is, with no SVD (--compression svd reads it)"
            return {"energy_start": why, "energy_end": why}
        return {}

    def __init__(
        self, config: RunConfig, hparams: FedKDHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module, program.rounds = self.head_module, self.config.rounds  # type: ignore[attr-defined]
        return program

    def extra_private_state(self) -> Tensors:
        """The mentor starts from the initial model (as the mentee does)."""
        names = list(self.layout.shared) + list(self.layout.private)
        return {MENTOR + n: self.initial_state[n].detach().clone() for n in names}

    def personal_model(self, client_id: int) -> Tensors:
        """The client's mentor."""
        state = self.store.get(client_id)
        return {n[len(MENTOR) :]: t for n, t in state.items() if n.startswith(MENTOR)}

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """θ_s ← θ_s + Σ_k (n_k/Σn)·Δ_k (rebuilt from the factors), or FedAvg without compression."""
        if not updates:
            return
        if self.hparams.compression == "none":
            super().aggregate(updates)
            return
        shared = self.layout.shared
        deltas = [{n: decompress_update(n, u.params, self.global_state[n].shape) for n in shared} for u in updates]
        mean = weighted_average(deltas, sample_weights(updates))
        torch._foreach_add_([self.global_state[n] for n in shared], [mean[n] for n in shared])

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        if self.hparams.compression == "none" or not updates or not updates[0].params:
            return {}
        dense = sum(t.numel() for t in self.global_state.values())
        sent = [sum(t.numel() for t in u.params.values()) for u in updates]
        return {"fedkd_upload_fraction": sum(sent) / (dense * len(sent))}

    def run_info(self) -> dict[str, Any]:
        return {"fedkd_hidden_state": f"input of {self.head_module}", "fedkd_mentee": "the run's --model"}
