"""FedRep — Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021 (arXiv:2102.07078).

Same body/head split as FedPer, but local training alternates: ``--head-epochs`` epochs on
the head with the body frozen, then ``--local-epochs`` epochs on the body with the head
frozen. Only the body is uploaded. Each phase gets its own optimizer over its own
parameters, so momentum or weight decay can never move a frozen part.

Defaults: ``--head-epochs`` 10, the paper's ten head epochs per round (followed by one epoch of
the representation, here ``--local-epochs``; the authors' code: ``local_ep`` 11 with
``local_rep_ep`` 1); the body/head split is the run's ``--head-layers`` (default 1).

New clients (``--new-clients``): the trained body (frozen) with a fresh head trained on the
client's train split for ``--head-epochs`` epochs — FedRep's own head phase, which is how the
paper adapts its learned representation to new clients.
"""

from __future__ import annotations

from dataclasses import dataclass

from pflbench import (
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalPhase,
    ProgramCapabilities,
    option,
    register_algorithm,
)
from pflbench.algorithms.fedper import FedPer


@dataclass(frozen=True)
class FedRepHyperparameters:
    head_epochs: int = option(10, "Head-only epochs (body frozen) before the body epochs.")

    def validate(self) -> None:
        if self.head_epochs < 0:
            raise ConfigError(f"--head-epochs must be ≥ 0, got {self.head_epochs}")


class FedRepProgram(ClientProgram[FedRepHyperparameters]):
    capabilities = ProgramCapabilities(batch_loop=True, model_upload=True)

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        layout = self.layout
        body = frozenset(n for n in layout.trainable if n in set(layout.shared))
        head = frozenset(layout.trainable) - body
        return [LocalPhase(self.hparams.head_epochs, head), LocalPhase(self.local.epochs, body)]


@register_algorithm("fedrep")
class FedRep(FedPer):
    """FedPer with alternating local phases: head epochs (body frozen), then body epochs."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedRep"
    paper = "Collins et al., ICML 2021"
    method_family = "decoupling"
    hyperparameters = FedRepHyperparameters
    program_class = FedRepProgram

    def new_client_epochs(self) -> int:
        """A new client's fresh head trains for FedRep's head epochs."""
        return self.hparams.head_epochs
