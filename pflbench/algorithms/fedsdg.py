"""FedSDG — Federated Structure-Decoupled Gating (design notes: seeds 000_*, 001_*; SPEC §4).

LoRA fine-tuning of a frozen pretrained transformer. Every adapted layer in block l carries a
shared pair (A, B) and a private pair (A_p, B_p) of the same shapes; block l has one gate
logit a_l (``lambda_k_logit``), m_l = sigmoid(a_l), init a = 0 → m = 0.5. The layer computes
W + s·(B·A + m_l·B_p·A_p), s = α/r. θ_g = shared LoRA + head travels; θ_p and the gates stay
on the client forever.

Local loss: CE + λ₁·Σ_l |m_l| (or Σ_l min(m_l, 1 − m_l) with ``--gate-penalty bilateral``)
+ λ₂·‖θ_p‖²; Adam with three groups (shared ``--lr``, private ``--lr-private``, gates
``--lr-gate``), no weight decay, gradient clipping (``--max-grad-norm``, 1.0 unless set).
``rounds.jsonl`` logs the raw terms as ``loss_task``, ``loss_gate_penalty``,
``loss_private_penalty``. Server (``--server-agg``): alignment-weighted aggregation of the shared
updates (``alignment``, the default: ``fedsdg_server_aggregate``), or for ablations ``fedavg``,
the uniform mean θ ← (1/M)·Σ_k θ_k of the M uploads — FedAvg as design note 001 defines it and
the authors' code computes it — or ``fedavg-weighted``, the sample-weighted mean Σ_k n_k·θ_k/Σn.
Until issue 23 ``fedavg`` meant the sample-weighted mean: runs with ``--server-agg fedavg`` now
give other numbers (intended; ``fedavg-weighted`` gives the old ones).

The authors' released code departs from their own design notes in five places, and ships other
defaults; this implementation follows the notes (the departures are documented, not adopted):

1. gates: one per adapted *layer* there, one per transformer *block* here (notes: "每个
   Transformer 块一个门控", one gate for the block's attention and MLP adaptation);
2. private branch init: A_p ~ N(0, 1/r), B_p ~ N(0, 0.01²) there; here A_p = 0 and a tiny B_p
   ~ N(0, (1e-4)²), so that B_p·A_p = 0 and ‖θ_p‖² ≈ 0 at the start as the notes require
   ("private_penalty ≈ 0.0, because the private parameters start at 0"), while A_p still gets a
   gradient (B_p ≠ 0). ``--private-init authors`` draws theirs (A_p variance 1/r, i.e. std
   r^−½; the only departure offered as an option: on 30 rounds, α = 0.1, 3 seeds it moved
   pers_acc by +2.5 points and global_acc by −4 points, same sign in every seed);
3. the shared A: N(0, 1/r) there, the suite's LoRA init (``pflbench.models.lora``) here;
4. weight decay 1e-4 on every parameter there; none here (the notes: "❌ weight_decay ≠ λ₂",
   λ₂ acts on the private parameters only);
5. the alignment mean Δ̄: leave-one-out (the mean of the *other* clients' updates) there; the mean
   of all M updates here (note 001's formula).

Their shipped defaults: uniform FedAvg aggregation (``--server-agg fedavg`` here), λ₁ = 0.01,
λ₂ = 1e-3, gate lr 0.1, gate logit init −2 (m ≈ 0.12); here the notes' values: alignment
aggregation, λ₁ = 1e-3, λ₂ = 1e-4, ``--lr-gate`` 1e-2, logit 0 (m = 0.5). ``--lr-private`` 1e-3
(η_p) and ``--gate-penalty l1`` are the notes' too; ``--agg-epsilon`` ε = 1e-8 is this suite's
guard against a zero norm in the alignment weights (it moves no weight at ordinary norms).

The private penalty ‖θ_p‖²: its definition is the notes' (Σ of squares of every ``*_private``
tensor, unnormalised, no ½), and its start is ≈ 0 as they say (A_p = 0; B_p contributes
(1e-4)² per element, about 1e-4 in all for the default ViT). The notes' "should stay small
(< 0.1)" is not met under Adam, and that is the optimizer's dynamics, not a scale error: Adam
moves every coordinate by up to ``--lr-private`` per step whatever the size of its gradient, so
after t steps ‖θ_p‖² can reach about N·(t·η_p)² for N private coordinates, and λ₂ = 1e-4 pulls
back with a gradient 2λ₂θ_p that is tiny against the task gradient until the elements are large.
Measured (default ViT, 21.5k private parameters, digits, 10 clients, α = 0.1, 5 sampled per
round, random backbone, seed 0, one thread; mean ``loss_private_penalty`` of rounds 1 / 2 / 3):
defaults 0.030 / 0.224 / 0.652; ``--lr-private 1e-4`` 0.0006 / 0.0035 / 0.0100 (1/65: quadratic in
η_p); ``--lambda2 1e-3`` 0.026 / 0.207 / 0.612 (−6%); ``--private-init authors`` 1889 / 1884 / 1873
(A_p's variance 1/r alone gives ≈ N_A/r). No change to the definition or the init was made.

New clients (``--new-clients``): the shared model θ_g (frozen) with a fresh private branch and
gates (their initial values, m = 0.5) trained on the client's train split for ``--local-epochs``
epochs with FedSDG's own loss and optimizer groups (``FedSDGNewClientProgram``).
"""

