"""FedNova — Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020 (arXiv:2007.07481).

FedAvg weights each client's *total* change w − w_k, so a client that takes more local steps
pulls the global model towards its own optimum (objective inconsistency). FedNova averages the
changes normalized per step instead. Client k, after τ_k local SGD steps from w, contributes

    d_k = (w − w_k) / a_k                                   (``normalized_update``)

with a_k = ‖a‖₁ of its steps' weights: τ_k for plain SGD, and for SGD with momentum ρ
(heavy ball, ``--momentum``)

    a_k = [τ_k − ρ·(1 − ρ^τ_k)/(1 − ρ)] / (1 − ρ)          (``normalizing_factor``)

(the gradient of step s reaches w_k with weight Σ_{j<τ_k−s+1} ρ^j). The server steps

    τ_eff = Σ_k p_k·a_k,        w ← w − τ_eff·Σ_k p_k·d_k   (``fednova_step``)

with p_k = n_k/Σ n. When every a_k is equal this is FedAvg (tested).

Where local steps differ: each client runs ``--local-epochs`` epochs over its own train split,
so τ_k = epochs × its minibatches per epoch already differs with the client's data size; partial
work (a client stopped early) differs more. τ_k is the number of steps the client *actually*
took: the engine's batch loop counts its optimizer steps and the executor reports them with the
upload (``ClientUpdate.local_steps``), so a step cap (``ClientJob.max_steps``: a straggler's
partial work under ``--deadline-policy partial``) shows in a_k; it is not derived from the data
size.

Choices the paper leaves open, and ours:

- **p_k over the round's clients** (Σ p_k = 1 among the sampled clients). The paper's analysis
  has every client in every round (p_k = n_k/n); the authors' code weights by data size.
- **What travels**: the client uploads w_k (bytes_up, as FedAvg) and reports τ_k beside n_k as
  the update's metadata, which like n_k is not counted in bytes (8 bytes); the server forms a_k
  (from τ_k and the run's ``--momentum``) and d_k. The authors' code sends d_k and a_k: the same
  information.
- **A client that took no step** (a_k = 0) has d_k := 0: it adds nothing to τ_eff nor to the
  direction but keeps its weight p_k (the authors' code would divide by zero).
- **Weight decay, gradient clipping** (``--weight-decay``, ``--max-grad-norm``) change each
  step's gradient, not a_k (as in the authors' code). The authors' code also has a FedProx
  variant (a_k with the (1 − ημ) decay) and a server momentum (``gmf``, default 0): neither is
  offered here.
- **Float buffers** (BatchNorm statistics) have no gradient: averaged sample-weighted (FedAvg).
- **Optimizer**: a_k is defined for SGD steps (with or without momentum; DP-SGD's noised steps
  too). Adam's steps have no such coefficients, so ``check_config`` refuses ``--optimizer adam``.
- **Executors**: the clients train with the engine's own batch loop (no custom ``local_update``),
  so every executor hosts it. ``--executor vmap`` trains the round's clients together, each on
  its own batches; a client whose batches are exhausted takes no step while the others go on,
  and τ_k is reported as the batches the client drew (one optimizer step each; vmap has no step
  cap: ``--deadline-policy partial`` is refused there). Clients with different τ_k are therefore
  exact under vmap too: the same τ_k and a_k as sequential, the local models (and so the server
  step) equal to floating-point tolerance (tested).

Measured on digits (10 clients, α 0.1, 10 rounds, mlp, 2 local epochs, SGD lr 0.1, seed 0;
τ_k from 4 to 12): global accuracy 0.850 against FedAvg's 0.821, with momentum 0.9 0.925 against
0.876.

Hyperparameters: none of its own; a_k reads the run's ``--momentum`` (default 0, plain SGD).

``round_diagnostics`` logs τ_eff and the round's smallest and largest τ_k (``fednova_tau_eff``,
``fednova_steps_min``, ``fednova_steps_max`` in rounds.jsonl). No server state across rounds.

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

from typing import Any

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ClientUpdate,
    ConfigError,
    RunConfig,
    register_algorithm,
    sample_weights,
    weighted_average,
)


def normalizing_factor(steps: int, momentum: float) -> float:
    """a_k: τ for plain SGD; [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ) for heavy-ball momentum ρ."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


def normalized_update(model: torch.Tensor, local: torch.Tensor, factor: float) -> torch.Tensor:
    """d_k = (w − w_k)/a_k (zero when the client took no step, a_k = 0)."""
    if factor == 0:
        return torch.zeros_like(model)
    return (model - local) / factor


def fednova_step(
    model: torch.Tensor, locals_: list[torch.Tensor], factors: list[float], weights: list[float]
) -> torch.Tensor:
    """w − τ_eff·Σ_k p_k·d_k with τ_eff = Σ_k p_k·a_k (weights p_k used as given)."""
    tau_eff = sum(p * a for p, a in zip(weights, factors))
    direction = sum(p * normalized_update(model, w_k, a) for p, w_k, a in zip(weights, locals_, factors))
    return model - tau_eff * direction


def client_steps(update: ClientUpdate) -> int:
    """τ_k as the executor reported it (``ClientUpdate.local_steps``)."""
    if update.local_steps is None:
        raise RuntimeError(
            f"fednova needs each client's local step count, and client {update.client_id}'s update has none "
            "(its executor does not report ClientUpdate.local_steps)"
        )
    return update.local_steps


@register_algorithm("fednova")
class FedNova(Algorithm):
    """Normalized averaging: each client's change divided by its (momentum-weighted) step count."""

    capabilities = Capabilities(same_broadcast=True, received_personal_model=True)

    display_name = "FedNova"
    paper = "Wang et al., NeurIPS 2020"
    method_family = "global"

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.optimizer != "sgd":
            raise ConfigError(
                f"fednova normalizes each client's update by its SGD step count (a_k = τ_k, momentum-"
                f"corrected with --momentum); --optimizer {config.optimizer} has no such a_k: use --optimizer sgd"
            )

    def factors(self, updates: list[ClientUpdate]) -> list[float]:
        """a_k of each update, from its τ_k and the run's momentum."""
        return [normalizing_factor(client_steps(u), self.config.momentum) for u in updates]

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        weights, factors = sample_weights(updates), self.factors(updates)
        trainable = set(self.layout.trainable)
        buffers = [n for n in self.global_state if n not in trainable]
        averaged = weighted_average([{n: u.params[n] for n in buffers} for u in updates], weights) if buffers else {}
        for name, model in self.global_state.items():
            if name in trainable:
                model.copy_(fednova_step(model, [u.params[name] for u in updates], factors, weights))
            else:
                model.copy_(averaged[name])  # a float buffer: averaged

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        if not updates:
            return {}
        steps = [client_steps(u) for u in updates]
        tau_eff = sum(p * a for p, a in zip(sample_weights(updates), self.factors(updates)))
        return {"fednova_tau_eff": tau_eff, "fednova_steps_min": min(steps), "fednova_steps_max": max(steps)}
