"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017 (arXiv:1602.05629).

Clients start from the global weights w, train every trainable parameter and upload it;
the server sets w ← Σ_k n_k·w_k / Σ_k n_k. All of this is the engine's default behaviour.

Hyperparameters: none of its own; the run's local settings (``--lr``, ``--local-epochs``,
``--batch-size``, ``--optimizer``) are the suite's, shared by every algorithm.

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

from pflbench import Algorithm, Capabilities, register_algorithm


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """Sample-weighted averaging of full models; personalized accuracy = the global model."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedAvg"
    paper = "McMahan et al., AISTATS 2017"
    method_family = "global"
