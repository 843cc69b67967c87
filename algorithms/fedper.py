"""FedPer — Arivazhagan et al., "Federated Learning with Personalization Layers", 2019
(arXiv:1912.00818).

The model is split into a shared body and a private head (the last ``--head-layers``
layers, as the model declares them). Clients train body and head jointly; only the body is
uploaded and averaged (sample-weighted); each client keeps its head across rounds.
"""
from __future__ import annotations

from pflbench.engine import Server
from pflbench.models import head_parameter_names
from pflbench.registry import register_algorithm


@register_algorithm("fedper")
class FedPer(Server):
    """Shared body averaged FedAvg-style; private head per client; no global model."""

    has_global_model = False  # a body without a head has no accuracy of its own

    def select_shared(self, names: list[str]) -> list[str]:
        head = head_parameter_names(self.model, self.config.head_layers)
        return [name for name in names if name not in head]
