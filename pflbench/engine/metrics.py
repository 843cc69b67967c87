"""Metrics of SPEC §3 as pure functions of per-client counts, and the run summary."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ACCURACY_METRICS = ("pers_acc", "pers_acc_weighted", "pers_acc_std", "pers_acc_worst10", "global_acc")
FINETUNE_METRICS = ("pers_acc_ft", "pers_acc_ft_weighted", "new_acc_ft", "new_acc_ft_weighted")
# --val-frac: the same metrics on the training clients' validation splits
VAL_METRICS = tuple(f"val_{name}" for name in ACCURACY_METRICS)
# --new-clients: the new clients, each with the model the algorithm serves it (its test split)
NEW_CLIENT_METRICS = ("new_acc", "new_acc_weighted", "new_acc_std", "new_acc_worst10")
# --holdout-domain: the held-out domain's samples (engine.evaluator.HeldOutProtocol)
OOD_METRICS = ("ood_acc",)
# --attack backdoor: the attack success rate on triggered test inputs (engine.attacks)
ATTACK_METRICS = ("asr",)


def worst_fraction_mean(values: np.ndarray, fraction: float = 0.1) -> float:
    """Mean of the lowest ceil(fraction·K) values (at least one)."""
    count = max(1, math.ceil(fraction * len(values)))
    return float(np.sort(values)[:count].mean())


def accuracy_metrics(correct: np.ndarray, totals: np.ndarray, name: str = "pers_acc") -> dict[str, float]:
    """Personalized accuracy over clients from per-client correct counts and split sizes.

    pers_acc = mean_k acc_k; pers_acc_weighted = Σ correct / Σ samples; pers_acc_std =
    population std of acc_k; pers_acc_worst10 = mean of the worst 10% of clients. ``name``
    replaces ``pers_acc`` in the keys (``val_pers_acc``, ``new_acc``).
    """
    correct, totals = np.asarray(correct, dtype=float), np.asarray(totals, dtype=float)
    accuracy = correct / totals
    return {
        name: float(accuracy.mean()),
        f"{name}_weighted": float(correct.sum() / totals.sum()),
        f"{name}_std": float(accuracy.std()),
        f"{name}_worst10": worst_fraction_mean(accuracy),
    }


def last_fraction_mean(values: list[float | None], fraction: float = 0.1) -> float | None:
    """Mean of the last ceil(fraction·n) evaluations (never the best one)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    count = max(1, math.ceil(fraction * len(present)))
    return float(np.mean(present[-count:]))


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Final values, means of the last 10% of evaluations, and communication totals. The
    validation (``--val-frac``), new-client (``--new-clients``) and out-of-domain
    (``--holdout-domain``: ``ood_acc``) metrics appear when the run measured them."""
    evaluated = [r for r in records if "pers_acc" in r]
    final = evaluated[-1] if evaluated else {}
    summary: dict[str, Any] = {}
    measured = [
        n for n in (*VAL_METRICS, *NEW_CLIENT_METRICS, *OOD_METRICS, *ATTACK_METRICS) if any(n in r for r in evaluated)
    ]
    for name in (*ACCURACY_METRICS, *measured):
        summary[name] = final.get(name)
        summary[f"{name}_last10"] = last_fraction_mean([r.get(name) for r in evaluated])
    for name in FINETUNE_METRICS:  # --finetune-epochs: measured once, after the last round
        if name in final:
            summary[name] = final[name]
    last = records[-1] if records else {}
    summary.update(
        rounds=len(records),
        evaluations=len(evaluated),
        final_train_loss=last.get("train_loss"),
        bytes_up_total=last.get("bytes_up_cum", 0),
        bytes_down_total=last.get("bytes_down_cum", 0),
        round_time_s_mean=float(np.mean([r["round_time_s"] for r in records])) if records else None,
        peak_mem_mb=max((r.get("peak_mem_mb", 0.0) for r in records), default=None),
    )
    if "dp_epsilon" in last:  # --dp: the privacy spent by the whole run (engine.privacy)
        summary["dp_epsilon"] = last["dp_epsilon"]
    if any("sim_time_cum" in r for r in records):  # the system model (engine.availability)
        summary.update(
            sim_time_total=last.get("sim_time_cum"),
            clients_reported_mean=float(np.mean([len(r["reported"]) for r in records])),
        )
    return summary
