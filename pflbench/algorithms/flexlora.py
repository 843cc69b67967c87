"""FlexLoRA — Bai et al., "Federated Fine-tuning of Large Language Models under Heterogeneous
Tasks and Client Resources", NeurIPS 2024 (arXiv:2402.11505).

LoRA fine-tuning where client k has its own rank r_k (``--rank-dist``, drawn once from the
``ranks`` stream). Defaults: ``--rank-dist uniform`` over ``--rank-set`` {4, 8, 16, 32}, the
suite's specification (SPEC.md; the paper studies uniform and heavy-tail rank distributions of
this kind; ``heavy-tail`` puts 80% of the clients at the smallest rank). Backbone frozen, LoRA on ``--lora-targets``, classifier head trained and
averaged FedAvg-style. Per adapted layer the server aggregates the full-size
ΔW = Σ_k (n_k/Σn)·s_k·B_k·A_k (s_k = α/r_k), takes U, S, Vᵀ = SVD(ΔW) (exactly, from the
stacked factors without forming the out×in matrix: ``factored_svd``) and sends client k
B = U[:, :r]·diag(S[:r]) / s_r, A = Vᵀ[:r] (r = r_k), so s_r·B·A is the best rank-r
approximation of ΔW. Clients upload only their rank-r_k factors.

The server keeps the factors at the run's largest rank R; client k gets their first r_k
components rescaled (``truncate_factors``), so the SVD runs once per layer per round. The global
model (``global_acc``) is the rank-R approximation. A client's rank is data: the shapes it
receives; its program zero-pads the factors to R and sets each layer's ``active_rank`` buffer.

New clients (``--new-clients``): a new client k is served what FlexLoRA sends any client, the
global ΔW truncated to its rank r_k (drawn with everyone's), evaluated as it is (with
``--finetune-epochs E`` the global model fine-tuned: ``new_acc_ft``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
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
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.config.lora import DEFAULT_RANK
from pflbench.engine import sample_weights, weighted_average
from pflbench.models.lora import lora_layers
from pflbench.util.seeding import rng_stream

RANK_DISTRIBUTIONS = ("homo", "uniform", "heavy-tail")
HEAVY_TAIL_SMALLEST = 0.8  # share of clients with the smallest rank under heavy-tail


def stack_lora_factors(
    factors: Sequence[tuple[torch.Tensor, torch.Tensor, float]], weights: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B̃ [out, k], Ã [k, in]), k = Σ r_k, with B̃·Ã = Σ_k w_k·s_k·B_k·A_k, from (A_k, B_k, s_k)."""
    scaled_B = torch.cat([B * (w * s) for (_, B, s), w in zip(factors, weights)], dim=1)
    return scaled_B, torch.cat([A for A, _, _ in factors], dim=0)


def aggregate_lora_deltas(
    factors: Sequence[tuple[torch.Tensor, torch.Tensor, float]], weights: Sequence[float]
) -> torch.Tensor:
    """ΔW = Σ_k w_k·s_k·B_k·A_k [out, in] from (A_k [r_k, in], B_k [out, r_k], s_k)."""
    scaled_B, stacked_A = stack_lora_factors(factors, weights)
    return scaled_B @ stacked_A


