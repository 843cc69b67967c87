"""pFedGraph — Ye, Ni, Wu, Xu, Chen, Wang & Feng, "Personalized Federated Learning with Inferred
Collaboration Graphs", ICML 2023 (authors' code: MediaBrain-SJTU/pFedGraph, ``pfedgraph_cosine``).

Every client i keeps its own model w_i; the server infers a collaboration graph A (row a_i on the
simplex) and sends client i the aggregation w̃_i = Σ_j a_ij·w_j. Over the round's clients, with
Δw_j = w_j − w⁰ (w⁰ the initial model, the authors' reference) and p_j = n_j / Σ_k n_k:

    d_ij = −cos(Δw_i, Δw_j), and d_ij = −1 where cos > 0.9          (``graph_distances``)
    a_i = argmin_{a ≥ 0, Σ_j a_j = 1}  Σ_j a_j·d_ij + α·‖a − p‖²        (``graph_row``)

one quadratic program per client (the authors solve min α·aᵀa + (d_i − 2αp)ᵀa with cvxpy, the
same objective less a constant). Its solution is the Euclidean projection of p − d_i/(2α) onto the
simplex (``simplex_projection``, exact, no solver): clients whose updates point the same way as
i's gain weight, and α pulls the row back to the sample shares. The server then forms

    w̃_i = Σ_j a_ij·w_j,     c_i = Σ_j a_ij·w_j / ‖w_j‖                 (``aggregate_by_graph``)

and client i, starting from w̃_i, minimises for ``--local-epochs`` epochs of the run's optimizer

    F_i(w) − λ·⟨w, c_i⟩ / ‖w‖ = F_i(w) − λ·Σ_j a_ij·cos(w, w_j)         (loss term ``graph``)

pulling its model's direction towards its neighbours' (no term before its first aggregation).

Defaults: α = 0.8 (``--graph-alpha``: the authors' run scripts and config) and λ = 0.01
(``--graph-lambda``: their ``--lam``). The 0.9 cut of the cosine is their code's constant.

Departures from the authors' code, and choices they leave open:

- The sign of the cosine term. The paper's objective rewards similarity to the neighbours
  (−λ·cos); the authors' code adds +λ·⟨c_i, w⟩/‖w‖ with λ > 0, which pushes the model away
  (MediaBrain-SJTU/pFedGraph issue 1). We follow the paper.
- Similarities use every trainable parameter (their ``--difference_measure all``; ``fc``, the
  classifier only, is not offered). The direction c_i and ‖w_j‖ cover the trainable parameters
  (their c_i flattens the whole state dict, BatchNorm statistics too, against a w of parameters
  only); w̃_i averages every float tensor, BatchNorm statistics included, as their state-dict
  aggregation does.
- Local work is ``--local-epochs`` epochs (theirs: a fixed number of iterations, 200 in the scripts).
- The graph is solved over the round's reporting clients (theirs: the sampled clients); a client
  outside the round keeps its w̃_i and c_i until it is next aggregated.

What travels: down, w̃_i and c_i (two models); up, the trained w_i. The server keeps w̃_i and c_i of
every client that has been aggregated (checkpointed); a client never aggregated starts from w⁰ with
c = 0. Evaluation: ``pers_acc`` uses w̃_i (the model client i holds after aggregation, what the
authors test at the start of each round); no global model (``global_acc`` null).

New clients (``--new-clients``): a new client has no update to compare, so d = 0 and its graph row
is the QP's solution a = p (the training clients' sample shares); it starts from Σ_j p_j·w̃_j with
c = Σ_j p_j·w̃_j/‖w̃_j‖ over the clients' current models, runs pFedGraph's local objective once
(``PFedGraphNewClientProgram``) and is tested with the result.

Refused: ``--dp``, model poisoning and ``--robust-agg`` (each client's aggregate reads every raw
upload through its own graph row, not one averaged update).
"""

from __future__ import annotations

import math
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
from pflbench.engine import weighted_average

DIRECTION = "pfedgraph.c."  # c_i, sent down beside w̃_i
SIMILAR = 0.9  # the authors' cut: a cosine above it counts as identical (d = −1)


# ---- the math ----------------------------------------------------------------------------
def graph_distances(updates: torch.Tensor) -> torch.Tensor:
    """d_ij = −cos(Δw_i, Δw_j) for the rows of ``updates`` (n × D), −1 where cos > 0.9."""
    norms = updates.norm(dim=1, keepdim=True).clamp(min=1e-12)
    unit = updates / norms
    cosine = unit @ unit.T
    return torch.where(cosine > SIMILAR, torch.full_like(cosine, -1.0), -cosine)


