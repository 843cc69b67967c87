"""The setting groups that make up a run's configuration, each the one owner of its options'
declaration (name, type, default, help), their checks, their share of the run identity and
which of them a run does not read (``base.SettingGroup``). ``RunConfig`` composes them
(``config.run_config``); validation, the run's checks (``check_run``: what the algorithm, K,
the data or the built upload must allow), identity and the refusal of inert options loop over
``GROUPS``."""

from __future__ import annotations

from typing import Any

from pflbench.config.settings.attack import AttackSettings
from pflbench.config.settings.availability import AvailabilitySettings
from pflbench.config.settings.backbone import BackboneSettings
from pflbench.config.settings.base import (
    AlgorithmFacts,
    ClientCounts,
    DataFacts,
    RunFacts,
    RunReads,
    SettingGroup,
    UploadFacts,
)
from pflbench.config.settings.execution import ExecutionSettings
from pflbench.config.settings.experiment import ExperimentSettings
from pflbench.config.settings.local import LocalSettings
from pflbench.config.settings.lora import LoRASettings
from pflbench.config.settings.model import ModelSettings
from pflbench.config.settings.new_clients import NewClientsSettings
from pflbench.config.settings.output import OutputSettings
from pflbench.config.settings.partition import PartitionSettings
from pflbench.config.settings.privacy import PrivacySettings
from pflbench.config.settings.robust import RobustSettings
from pflbench.config.settings.rounds import RoundsSettings

__all__ = [
    "GROUPS",
    "OMITTED_AT_DEFAULT",
    "AlgorithmFacts",
    "AttackSettings",
    "AvailabilitySettings",
    "BackboneSettings",
    "ClientCounts",
    "DataFacts",
    "ExecutionSettings",
    "ExperimentSettings",
    "LoRASettings",
    "LocalSettings",
    "ModelSettings",
    "NewClientsSettings",
    "OutputSettings",
    "PartitionSettings",
    "PrivacySettings",
    "RobustSettings",
    "RoundsSettings",
    "RunFacts",
    "RunReads",
    "SettingGroup",
    "UploadFacts",
]

# In the order their checks run (the first bad value is the one reported).
GROUPS: tuple[type[SettingGroup], ...] = (
    ExperimentSettings,
    PartitionSettings,
    NewClientsSettings,
    RoundsSettings,
    LocalSettings,
    ModelSettings,
    BackboneSettings,
    LoRASettings,
    ExecutionSettings,
    AvailabilitySettings,
    PrivacySettings,
    AttackSettings,
    RobustSettings,
    OutputSettings,
)

# Settings a run's identity leaves out at these values (the numbers are those of the default;
# --executor ray gives sequential's numbers too): how a table names a run that omits them.
OMITTED_AT_DEFAULT: dict[str, Any] = {
    name: group.default(name) for group in GROUPS for name in group.omitted_at_default
}