from __future__ import annotations

import math
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
    OptimizerSpec,
    ParamGroup,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.config.lora import DEFAULT_RANK
from pflbench.engine import sample_weights, weighted_average
from pflbench.models.lora import LoRALinear, apply_lora, lora_layers, parse_targets

PRIVATE_B_INIT_STD = 1e-4  # B_p small and A_p = 0: ΔW_p = 0, ‖θ_p‖² ≈ 0, A_p still gets gradient
FALLBACK_THRESHOLD = 1e-6


def alignment_weights(
    deltas_dot_mean: torch.Tensor, delta_norms: torch.Tensor, mean_norm: torch.Tensor, epsilon: float = 1e-8
) -> tuple[torch.Tensor, bool]:
    """w_k = α_k / (Σ_j α_j + ε), α_k = max(0, ⟨Δ_k, Δ̄⟩ / (‖Δ_k‖·‖Δ̄‖ + ε)); uniform if Σα < 1e-6."""
    scores = (deltas_dot_mean / (delta_norms * mean_norm + epsilon)).clamp_min(0)
    total = scores.sum()
    if float(total) < FALLBACK_THRESHOLD:
        return torch.full_like(scores, 1 / len(scores)), True
    return scores / (total + epsilon), False


@torch.no_grad()
def fedsdg_server_aggregate(
    global_params: Tensors, client_params: list[Tensors], epsilon: float = 1e-8, return_weights: bool = True
):
    """θ ← θ + Σ_k w_k Δ_k over the flattened shared vector, Δ_k = θ_k − θ (seed 001, SPEC §4).

    Streams over the clients (no M × d matrix): Δ̄ = mean_k θ_k − θ; then per client ⟨Δ_k, Δ̄⟩
    and ‖Δ_k‖ from one temporary Δ_k. No clients: unchanged, []; one client: its params, [1.0].
    Returns ``(new_params, weights)`` or just ``new_params``.
    """
    result, weights, _ = _aggregate(global_params, client_params, epsilon)
    return (result, weights) if return_weights else result


def _aggregate(
    global_params: Tensors, client_params: list[Tensors], epsilon: float
) -> tuple[Tensors, list[float], bool]:
    names = list(global_params)
    if not client_params:
        return {n: global_params[n].clone() for n in names}, [], False
    if len(client_params) == 1:
        return {n: client_params[0][n].clone() for n in names}, [1.0], False
    base = [global_params[n] for n in names]
    mean_delta = [torch.zeros_like(t) for t in base]
    for params in client_params:
        torch._foreach_add_(mean_delta, [params[n] for n in names])
    torch._foreach_div_(mean_delta, len(client_params))
    torch._foreach_sub_(mean_delta, base)
    mean_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(mean_delta)))
    dots, norms = [], []
    for params in client_params:
        delta = torch._foreach_sub([params[n] for n in names], base)
        dots.append(sum((d * m).sum() for d, m in zip(delta, mean_delta)))
        norms.append(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(delta))))
    weights, fell_back = alignment_weights(torch.stack(dots), torch.stack(norms), mean_norm, epsilon)
    weight_list = weights.tolist()
    result = [t.clone() for t in base]
    for params, weight in zip(client_params, weight_list):
        if weight:
            delta = torch._foreach_sub([params[n] for n in names], base)
            torch._foreach_add_(result, delta, alpha=weight)
    return dict(zip(names, result)), weight_list, fell_back


def fedavg_weights(updates: list[ClientUpdate], rule: str) -> list[float]:
    """``fedavg``: 1/M each (the mean of design note 001 and of the authors' code);
    ``fedavg-weighted``: n_k / Σ_j n_j (sample-weighted, FedAvg's usual rule)."""
    if rule == "fedavg-weighted":
        return sample_weights(updates)
    return [1 / len(updates)] * len(updates) if updates else []


