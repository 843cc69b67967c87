"""Local — every client trains its own model from the same init and never communicates.

The lower bound personalized methods must beat (often strong under heavy label skew).
Hyperparameters: none of its own (the run's local settings apply).

New clients (``--new-clients``): nothing is shared, so a new client gets what the federation
gives every method's newcomer as adaptation budget: its own model, trained from the initial
weights on its train split for ``--local-epochs`` epochs (``Algorithm``'s default: the whole
model is the private part).
"""

from __future__ import annotations

from pflbench import Algorithm, Capabilities, register_algorithm


@register_algorithm("local")
class Local(Algorithm):
    """Everything is private: nothing is sent, nothing is aggregated, no global model."""

    capabilities = Capabilities.of_defaults()

    display_name = "Local"
    paper = "baseline: no communication"
    method_family = "local"
    has_global_model = False
    uploads_nothing = True

    def select_shared(self, names: list[str]) -> list[str]:
        return []