def factored_svd(scaled_B: torch.Tensor, stacked_A: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The leading min(out, in, k) singular triplets (U, S, Vᵀ) of ΔW = B̃·Ã (all nonzero ones,
    as rank(ΔW) ≤ k) without forming ΔW: B̃ = Q_B·R_B, Ãᵀ = Q_A·R_A, SVD(R_B·R_Aᵀ) = U_c·S·V_cᵀ
    gives U = Q_B·U_c, Vᵀ = V_cᵀ·Q_Aᵀ. Exact; the SVD is of a k×k core (k = Σ r_k) instead of
    out×in, so the server step stays cheap for large layers."""
    Q_B, R_B = torch.linalg.qr(scaled_B)
    Q_A, R_A = torch.linalg.qr(stacked_A.T)
    U_core, S, Vh_core = torch.linalg.svd(R_B @ R_A.T, full_matrices=False)
    return Q_B @ U_core, S, Vh_core @ Q_A.T


def delta_svd(scaled_B: torch.Tensor, stacked_A: torch.Tensor, rank: int) -> tuple[torch.Tensor, ...]:
    """Thin SVD of ΔW = B̃·Ã with at least ``rank`` triplets: ``factored_svd`` when
    rank ≤ k < min(out, in) (exact and cheaper), else the dense SVD of ΔW (which also gives the
    S = 0 directions a client of rank > k needs)."""
    if rank <= scaled_B.shape[1] < min(scaled_B.shape[0], stacked_A.shape[1]):
        return factored_svd(scaled_B, stacked_A)
    return torch.linalg.svd(scaled_B @ stacked_A, full_matrices=False)


def factors_from_svd(
    U: torch.Tensor, S: torch.Tensor, Vh: torch.Tensor, rank: int, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) = (U[:, :r]·diag(S[:r]) / s_r, Vᵀ[:r]) with s_r = α/r, so s_r·B·A = U_r S_r V_rᵀ."""
    return U[:, :rank] * (S[:rank] * (rank / alpha)), Vh[:rank]


def svd_redistribute(delta: torch.Tensor, rank: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-r LoRA factors (B [out, r], A [r, in]) whose s_r·B·A best approximates ``delta``."""
    U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
    return factors_from_svd(U, S, Vh, rank, alpha)


def truncate_factors(B: torch.Tensor, A: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-r factors from rank-R ones of ``factors_from_svd``: (B[:, :r]·r/R, A[:r]), as s_r = α/r."""
    return B[:, :rank] * (rank / B.shape[1]), A[:rank]


def spectral_energy_kept(S: torch.Tensor, rank: int) -> float:
    """Σ_{i<r} S_i² / Σ_i S_i²: the share of ‖ΔW‖²_F a rank-r client receives (1 if ΔW = 0)."""
    energy = S.double().pow(2)
    total = float(energy.sum())
    return float(energy[:rank].sum()) / total if total > 0 else 1.0


def parse_ranks(text: str, flag: str) -> list[int]:
    """``"4,8,16,32"`` → ``[4, 8, 16, 32]``; ConfigError unless every entry is an int ≥ 1."""
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        raise ConfigError(
            f"{flag} {text!r} is not comma-separated ranks ≥ 1 (e.g. 4,8,16,32)"
            + (f" nor one of {', '.join(RANK_DISTRIBUTIONS)}" if flag == "--rank-dist" else "")
        )
    return ranks


def client_ranks(
    rank_dist: str, rank_set: Sequence[int], num_clients: int, homo_rank: int, rng: np.random.Generator
) -> list[int]:
    """r_k per client. homo: all ``homo_rank``; uniform: i.i.d. over ``rank_set``; heavy-tail:
    round(0.8·K) clients get the smallest rank and the rest cycle over the larger ones, in random
    client order; an explicit list "r0,r1,...": client k gets entry k mod its length."""
    if rank_dist == "homo":
        return [homo_rank] * num_clients
    if rank_dist == "uniform":
        return [int(r) for r in rng.choice(rank_set, size=num_clients)]
    if rank_dist == "heavy-tail":
        ordered = sorted(set(rank_set))
        larger = ordered[1:] or ordered
        small = round(HEAVY_TAIL_SMALLEST * num_clients)
        ranks = [ordered[0]] * small + [larger[i % len(larger)] for i in range(num_clients - small)]
        return [ranks[i] for i in rng.permutation(num_clients)]
    listed = parse_ranks(rank_dist, "--rank-dist")
    return [listed[k % len(listed)] for k in range(num_clients)]


@dataclass(frozen=True)
class FlexLoRAHyperparameters:
    rank_dist: str = option(
        "uniform",
        "Client LoRA ranks: homo (all --lora-rank, default 8), uniform "
        "over --rank-set, heavy-tail (80% the smallest rank, the rest spread over "
        "the larger ones), or a list r0,r1,... (client k gets entry k mod length).",
    )
    rank_set: str = option("4,8,16,32", "Ranks drawn by --rank-dist uniform / heavy-tail.")

    def validate(self) -> None:
        parse_ranks(self.rank_set, "--rank-set")
        if self.rank_dist not in RANK_DISTRIBUTIONS:
            parse_ranks(self.rank_dist, "--rank-dist")

    def possible_ranks(self, lora_rank: int | None) -> list[int]:
        if self.rank_dist == "homo":
            return [lora_rank or DEFAULT_RANK]
        if lora_rank is not None:
            raise ConfigError(
                f"--lora-rank is the rank of --rank-dist homo; with --rank-dist "
                f"{self.rank_dist} the ranks come from --rank-set / the list"
            )
        if self.rank_dist in RANK_DISTRIBUTIONS:
            return parse_ranks(self.rank_set, "--rank-set")
        return parse_ranks(self.rank_dist, "--rank-dist")


class FlexLoRAProgram(ClientProgram[FlexLoRAHyperparameters]):
    capabilities = ProgramCapabilities(batch_loop=True)
    lora_layers: tuple[str, ...] = ()  # set by FlexLoRA.make_program
    max_rank: int = 0

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """Rank r_k = the rank received: A[:r], B[:, :r] zero-padded to R, ``active_rank`` = r."""
        state = dict(received)
        for name in self.lora_layers:
            A, B = received[f"{name}.lora_A"], received[f"{name}.lora_B"]
            rank = A.shape[0]
            padded_A = A.new_zeros((self.max_rank, A.shape[1]))
            padded_B = B.new_zeros((B.shape[0], self.max_rank))
            padded_A[:rank] = A
            padded_B[:, :rank] = B
            state[f"{name}.lora_A"], state[f"{name}.lora_B"] = padded_A, padded_B
            state[f"{name}.active_rank"] = torch.tensor(rank, device=A.device)
        return {**state, **private}

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        """Only the client's own rank: each tensor cut to the shape it received (A[:r], B[:, :r])."""
        return {
            name: state[name][tuple(slice(0, n) for n in received[name].shape)].detach().clone()
            for name in self.layout.shared
        }


@register_algorithm("flexlora")
class FlexLoRA(Algorithm[FlexLoRAHyperparameters]):
    """LoRA with per-client ranks; full-size ΔW averaged, SVD-truncated to each client's rank."""

    capabilities = Capabilities(received_personal_model=True)

    display_name = "FlexLoRA"
    paper = "Bai et al., NeurIPS 2024"
    method_family = "low_rank"
    hyperparameters = FlexLoRAHyperparameters
    program_class = FlexLoRAProgram
    checkpoint_attributes = ("diagnostics",)

    @classmethod
    def lora_rank(cls, config: RunConfig, hparams: FlexLoRAHyperparameters) -> int:
        return max(hparams.possible_ranks(config.lora_rank))

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: FlexLoRAHyperparameters) -> dict[str, Any]:
        """LoRA at the largest rank; each layer reads the client's rank from its ``active_rank`` buffer."""
        record = super().configure_model(model, config, hparams)
        for layer in lora_layers(model).values():
            layer.variable_rank = True
        return record

    @classmethod
    def check_config(cls, config: RunConfig, hparams: FlexLoRAHyperparameters) -> None:
        if hparams.rank_dist not in RANK_DISTRIBUTIONS:
            listed = parse_ranks(hparams.rank_dist, "--rank-dist")
            if len(listed) > config.num_clients:
                raise ConfigError(
                    f"--rank-dist lists {len(listed)} ranks for {config.num_clients} "
                    "clients; give at most one rank per client"
                )

    def __init__(
        self, config: RunConfig, hparams: FlexLoRAHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        self.layers = list(lora_layers(model))
        self.max_rank = self.lora_rank(config, hparams)
        super().__init__(config, hparams, model, num_train)
        self.ranks = client_ranks(
            hparams.rank_dist,
            hparams.possible_ranks(config.lora_rank),
            config.num_clients,
            config.lora_rank or DEFAULT_RANK,
            rng_stream(config.seed, "ranks"),
        )
        factors = {f"{name}.lora_{part}" for name in self.layers for part in "AB"}
        self.head_names = [n for n in self.layout.shared if n not in factors]
        self.diagnostics: dict[str, Any] = {}

    def make_program(self) -> FlexLoRAProgram:
        program = super().make_program()
        program.lora_layers, program.max_rank = tuple(self.layers), self.max_rank
        return program

    def run_info(self) -> dict[str, Any]:
        return {"client_ranks": self.ranks, "lora_max_rank": self.max_rank}

    def clients_share_one_model(self) -> bool:
        return len(set(self.ranks)) == 1 and not self.layout.private

    def broadcast(self, client_id: int) -> Tensors:
        sent, rank = dict(self.global_state), self.ranks[client_id]
        for name in self.layers:
            B, A = f"{name}.lora_B", f"{name}.lora_A"
            sent[B], sent[A] = truncate_factors(self.global_state[B], self.global_state[A], rank)
        return sent

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        weights = sample_weights(updates)
        new = weighted_average([{n: u.params[n] for n in self.head_names} for u in updates], weights)
        started = time.perf_counter()
        alpha, energy = self.config.lora_alpha, {r: [] for r in sorted(set(self.ranks))}
        for name in self.layers:
            factors = [
                (u.params[f"{name}.lora_A"], u.params[f"{name}.lora_B"], alpha / u.params[f"{name}.lora_A"].shape[0])
                for u in updates
            ]
            U, S, Vh = delta_svd(*stack_lora_factors(factors, weights), self.max_rank)
            new[f"{name}.lora_B"], new[f"{name}.lora_A"] = factors_from_svd(U, S, Vh, self.max_rank, alpha)
            for rank, kept in energy.items():
                kept.append(spectral_energy_kept(S, rank))
        torch._foreach_copy_([self.global_state[n] for n in new], list(new.values()))
        self.diagnostics = {
            "server_svd_time_s": time.perf_counter() - started,
            **{f"energy_kept_r{r}": float(np.mean(v)) for r, v in energy.items()},
        }

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        return {"ranks": [self.ranks[u.client_id] for u in updates], **self.diagnostics}