AUTHORS_B_PRIVATE_STD = 0.01  # --private-init authors: B_p ~ N(0, 0.01²), A_p ~ N(0, 1/r)


@torch.no_grad()
def authors_private_init(model: nn.Module, rank: int) -> None:
    """The released code's private branch: A_p ~ N(0, 1/r) (variance 1/r), B_p ~ N(0, 0.01²),
    drawn from the global generator (seeded with the run's model seed), layer by layer."""
    for layer in lora_layers(model).values():
        if isinstance(layer, GatedLoRALinear):
            layer.lora_A_private.normal_(0.0, rank**-0.5)
            layer.lora_B_private.normal_(0.0, AUTHORS_B_PRIVATE_STD)


def weight_statistics(weights: list[float]) -> dict[str, float]:
    """Mean, std, min, max, number of (near-)zero weights and entropy −Σ w log w."""
    w = np.asarray(weights, dtype=float)
    positive = w[w > 0]
    return {
        "agg_weight_mean": float(w.mean()),
        "agg_weight_std": float(w.std()),
        "agg_weight_min": float(w.min()),
        "agg_weight_max": float(w.max()),
        "agg_weight_zeros": int((w < FALLBACK_THRESHOLD).sum()),
        "agg_weight_entropy": float(-(positive * np.log(positive)).sum()),
    }


