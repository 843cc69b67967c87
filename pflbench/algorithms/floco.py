"""Floco — Grinwald, Wiesner & Nakajima, "Federated Learning over Connected Modes", NeurIPS 2024
(OpenReview JL2eMCfDW8).

The model's final layer becomes a *solution simplex*: M endpoint weight matrices θ_1, …, θ_M
(``--endpoints``) whose convex combinations are all trained to be good models (linear mode
connectivity); the layer's weight at a point α of the simplex Δ^{M−1} is

    W(α) = Σ_m α_m·θ_m          (``simplex_weight``; the bias is one vector, shared by all points)

Training (every client, every round): each minibatch samples a point α and takes the step on
the loss of W(α). Until the projection, α ~ Uniform(Δ^{M−1}) (normalised exponentials, i.e.
Dirichlet(1)); after it, α is drawn from client k's subregion around its point β_k,

    α = β_k + r·u,   r ~ U(0, ρ),   u = sign(v)·|v| / ‖v‖₁,  v ~ U(−1, 1)^M     (``subregion_sample``)

(``--rho`` ρ), the sampler of both reference implementations. The server averages every tensor
(endpoints, bias, body) by sample count, as FedAvg.

Projection (once, after round τ − 1, ``--tau`` τ): with Δθ_k = θ^{t}_{1..M} − θ̃_{k,1..M} the
pseudo-gradient of client k's endpoints in that round (received minus trained, flattened),

1. κ_k = PCA_M(Δθ_1, …, Δθ_K)_k ∈ ℝ^M: the clients' coordinates on the first M principal
   components (``principal_coordinates``);
2. for each z in 1000 values from 1e-4 to 1: β_k(z) = P_z(κ_k)/z, with P_z the Euclidean
   projection onto {β ≥ 0, Σβ = z} (``project_to_scaled_simplex``);
3. keep the z whose points are spread most evenly: least Riesz s-energy (s = 2),
   log E = log Σ_{i<j} 1/max(‖β_i − β_j‖₂, 1e-4)² − log #pairs (``riesz_log_energy``).

Client k then trains on its subregion from round τ on and is evaluated at its point β_k
(``personal_model``: the layer W(β_k)); before the projection, and for the global model, the
simplex centre α = (1/M, …, 1/M).

Defaults (FL-bench's Floco, which implements the paper): M = 10 endpoints, τ = 10, ρ = 0.1.
Endpoint initialisation: each θ_m Xavier-normal, drawn from the run's seed (stream
``floco.endpoints``, m) — FL-bench seeds the global stream with seed + m; the model's own
initial weight of the layer is unused (its bias is kept).

Choices where the paper and the references differ or are silent:
- Which clients are projected: the Flower baseline makes round τ − 1 sample *every* client and
  FL-bench runs an extra training pass of every client at round τ; this suite's round loop
  samples ``--frac`` of the clients (the engine has no "train everyone" hook), so the clients of
  round τ − 1 are projected. With ``--frac 1`` (the default) that is every client, as in the Flower
  baseline. A client that did not report then keeps the whole simplex (trains on Uniform(Δ),
  evaluated at the centre).
- Pseudo-gradients as in the Flower baseline (received − trained endpoints); FL-bench uses the
  trained endpoints themselves. PCA centres the rows; the sign of each component is fixed so its
  largest-magnitude loading is positive (scikit-learn's convention; the projection depends on it).
  With fewer clients than M, the components past the data's rank are zero.
- The sampler β_k + r·u is the references' (it may leave the simplex by up to ρ in L1; the paper
  describes the subregion as the L1 ball of radius ρ around β_k).
- The round is counted in aggregations (rounds where some client reported).
- Floco+ (a personalised second simplex, FL-bench's ``--pers_epoch``/``--lamda``) is not
  implemented: this is Floco.

New clients (``--new-clients``): no subregion was ever assigned to them, so they are tested with
the global model at the simplex centre (the method's global model; documented fallback — the
paper does not serve new clients). global_acc: the simplex centre.
What travels: the whole model (M endpoint matrices instead of one final weight) both ways; the
client's point β_k and radius live in its private state (two small buffers of the layer).
Refused: ``--executor vmap`` (α is drawn per batch from the job's stream: a custom local update),
``--dp``, ``--attack`` model poisoning and ``--robust-agg`` (the projection reads each raw upload;
the engine's predicate refuses them), ``--head-layers`` other than 1, a final layer that is not
``nn.Linear``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    Choice,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    Dimension,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    option,
    register_algorithm,
    standard_local_update,
)
from pflbench.models.zoo import final_linear_layer, head_module_names
from pflbench.util.seeding import derive_seed

Z_GRID = np.linspace(1e-4, 1, 1000)  # the references' scales z of the projection
MIN_DISTANCE = 1e-4  # the references' floor of a pair's distance in the Riesz energy


# ---- the math ----------------------------------------------------------------------------
def simplex_weight(endpoints: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """W(α) = Σ_m α_m·θ_m for endpoints [M, out, in]."""
    return torch.tensordot(alpha.to(endpoints.dtype), endpoints, dims=1)


def uniform_simplex_sample(endpoints: int, generator: torch.Generator) -> torch.Tensor:
    """α ~ Uniform(Δ^{M−1}): normalised Exp(1) draws."""
    draws = -torch.log1p(-torch.rand(endpoints, generator=generator, dtype=torch.float64))
    return draws / draws.sum()


def subregion_sample(center: torch.Tensor, radius: float, generator: torch.Generator) -> torch.Tensor:
    """β + r·u with r ~ U(0, ρ) and u = sign(v)·|v|/‖v‖₁, v ~ U(−1, 1)^M."""
    v = 2 * torch.rand(len(center), generator=generator, dtype=torch.float64) - 1
    u = v / v.abs().sum()
    r = radius * float(torch.rand((), generator=generator, dtype=torch.float64))
    return center.double() + r * u


def principal_coordinates(rows: np.ndarray, components: int) -> np.ndarray:
    """The rows' coordinates on the first ``components`` principal axes (centred; each axis'
    largest-magnitude loading made positive; axes past the rank are zero columns)."""
    centred = rows - rows.mean(axis=0, keepdims=True)
    u, s, vt = np.linalg.svd(centred, full_matrices=False)
    signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])
    signs[signs == 0] = 1
    scores = (u * s) * signs
    out = np.zeros((len(rows), components))
    kept = min(components, scores.shape[1])
    out[:, :kept] = scores[:, :kept]
    return out


def project_to_scaled_simplex(points: np.ndarray, z: float) -> np.ndarray:
    """Each row's Euclidean projection onto {β ≥ 0, Σβ = z} (sort-based, Duchi et al. 2008)."""
    ordered = -np.sort(-points, axis=1)
    cumulative = np.cumsum(ordered, axis=1) - z
    index = np.arange(1, points.shape[1] + 1)
    support = (ordered - cumulative / index > 0).sum(axis=1)
    shift = cumulative[np.arange(len(points)), support - 1] / support
    return np.maximum(points - shift[:, None], 0.0)