def simplex_projection(vector: torch.Tensor) -> torch.Tensor:
    """argmin_{x ≥ 0, Σx = 1} ‖x − v‖² (sort-and-threshold: x = max(v − θ, 0))."""
    ordered, _ = torch.sort(vector, descending=True)
    cumulative = torch.cumsum(ordered, dim=0) - 1
    ranks = torch.arange(1, vector.numel() + 1, dtype=vector.dtype)
    support = int((ordered - cumulative / ranks > 0).nonzero().max())
    theta = cumulative[support] / (support + 1)
    return (vector - theta).clamp(min=0)


def graph_row(distances: torch.Tensor, shares: torch.Tensor, alpha: float) -> torch.Tensor:
    """a = argmin_{a on the simplex} Σ_j a_j·d_j + α‖a − p‖²  =  Π_simplex(p − d/(2α))."""
    return simplex_projection(shares - distances / (2 * alpha))


def graph_objective(weights: torch.Tensor, distances: torch.Tensor, shares: torch.Tensor, alpha: float) -> float:
    """Σ_j a_j·d_j + α‖a − p‖² (what ``graph_row`` minimises; for tests and diagnostics)."""
    return float(weights @ distances + alpha * (weights - shares).pow(2).sum())


def aggregate_by_graph(
    models: Sequence[Tensors], weights: Sequence[float], trainable: Sequence[str]
) -> tuple[Tensors, Tensors]:
    """(w̃ = Σ_j a_j·w_j over every tensor, c = Σ_j a_j·w_j/‖w_j‖ over the trainable ones)."""
    aggregated = weighted_average(list(models), list(weights))
    norms = [math.sqrt(sum(float(m[n].double().pow(2).sum()) for n in trainable)) for m in models]
    direction = weighted_average(
        [{n: m[n] for n in trainable} for m in models], [a / max(norm, 1e-12) for a, norm in zip(weights, norms)]
    )
    return aggregated, direction


def cosine_term(params: Tensors, direction: Tensors) -> torch.Tensor:
    """−⟨w, c⟩/‖w‖ over the tensors of ``direction`` (per-tensor operations: vmap-able)."""
    names = [n for n in direction if n in params]
    if not names:  # no direction yet (or none of these tensors): no term
        return next(iter(params.values())).new_zeros(())
    dot = sum((params[n] * direction[n]).sum() for n in names)
    norm = torch.sqrt(sum(params[n].pow(2).sum() for n in names))  # type: ignore[arg-type]
    return -dot / norm


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PFedGraphHyperparameters:
    graph_alpha: float = option(
        0.8, "α: pull of each client's graph row towards the sample shares p (the authors' --alpha 0.8)."
    )
    graph_lambda: float = option(
        0.01, "λ: weight of −Σ_j a_ij·cos(w, w_j) in the local loss (the authors' --lam 0.01; the paper's sign)."
    )

    def validate(self) -> None:
        if not self.graph_alpha > 0:
            raise ConfigError(f"--graph-alpha must be > 0, got {self.graph_alpha}")
        if not self.graph_lambda >= 0:
            raise ConfigError(f"--graph-lambda must be ≥ 0, got {self.graph_lambda}")


class PFedGraphProgram(ClientProgram[PFedGraphHyperparameters]):
    capabilities = ProgramCapabilities(batch_loop=True, model_upload=True)

    def __init__(self, layout, hparams, local) -> None:
        super().__init__(layout, hparams, local)
        self.loss_weights = {"graph": hparams.graph_lambda}

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """w̃_i (c_i only shapes the loss)."""
        return {**{n: t for n, t in received.items() if not n.startswith(DIRECTION)}, **private}

    def loss_terms(self, forward, params, inputs, targets, received):
        terms = super().loss_terms(forward, params, inputs, targets, received)
        direction = {n: received[DIRECTION + n] for n in self.layout.trainable if DIRECTION + n in received}
        terms["graph"] = cosine_term(params, direction)
        return terms


class PFedGraphNewClientProgram(PFedGraphProgram):
    """A new client: pFedGraph's objective once from Σ_j p_j·w̃_j; the trained model is uploaded."""

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        return {n: state[n].detach().clone() for n in received if not n.startswith(DIRECTION)}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}


