"""Robust aggregation: rules that replace the FedAvg average of the clients' model updates.

Each rule works on the round's model updates Δ_k = upload_k − received (every uploaded tensor,
the global model as it was broadcast) and the server sets w ← received + rule(Δ_1, …, Δ_m). It
is selected with ``--robust-agg`` for any algorithm whose upload is a model update averaged by
the default FedAvg rule (the ``averaged-upload`` capability, as ``--dp client``); the others
are refused at planning, as are Krum settings the clients per round cannot meet
(``config.settings.robust.RobustSettings.check_run``).

- ``median``: the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust
  Distributed Learning: Towards Optimal Statistical Rates", ICML 2018). With an even number of
  updates the mean of the two middle values (the usual median; ``torch.median`` would return
  the lower one).
- ``trimmed-mean``: the coordinate-wise β-trimmed mean (same paper): per coordinate the
  ⌊β·m⌋ largest and ⌊β·m⌋ smallest values are removed and the rest averaged
  (β = ``--trim-frac``, per side, < 0.5).
- ``krum`` / ``multi-krum`` (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
  Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017): each update's score is the
  sum of its squared distances to its m − f − 2 closest other updates (f = ``--krum-f``
  Byzantine clients assumed); Krum takes the update with the lowest score, Multi-Krum the
  uniform mean of the ``--krum-select`` lowest-scoring ones (0, the default: m − f of them).
  The paper needs m > 2f + 2: a run whose M (clients sampled per round) is not is refused.
  When fewer report (dropout), the neighbour count m − f − 2 is floored at 1 (one report: it
  is taken). Ties go to the lower position in the round's (job) order.
- ``norm-bound`` (Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor Federated
  Learning?", 2019): each update is scaled into the ball of radius M (``--norm-bound``),
  Δ·min(1, M/‖Δ‖₂) (the norm over every uploaded tensor as one vector), then averaged with
  FedAvg's sample weights n_k / Σn.

The paper rules (median, trimmed mean, Krum) weight the clients equally, as their papers do:
weighting by claimed sample counts would let an attacker buy weight. Krum's distances are
computed in float64 on the CPU, so its choice does not depend on the device. The rules hold
every update of the round (order statistics and distances need all of them), not a running sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from pflbench.config.groups import RobustSpec
from pflbench.config.run_config import ROBUST_AGGREGATORS
from pflbench.engine.privacy import clip_update, model_update
from pflbench.engine.types import ClientUpdate, Tensors


# ---- pure functions: the rules on lists of updates ------------------------------------------
def _stacked(updates: Sequence[Tensors], name: str) -> torch.Tensor:
    return torch.stack([update[name] for update in updates])


def coordinate_median(updates: Sequence[Tensors]) -> Tensors:
    """Per coordinate the median over the updates (the mean of the two middle values for an even count)."""
    count = len(updates)
    result = {}
    for name in updates[0]:
        ordered = _stacked(updates, name).sort(dim=0).values
        middle = count // 2
        result[name] = ordered[middle] if count % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return result


def trimmed_count(count: int, trim_frac: float) -> int:
    """⌊β·m⌋: the values removed on each side of every coordinate."""
    return math.floor(trim_frac * count)


def trimmed_mean(updates: Sequence[Tensors], trim_frac: float) -> Tensors:
    """Per coordinate the mean of the values left after removing the ⌊β·m⌋ largest and smallest."""
    count = len(updates)
    cut = trimmed_count(count, trim_frac)
    if 2 * cut >= count:
        raise ValueError(f"trimming {cut} per side of {count} updates leaves none")
    return {name: _stacked(updates, name).sort(dim=0).values[cut : count - cut].mean(dim=0) for name in updates[0]}


def flat_updates(updates: Sequence[Tensors]) -> torch.Tensor:
    """[m, d] float64: each update as one vector (its tensors in the first update's order)."""
    names = list(updates[0])
    return torch.stack([torch.cat([u[n].detach().double().reshape(-1).cpu() for n in names]) for u in updates])


def krum_scores(updates: Sequence[Tensors], byzantine: int) -> torch.Tensor:
    """Each update's Krum score: the sum of its squared distances to its max(m − f − 2, 1)
    closest other updates (0 for a lone update)."""
    count = len(updates)
    if count == 1:
        return torch.zeros(1, dtype=torch.float64)
    flat = flat_updates(updates)
    distances = torch.cdist(flat, flat).pow(2)
    neighbours = max(count - byzantine - 2, 1)
    others = distances.masked_fill(torch.eye(count, dtype=torch.bool), math.inf)
    return others.sort(dim=1).values[:, :neighbours].sum(dim=1)


def krum_selection(updates: Sequence[Tensors], byzantine: int, select: int) -> list[int]:
    """The positions of the ``select`` lowest Krum scores (ties: the lower position), sorted."""
    scores = krum_scores(updates, byzantine)
    order = sorted(range(len(updates)), key=lambda i: (float(scores[i]), i))
    return sorted(order[: min(select, len(updates))])


def uniform_mean(updates: Sequence[Tensors]) -> Tensors:
    return {name: _stacked(updates, name).mean(dim=0) for name in updates[0]}


def norm_bounded_mean(
    updates: Sequence[Tensors], weights: Sequence[float], bound: float
) -> tuple[Tensors, list[float]]:
    """(Σ_k w_k·Δ_k·min(1, M/‖Δ_k‖), the norms before): each update clipped to M, then the
    weighted mean (``weights`` sum to 1)."""
    total: Tensors = {}
    norms = []
    for update, weight in zip(updates, weights):
        clipped, norm = clip_update(update, bound)
        norms.append(norm)
        for name, value in clipped.items():
            total[name] = total[name] + value * weight if name in total else value * weight
    return total, norms


def robust_aggregate(
    spec: RobustSpec, updates: Sequence[Tensors], num_samples: Sequence[int]
) -> tuple[Tensors, dict[str, Any]]:
    """The dispatcher: (the aggregated update, what the round records about it) under ``spec.rule``;
    ``num_samples``: each update's n_k (read by ``norm-bound`` only)."""
    if not updates:
        raise ValueError("robust_aggregate needs at least one update")
    if spec.rule == "median":
        return coordinate_median(updates), {}
    if spec.rule == "trimmed-mean":
        return trimmed_mean(updates, spec.trim_frac), {}
    if spec.rule in ("krum", "multi-krum"):
        select = 1 if spec.rule == "krum" else spec.krum_select or max(len(updates) - spec.krum_f, 1)
        chosen = krum_selection(updates, spec.krum_f, select)
        return uniform_mean([updates[i] for i in chosen]), {"selected": chosen}
    if spec.rule == "norm-bound":
        total = sum(num_samples)
        mean, norms = norm_bounded_mean(updates, [n / total for n in num_samples], spec.norm_bound)
        return mean, {"clipped": sum(norm > spec.norm_bound for norm in norms)}
    raise ValueError(f"unknown robust aggregator {spec.rule!r}; valid: {', '.join(ROBUST_AGGREGATORS[1:])}")


# ---- the aggregation stream (Federation.aggregation's add/finish interface) -------------------
class RobustAggregation:
    """Holds the round's updates (``add``), then writes received + rule(Δ…) into ``target``
    (``finish``). Unlike FedAvg's stream it keeps every upload of the round: order statistics
    and distances need all of them. ``record``: the round's entries for rounds.jsonl."""

    def __init__(self, target: Tensors, spec: RobustSpec) -> None:
        self.target, self.spec = target, spec
        self.received = {name: t.detach().clone() for name, t in target.items()}
        self.updates: list[Tensors] = []
        self.clients: list[int] = []
        self.num_samples: list[int] = []
        self.record: dict[str, Any] = {}

    def add(self, update: ClientUpdate) -> None:
        if not update.params:
            return
        self.updates.append(model_update(update.params, self.received))
        self.clients.append(update.client_id)
        self.num_samples.append(update.num_samples)

    def finish(self) -> None:
        if self.updates:
            aggregated, found = robust_aggregate(self.spec, self.updates, self.num_samples)
            with torch.no_grad():
                for name, value in aggregated.items():
                    self.target[name].copy_(self.received[name] + value)
            if "selected" in found:  # Krum: which clients' updates were kept
                self.record["robust_selected"] = [self.clients[i] for i in found["selected"]]
            if "clipped" in found:
                self.record["robust_clipped_frac"] = found["clipped"] / len(self.updates)
        self.updates = []
