"""The survey's taxonomy of pFL methods (design note ``004_*``), in the order ``pflbench list``
and leaderboards show it. An algorithm names its family with the class attribute
``method_family = "<key>"`` (a literal, so ``pflbench list`` reads it without importing torch).

Keys are stable (they appear in config.json and leaderboard columns); titles are what people read.
"""

from __future__ import annotations

METHOD_FAMILIES: dict[str, str] = {
    "global": "Global model (FedAvg, drift correction, server optimizers)",
    "regularization": "Model interpolation and regularisation",
    "meta_learning": "Meta-learning",
    "decoupling": "Parameter decoupling (shared base, personal part)",
    "representation": "Representation and prototype learning",
    "distillation": "Knowledge distillation",
    "multi_task": "Multi-task learning",
    "clustering": "Client clustering",
    "mixture_of_experts": "Mixture of experts",
    "model_combination": "Dynamic model combination",
    "hypernetwork": "Hypernetworks",
    "memorization": "Local memorization (a global model plus each client's own datastore)",
    "mode_connectivity": "Mode connectivity (a solution simplex of connected models)",
    "low_rank": "Low-rank adaptation of pretrained models",
    "local": "No federation (local training only)",
}

# What a table's Family column shows (short; the titles above are for `pflbench list`).
SHORT_LABELS: dict[str, str] = {
    "global": "global model",
    "regularization": "regularisation",
    "meta_learning": "meta-learning",
    "decoupling": "decoupling",
    "representation": "representation",
    "distillation": "distillation",
    "multi_task": "multi-task",
    "clustering": "clustering",
    "mixture_of_experts": "mixture of experts",
    "model_combination": "model combination",
    "hypernetwork": "hypernetwork",
    "memorization": "local memorization",
    "mode_connectivity": "mode connectivity",
    "low_rank": "low-rank adaptation",
    "local": "local only",
}

UNGROUPED = "other"  # an algorithm (e.g. a plugin) that names no family, or one not listed above


def family_of(key: object) -> str:
    """``key`` if it is a known family, else ``UNGROUPED``."""
    return key if isinstance(key, str) and key in METHOD_FAMILIES else UNGROUPED


def family_title(key: str) -> str:
    return METHOD_FAMILIES.get(key, "Other (no family named)")


def short_label(key: str) -> str:
    return SHORT_LABELS.get(key, UNGROUPED)


def family_rank(key: str) -> int:
    """Position in the survey's order (unknown families last)."""
    order = list(METHOD_FAMILIES)
    return order.index(key) if key in order else len(order)
