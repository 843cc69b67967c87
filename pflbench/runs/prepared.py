"""A run built and ready to execute: what ``runs.prepare.prepare`` returns and ``runs.execute`` runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflbench.config import identity as identity_owner
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset
from pflbench.data.partition import Partition
from pflbench.engine import Algorithm, Executor


@dataclass(frozen=True)
class RunIdentity:
    """A run's identity, computed once when the run is planned (its number of clients fitted)
    and passed along to every stage that records or checks it: ``settings``, exactly the
    settings the run reads (config.json's ``identity``); ``hash``, their hash (config.json's
    ``identity_hash``, the checkpoint's key, models.json); ``name``, the run folder's name."""

    settings: dict[str, Any]
    hash: str
    name: str

    @classmethod
    def of(cls, config: RunConfig, algorithm_class: Any, hparams: Any) -> RunIdentity:
        settings = identity_owner.identity_settings(config, algorithm_class, hparams)
        digest = identity_owner.identity_hash(settings)
        return cls(settings, digest, identity_owner.folder_name(config, digest))


@dataclass
class PreparedRun:
    config: RunConfig  # resolved
    algorithm: Algorithm
    executor: Executor
    partition: Partition
    dataset: TensorDataset
    data: FederatedData
    run_dir: Path
    resolved: dict[str, Any]  # how the run was resolved (defaults filled, backbone, LoRA)
    identity: RunIdentity

    @property
    def server(self) -> Algorithm:  # the name before the executor seam
        return self.algorithm

    @property
    def hparams(self) -> Any:  # what the trackers log as algo_hparams.*
        return self.algorithm.hparams