def riesz_log_energy(points: np.ndarray) -> float:
    """log of the mean over pairs of 1/d², d the pairs' Euclidean distances floored at 1e-4."""
    pairs = np.triu_indices(len(points), 1)
    distances = np.linalg.norm(points[:, None] - points[None, :], axis=2)[pairs]
    distances = np.maximum(distances, MIN_DISTANCE)
    return float(np.log(np.sum(1.0 / distances**2)) - np.log(len(distances)))


def project_clients(pseudo_gradients: np.ndarray, endpoints: int) -> np.ndarray:
    """β_k for each row: PCA to M coordinates, projected onto the simplex at the scale z of
    least Riesz energy (step 1–3 of the docstring). One client: the simplex centre."""
    if len(pseudo_gradients) < 2:
        return np.full((len(pseudo_gradients), endpoints), 1.0 / endpoints)
    kappas = principal_coordinates(pseudo_gradients, endpoints)
    best, lowest = None, math.inf
    for z in Z_GRID:
        betas = project_to_scaled_simplex(kappas, z)
        betas = betas / betas.sum(axis=1, keepdims=True)
        energy = riesz_log_energy(betas)
        if math.isfinite(energy) and energy < lowest:
            best, lowest = betas, energy
    assert best is not None
    return best


# ---- the model ---------------------------------------------------------------------------
class SimplexLinear(nn.Module):
    """A linear layer whose weight is W(α) = Σ_m α_m·θ_m: parameters ``endpoints`` [M, out, in]
    and ``bias`` [out]; buffers ``alpha`` [M] (the point used when no point is passed: the
    client's β_k or the centre) and ``radius`` [1] (ρ after the projection, −1 before)."""

    alpha: torch.Tensor
    radius: torch.Tensor

    def __init__(self, endpoints: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.endpoints = nn.Parameter(endpoints)
        self.bias = nn.Parameter(bias)
        count = endpoints.shape[0]
        self.register_buffer("alpha", torch.full((count,), 1.0 / count, dtype=endpoints.dtype, device=endpoints.device))
        self.register_buffer("radius", torch.full((1,), -1.0, dtype=endpoints.dtype, device=endpoints.device))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, simplex_weight(self.endpoints, self.alpha), self.bias)


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlocoHyperparameters:
    endpoints: int = option(10, "M: endpoints of the solution simplex (FL-bench's 10).")
    tau: int = option(10, "τ: the round from which clients train on their subregions (FL-bench's 10).")
    rho: float = option(0.1, "ρ: L1 radius of each client's subregion (FL-bench's 0.1).")

    def validate(self) -> None:
        if self.endpoints < 2:
            raise ConfigError(f"--endpoints must be ≥ 2, got {self.endpoints}")
        if self.tau < 2:
            raise ConfigError(f"--tau must be ≥ 2 (the projection uses round τ − 1's updates), got {self.tau}")
        if not 0 <= self.rho <= 2:
            raise ConfigError(f"--rho must be in [0, 2] (an L1 radius on the simplex), got {self.rho}")


