"""FedRep — Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021 (arXiv:2102.07078).

Same body/head split as FedPer, but local training alternates: ``--head-epochs`` epochs on
the head with the body frozen, then ``--local-epochs`` epochs on the body with the head
frozen. Only the body is uploaded. Each phase gets its own optimizer over its own
parameters, so momentum or weight decay can never move a frozen part.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflbench.algorithms.fedper import FedPer
from pflbench.config import option
from pflbench.engine import Client, LocalPhase
from pflbench.errors import ConfigError
from pflbench.registry import register_algorithm


@dataclass(frozen=True)
class FedRepHyperparameters:
    head_epochs: int = option(10, "Head-only epochs (body frozen) before the body epochs.")

    def validate(self) -> None:
        if self.head_epochs < 0:
            raise ConfigError(f"--head-epochs must be ≥ 0, got {self.head_epochs}")


class FedRepClient(Client):
    def local_phases(self) -> list[LocalPhase]:
        server = self.server
        body = frozenset(n for n in server.trainable_names if n in set(server.shared_names))
        head = frozenset(server.trainable_names) - body
        return [LocalPhase(self.hparams.head_epochs, head),
                LocalPhase(self.config.local_epochs, body)]


@register_algorithm("fedrep")
class FedRep(FedPer):
    """FedPer with alternating local phases: head epochs (body frozen), then body epochs."""

    hyperparameters = FedRepHyperparameters
    client_class = FedRepClient
