"""FedPer — Arivazhagan et al., "Federated Learning with Personalization Layers", 2019
(arXiv:1912.00818).

The model is split into a shared body and a private head (the last ``--head-layers``
layers, as the model declares them). Clients train body and head jointly; only the body is
uploaded and averaged (sample-weighted); each client keeps its head across rounds.

Defaults: no hyperparameters of its own. The split is the run's ``--head-layers`` (default 1,
this suite's choice for every decoupling method); the paper's experiments keep the last one or
two layers personal.

New clients (``--new-clients``): the trained body (frozen) with a fresh head (the initial one)
trained on the client's train split for ``--local-epochs`` epochs (``Algorithm``'s default).
"""

from __future__ import annotations

from pflbench import Algorithm, Capabilities, register_algorithm
from pflbench.models.zoo import head_parameter_names


@register_algorithm("fedper")
class FedPer(Algorithm):
    """Shared body averaged FedAvg-style; private head per client; no global model."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedPer"
    paper = "Arivazhagan et al., arXiv:1912.00818, 2019"
    method_family = "decoupling"
    has_global_model = False  # a body without a head has no accuracy of its own
    uses_head_layers = True

    def select_shared(self, names: list[str]) -> list[str]:
        head = head_parameter_names(self.model, self.config.head_layers)
        return [name for name in names if name not in head]
