"""Local — every client trains its own model from the same init and never communicates.

The lower bound personalized methods must beat (often strong under heavy label skew).
"""
from __future__ import annotations

from pflbench.engine import Server
from pflbench.registry import register_algorithm


@register_algorithm("local")
class Local(Server):
    """Everything is private: nothing is sent, nothing is aggregated, no global model."""

    has_global_model = False

    def select_shared(self, names: list[str]) -> list[str]:
        return []
