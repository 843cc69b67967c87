"""The settings each stage of a run receives: frozen views of ``RunConfig``'s setting groups
(``config.partition_spec``, ``config.federation_spec``, ...). A stage reads its view, not the
whole flat config: the partition stage ``PartitionSpec``, the initial weights ``InitSpec``, the
client programs ``LocalSpec``, the round loop ``FederationSpec``, an executor ``ExecutorSpec``.

Each view lives beside the setting group it is built from (``config.settings.*``), which owns
its defaults; ``FederationSpec``, which composes them, lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pflbench.config.settings.attack import AttackSpec
from pflbench.config.settings.availability import AvailabilitySpec
from pflbench.config.settings.backbone import InitSpec
from pflbench.config.settings.execution import ExecutorSpec
from pflbench.config.settings.local import LocalSpec
from pflbench.config.settings.partition import PartitionSpec
from pflbench.config.settings.privacy import PrivacySpec
from pflbench.config.settings.robust import RobustSpec

__all__ = [
    "AttackSpec",
    "AvailabilitySpec",
    "ExecutorSpec",
    "FederationSpec",
    "InitSpec",
    "LocalSpec",
    "PartitionSpec",
    "PrivacySpec",
    "RobustSpec",
]


@dataclass(frozen=True)
class FederationSpec:
    """What the round loop reads (``engine.federation.Federation``)."""

    num_clients: int
    sampled_per_round: int
    rounds: int
    eval_every: int
    seed: int
    finetune_epochs: int
    local: LocalSpec  # the fine-tuning of --finetune-epochs trains like a client
    availability: AvailabilitySpec = AvailabilitySpec()  # off: every sampled client reports
    privacy: PrivacySpec | None = None  # --dp client|sample (engine.privacy); None: off
    attack: AttackSpec | None = None  # --attack (engine.attacks); None: every client is honest
    robust: RobustSpec | None = None  # --robust-agg (engine.robust); None: the algorithm's own rule
