"""LG-FedAvg — Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", 2020 (arXiv:2001.01523).

The reverse of FedPer: each client keeps its own *local representation* (the body: every layer
below the last ``--head-layers`` layers) and the *global* part is the head, trained by every
client and averaged FedAvg-style: h ← Σ_k n_k·h_k / Σ_k n_k. Local training updates body and head
jointly on the plain cross-entropy loss (the paper's auxiliary objectives for the local
representations are optional and not implemented).

State: shared = the head (sent down and uploaded, counted in bytes); private = the body, kept on
each client across rounds (all clients start from the same initial body; the paper optionally
initialises them from a FedAvg-pretrained model, not done here). Evaluation: own body + current
global head. A head without a body has no accuracy of its own: no global model.

New clients (``--new-clients``): the current global head (frozen) with a fresh local body (the
initial one) trained on the client's train split for ``--local-epochs`` epochs (``Algorithm``'s
default: the private part is the body).
"""

from __future__ import annotations

from pflbench import Algorithm, register_algorithm
from pflbench.models.zoo import head_parameter_names


@register_algorithm("lgfedavg")
class LGFedAvg(Algorithm):
    """Private body per client; the head (last --head-layers layers) is shared and averaged."""

    display_name = "LG-FedAvg"
    paper = "Liang et al., arXiv:2001.01523, 2020"
    method_family = "decoupling"
    has_global_model = False  # the global part is only the head
    uses_head_layers = True

    def select_shared(self, names: list[str]) -> list[str]:
        head = head_parameter_names(self.model, self.config.head_layers)
        return [name for name in names if name in head]