class BlockGate(nn.Module):
    """One learnable gate logit per transformer block; m = sigmoid(lambda_k_logit)."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__()
        self.lambda_k_logit = nn.Parameter(torch.zeros((), device=device))

    def forward(self) -> torch.Tensor:
        return torch.sigmoid(self.lambda_k_logit)


class GatedLoRALinear(LoRALinear):
    """LoRA with a second, private pair: W + s·(B·A + m·B_p·A_p), m from the block's gate."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__(base, rank, alpha)
        self.lora_A_private = nn.Parameter(torch.zeros_like(self.lora_A))
        self.lora_B_private = nn.Parameter(torch.randn_like(self.lora_B) * PRIVATE_B_INIT_STD)
        self.__dict__["gate"] = None  # the block's BlockGate, linked (not owned) by attach_gates

    def gate_value(self) -> torch.Tensor:
        return self.gate()

    def adapter(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch(x, self.lora_A, self.lora_B) + self.gate_value() * self.branch(
            x, self.lora_A_private, self.lora_B_private
        )

    def delta_weight(self) -> torch.Tensor:
        return self.branch_delta(self.lora_A, self.lora_B) + self.gate_value() * self.branch_delta(
            self.lora_A_private, self.lora_B_private
        )


def attach_gates(model: nn.Module) -> list[str]:
    """One BlockGate per transformer block (``blocks.N.gate``), linked to its gated layers.

    Layers outside ``blocks.N`` (e.g. an mlp's) get a gate each (``<parent>.<layer>_gate``).
    Returns the gate modules' names in model order.
    """
    gates: dict[str, BlockGate] = {}
    for name, layer in lora_layers(model).items():
        parts = name.split(".")
        if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit():
            owner_name, attribute = ".".join(parts[:2]), "gate"
        else:
            owner_name, attribute = ".".join(parts[:-1]), f"{parts[-1]}_gate"
        gate_name = f"{owner_name}.{attribute}" if owner_name else attribute
        if gate_name not in gates:
            owner = model.get_submodule(owner_name) if owner_name else model
            gates[gate_name] = BlockGate(device=layer.lora_A.device)
            owner.add_module(attribute, gates[gate_name])
        layer.__dict__["gate"] = gates[gate_name]
    if not gates:
        raise ConfigError("fedsdg found no adapted layer; check --lora-targets")
    return list(gates)


@dataclass(frozen=True)
class FedSDGHyperparameters:
    lambda1: float = option(1e-3, "λ₁: weight of the gate penalty Σ_l |m_l| (or bilateral).")
    lambda2: float = option(1e-4, "λ₂: weight of ‖θ_p‖², on private LoRA parameters only.")
    gate_penalty: str = option(
        "l1", "Gate penalty: l1 = Σ|m|, bilateral = Σ min(m, 1 − m).", choices=("l1", "bilateral")
    )
    lr_private: float = option(1e-3, "Adam learning rate of the private LoRA branch (η_p).")
    lr_gate: float = option(1e-2, "Adam learning rate of the gate logits (η_m).")
    server_agg: str = option(
        "alignment",
        "Server rule: alignment-weighted (FedSDG); fedavg = the uniform mean 1/M of the M uploads "
        "(design note 001, the authors' code); fedavg-weighted = sample-weighted (n_k/Σn).",
        choices=("alignment", "fedavg", "fedavg-weighted"),
    )
    agg_epsilon: float = option(1e-8, "ε of the alignment weights.")
    private_init: str = option(
        "notes",
        "FedSDG private branch init: notes = A_p = 0, B_p ~ N(0, (1e-4)²) (the design notes); "
        "authors = A_p ~ N(0, 1/r), B_p ~ N(0, 0.01²) (the authors' released code).",
        choices=("notes", "authors"),
        omit_at_default=True,
    )

    def validate(self) -> None:
        for name in ("lambda1", "lambda2"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"--{name} must be ≥ 0, got {getattr(self, name)}")
        for name in ("lr_private", "lr_gate", "agg_epsilon"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")


def gate_penalty(gates: list[torch.Tensor], kind: str) -> torch.Tensor:
    """Σ_l |m_l| (l1) or Σ_l min(m_l, 1 − m_l) (bilateral), m_l = sigmoid(a_l)."""
    m = torch.sigmoid(torch.stack(gates))
    return (m.abs() if kind == "l1" else torch.minimum(m, 1 - m)).sum()


def private_penalty(private: list[torch.Tensor]) -> torch.Tensor:
    """‖θ_p‖² = Σ of squares over the private LoRA tensors."""
    return sum(p.pow(2).sum() for p in private)


class FedSDGProgram(ClientProgram[FedSDGHyperparameters]):
    capabilities = ProgramCapabilities(batch_loop=True, model_upload=True)

    def __init__(self, layout, hparams, local) -> None:
        super().__init__(layout, hparams, local)
        self.loss_weights = {"gate_penalty": hparams.lambda1, "private_penalty": hparams.lambda2}

    def loss_terms(self, forward, params, inputs, targets, received):
        terms = super().loss_terms(forward, params, inputs, targets, received)
        groups = self.layout.groups
        terms["gate_penalty"] = gate_penalty([params[n] for n in groups["gates"]], self.hparams.gate_penalty)
        terms["private_penalty"] = private_penalty([params[n] for n in groups["private_lora"]])
        return terms

    def optimizer(self) -> OptimizerSpec:
        """Adam (0.9, 0.999), no weight decay; groups: shared (--lr), private, gates."""
        groups = self.layout.groups
        return OptimizerSpec(
            kind="adam",
            lr=self.local.lr,
            betas=(0.9, 0.999),
            weight_decay=0.0,
            groups=(
                ParamGroup(frozenset(self.layout.shared), self.local.lr),
                ParamGroup(frozenset(groups["private_lora"]), self.hparams.lr_private),
                ParamGroup(frozenset(groups["gates"]), self.hparams.lr_gate),
            ),
            max_grad_norm=self.max_grad_norm,
        )


class FedSDGNewClientProgram(FedSDGProgram):
    """A new client: its private branch and gates trained (FedSDG's loss and optimizer groups)
    with the shared part frozen, then its whole model uploaded (the model it is tested with)."""

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        groups = self.layout.groups
        return [LocalPhase(self.local.epochs, frozenset(groups["private_lora"]) | frozenset(groups["gates"]))]

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        return {name: state[name].detach().clone() for name in received}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}


@register_algorithm("fedsdg")
class FedSDG(Algorithm[FedSDGHyperparameters]):
    """Shared + gated private LoRA per block; alignment-weighted aggregation of the shared part."""

    capabilities = Capabilities(same_broadcast=True, received_personal_model=True)

    display_name = "FedSDG"
    paper = "pflbench's FedSDG (docs/guides/lora.md, FedSDG section)"
    method_family = "low_rank"
    hyperparameters = FedSDGHyperparameters
    program_class = FedSDGProgram

    @classmethod
    def lora_rank(cls, config: RunConfig, hparams: FedSDGHyperparameters) -> int:
        return config.lora_rank or DEFAULT_RANK

    @classmethod
    def run_defaults(cls, config: RunConfig, hparams: FedSDGHyperparameters) -> dict[str, Any]:
        return {**super().run_defaults(config, hparams), "max_grad_norm": 1.0}

    @classmethod
    def check_config(cls, config: RunConfig, hparams: FedSDGHyperparameters) -> None:
        """FedSDG's optimizer is fixed by its design (Adam, three groups, no weight decay)."""
        if config.weight_decay:
            raise ConfigError(
                "fedsdg regularises only the private branch (λ₂, --lambda2); "
                f"--weight-decay must be 0, got {config.weight_decay}"
            )
        if config.optimizer != "adam":
            raise ConfigError(f"fedsdg always uses Adam; --optimizer {config.optimizer} would be ignored")
        if config.momentum:
            raise ConfigError(f"fedsdg uses Adam; --momentum {config.momentum} would be ignored")

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: FedSDGHyperparameters) -> dict[str, Any]:
        """LoRA with gated private pairs on every target, one gate per transformer block."""
        rank = cls.lora_rank(config, hparams)
        adapted = apply_lora(
            model,
            rank,
            config.lora_alpha,
            parse_targets(config.lora_targets),
            GatedLoRALinear,
            head_layers=config.head_layers,
        )
        attach_gates(model)
        if hparams.private_init == "authors":
            authors_private_init(model, rank)
        return {"lora": {"rank": rank, "alpha": config.lora_alpha, "adapted_layers": adapted}}

    checkpoint_attributes = ("fallbacks", "_last_weights")

    def __init__(
        self, config: RunConfig, hparams: FedSDGHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        self.block_names = [name for name, module in model.named_modules() if isinstance(module, BlockGate)]
        if not self.block_names:
            raise ConfigError("fedsdg found no adapted layer; check --lora-targets")
        self.gate_names = [f"{block}.lambda_k_logit" for block in self.block_names]
        self.private_lora_names = [
            f"{name}.{suffix}" for name in lora_layers(model) for suffix in ("lora_A_private", "lora_B_private")
        ]
        super().__init__(config, hparams, model, num_train)
        self.fallbacks = 0

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        return {"gates": tuple(self.gate_names), "private_lora": tuple(self.private_lora_names)}

    def select_shared(self, names: list[str]) -> list[str]:
        """θ_g: shared LoRA pairs + head; private pairs and gates stay on the client."""
        private = set(self.private_lora_names) | set(self.gate_names)
        return [n for n in names if n not in private]

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if self.hparams.server_agg in ("fedavg", "fedavg-weighted"):
            self._last_weights = fedavg_weights(updates, self.hparams.server_agg)
            if updates and updates[0].params:
                average = weighted_average([u.params for u in updates], self._last_weights)
                torch._foreach_copy_([self.global_state[n] for n in average], list(average.values()))
            return None
        new, self._last_weights, fell_back = _aggregate(
            self.global_state, [u.params for u in updates], self.hparams.agg_epsilon
        )
        self.fallbacks += fell_back
        torch._foreach_copy_([self.global_state[n] for n in new], list(new.values()))

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        """Aggregation weights (the loss terms are logged by the engine as loss_<term>)."""
        stats = weight_statistics(self._last_weights) if updates else {}
        return {**stats, "agg_fallbacks": self.fallbacks}

    def new_client_program(self) -> ClientProgram:
        """A fresh private branch and gates (``new_client_model``: the initial ones, m = 0.5)
        trained with the shared part frozen."""
        return FedSDGNewClientProgram(self.layout, self.hparams, self.config.local_spec)

    def global_model(self) -> Tensors:
        """The shared model alone: every gate forced to m = 0 (logit −∞)."""
        state = super().global_model()
        return {**state, **{n: torch.full_like(state[n], -math.inf) for n in self.gate_names}}

    def client_gates(self) -> np.ndarray:
        """K × L gate values m = sigmoid(a); never-trained clients keep the initial 0.5."""
        return np.array(
            [
                [float(torch.sigmoid(self.store.get(k)[n].detach())) for n in self.gate_names]
                for k in range(self.config.num_clients)
            ]
        )

    def final_report(self) -> tuple[dict[str, Any], dict[str, list[float]]]:
        gates = self.client_gates()
        trained = [k for k in range(self.config.num_clients) if k in self.store]
        values = gates[trained].ravel() if trained else gates.ravel()
        summary = {
            "gate_frac_below_0.1": float((values < 0.1).mean()),
            "gate_frac_above_0.9": float((values > 0.9).mean()),
            "gate_frac_0.4_to_0.6": float(((values >= 0.4) & (values <= 0.6)).mean()),
            "gate_mean": float(values.mean()),
            "gates_clients_trained": len(trained),
            "gate_blocks": self.block_names,
            "gates": gates.round(6).tolist(),
        }
        columns = {f"gate_{i}": gates[:, i].tolist() for i in range(len(self.block_names))}
        return summary, columns