class FlocoProgram(ClientProgram[FlocoHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the simplex layer (make_program)
    generator: torch.Generator | None = None  # per-job copy: the α stream
    point: dict[str, torch.Tensor] = {}  # per-job copy: the client's β_k and radius

    def sample_alpha(self, received_private: dict) -> torch.Tensor:
        center = received_private[f"{self.head_module}.alpha"]
        radius = float(received_private[f"{self.head_module}.radius"])
        assert self.generator is not None
        if radius < 0:
            return uniform_simplex_sample(len(center), self.generator)
        return subregion_sample(center, radius, self.generator)

    def loss_terms(self, forward, params, inputs, targets, received):
        """Cross-entropy of the model at a freshly sampled point α of the (sub)simplex."""
        endpoints = params[f"{self.head_module}.endpoints"]
        alpha = self.sample_alpha(self.point).to(device=endpoints.device, dtype=endpoints.dtype)
        logits = forward({**params, f"{self.head_module}.alpha": alpha}, inputs)
        return {"task": F.cross_entropy(logits, targets)}

    def local_update(self, trainer) -> LocalResult:
        job_program = copy.copy(self)
        job_program.generator = torch.Generator().manual_seed(derive_seed(trainer.job.seed, "floco.alpha"))
        job_program.point = {n: trainer.state[n].detach().clone() for n in self.layout.private}  # type: ignore[attr-defined]
        return standard_local_update(job_program, trainer)


# ---- server ------------------------------------------------------------------------------
@register_algorithm("floco")
class Floco(Algorithm[FlocoHyperparameters]):
    """A solution simplex as the final layer; clients projected onto subregions of it after
    round τ − 1 and evaluated at their points."""

    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "Floco"
    paper = "Grinwald et al., NeurIPS 2024"
    method_family = "mode_connectivity"
    hyperparameters = FlocoHyperparameters
    program_class = FlocoProgram
    checkpoint_attributes = ("rounds_done", "projected_round")

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"floco's simplex is the final layer; --head-layers {config.head_layers} would be ignored (leave it at 1)"
            )

    @classmethod
    def search_space(cls, config: RunConfig, hparams: Any) -> dict[str, Dimension]:
        """lr around its default; ρ over {0.05, 0.1, 0.2} and M over {5, 10} around FL-bench's
        defaults (the paper reports ablations over both)."""
        return {**super().search_space(config, hparams), "rho": Choice((0.05, 0.1, 0.2)), "endpoints": Choice((5, 10))}

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: Any) -> dict[str, Any]:
        """The final ``nn.Linear`` becomes a ``SimplexLinear`` of M Xavier-normal endpoints."""
        record = super().configure_model(model, config, hparams)
        name, head = final_linear_layer(model, "floco")
        if head.bias is None:
            raise ConfigError(f"floco needs a bias in the final layer {name!r} (the simplex's shared bias)")
        endpoints = torch.empty(hparams.endpoints, *head.weight.shape, dtype=head.weight.dtype)
        for m in range(hparams.endpoints):
            generator = torch.Generator().manual_seed(derive_seed(config.seed, "floco.endpoints", m))
            nn.init.xavier_normal_(endpoints[m], generator=generator)
        layer = SimplexLinear(endpoints.to(head.weight.device), head.bias.detach().clone())
        layer.train(head.training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)
        return {**record, "simplex": f"{name} ({hparams.endpoints} endpoints)"}

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module, num_train: list[int]) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)
        self.rounds_done = 0
        self.projected_round = 0  # the round whose updates placed the clients (0: not yet)

    def select_shared(self, names: list[str]) -> list[str]:
        """Everything but the client's point and radius."""
        return [n for n in names if n not in (f"{self.head_module}.alpha", f"{self.head_module}.radius")]

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module = self.head_module  # type: ignore[attr-defined]
        return program

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        self.rounds_done += 1
        if self.rounds_done == self.hparams.tau - 1:
            name = f"{self.head_module}.endpoints"
            sent = self.global_state[name].flatten().double().cpu()
            gradients = np.stack([(sent - u.params[name].flatten().double().cpu()).numpy() for u in updates])
            betas = project_clients(gradients, self.hparams.endpoints)
            alpha_name, radius_name = f"{self.head_module}.alpha", f"{self.head_module}.radius"
            for update, beta in zip(updates, betas):
                state = dict(self.store.get(update.client_id))
                state[alpha_name] = torch.as_tensor(
                    beta, dtype=state[alpha_name].dtype, device=state[alpha_name].device
                )
                state[radius_name] = torch.full_like(state[radius_name], self.hparams.rho)
                self.store.put(update.client_id, state)
            self.projected_round = self.rounds_done
        super().aggregate(updates)
