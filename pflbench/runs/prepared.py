"""A run built and ready to execute: what ``runs.prepare.prepare`` returns and ``runs.execute`` runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset
from pflbench.data.partition import Partition
from pflbench.engine import Algorithm, Executor


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

    @property
    def server(self) -> Algorithm:  # the name before the executor seam
        return self.algorithm

    @property
    def hparams(self) -> Any:  # what the trackers log as algo_hparams.*
        return self.algorithm.hparams