# ---- server ------------------------------------------------------------------------------
@register_algorithm("pfedgraph")
class PFedGraph(Algorithm[PFedGraphHyperparameters]):
    """Own model per client; a per-client QP on update cosines picks whom each aggregates."""

    display_name = "pFedGraph"
    paper = "Ye et al., ICML 2023"
    method_family = "model_combination"
    hyperparameters = PFedGraphHyperparameters
    program_class = PFedGraphProgram
    has_global_model = False
    capabilities = Capabilities(averaged_upload=False)  # each client's aggregate reads every raw upload
    checkpoint_attributes = ("personalized", "direction")
    transient_attributes = ("last_rows",)  # this round's graph rows, for rounds.jsonl only

    @classmethod
    def search_space(cls, config: RunConfig, hparams: PFedGraphHyperparameters) -> dict[str, Dimension]:
        """lr around its default; α and λ on a grid around the authors' 0.8 and 0.01 (this suite's)."""
        return {
            **super().search_space(config, hparams),
            "graph_alpha": Choice((0.2, 0.4, 0.8, 1.6)),
            "graph_lambda": Choice((0.001, 0.01, 0.1)),
        }

    def __init__(self, config, hparams: PFedGraphHyperparameters, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        self.personalized: dict[str, torch.Tensor] = {}  # "k/name": w̃_k
        self.direction: dict[str, torch.Tensor] = {}  # "k/name": c_k
        self.last_rows: list[list[float]] = []

    def stored(self, store: dict[str, torch.Tensor], client_id: int, names: Sequence[str]) -> Tensors | None:
        prefix = f"{client_id}/"
        if not names or prefix + names[0] not in store:
            return None
        return {n: store[prefix + n] for n in names}

    def broadcast(self, client_id: int) -> Tensors:
        """w̃_i and c_i (w⁰ and c = 0 before client i's first aggregation)."""
        model = self.stored(self.personalized, client_id, self.layout.shared) or self.global_state
        direction = self.stored(self.direction, client_id, self.layout.trainable)
        if direction is None:
            direction = {n: torch.zeros_like(self.global_state[n]) for n in self.layout.trainable}
        return {**model, **{DIRECTION + n: t for n, t in direction.items()}}

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        trainable = self.layout.trainable
        models = [{n: u.params[n] for n in self.layout.shared} for u in updates]
        differences = torch.stack(
            [torch.cat([(m[n] - self.initial_state[n]).reshape(-1).double() for n in trainable]) for m in models]
        )
        distances = graph_distances(differences.cpu())
        total = sum(u.num_samples for u in updates)
        shares = torch.tensor([u.num_samples / total for u in updates], dtype=torch.float64)
        rows = []
        for i, update in enumerate(updates):
            row = graph_row(distances[i], shares, self.hparams.graph_alpha)
            rows.append(row.tolist())
            aggregated, direction = aggregate_by_graph(models, row.tolist(), trainable)
            for n, t in aggregated.items():
                self.personalized[f"{update.client_id}/{n}"] = t.detach().clone()
            for n, t in direction.items():
                self.direction[f"{update.client_id}/{n}"] = t.detach().clone()
        self.last_rows = rows

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        """a_ii (mean) and the number of clients with a_ij > 0 (mean) over the round's rows."""
        rows, self.last_rows = self.last_rows, []
        if not rows:
            return {}
        return {
            "pfedgraph_self_weight_mean": sum(row[i] for i, row in enumerate(rows)) / len(rows),
            "pfedgraph_neighbours_mean": sum(sum(a > 0 for a in row) for row in rows) / len(rows),
        }

    def personal_model(self, client_id: int) -> Tensors:
        """w̃_i (overridden, so that the engine evaluates each client with its own model)."""
        return self.model_state(self.program.assemble(self.broadcast(client_id), self.store.get(client_id)))

    def new_client_model(self, client_id: int) -> Tensors:
        """a = p over the clients' current models: Σ_j p_j·w̃_j with c = Σ_j p_j·w̃_j/‖w̃_j‖."""
        clients = sorted({int(key.partition("/")[0]) for key in self.personalized})
        if not clients:
            return self.broadcast(client_id)
        total = sum(self.num_train[k] for k in clients)
        models = [self.stored(self.personalized, k, self.layout.shared) for k in clients]
        aggregated, direction = aggregate_by_graph(
            models,  # type: ignore[arg-type]
            [self.num_train[k] / total for k in clients],
            self.layout.trainable,
        )
        return {**aggregated, **{DIRECTION + n: t for n, t in direction.items()}}

    def new_client_program(self) -> ClientProgram:
        return PFedGraphNewClientProgram(self.layout, self.hparams, self.config.local_spec)
