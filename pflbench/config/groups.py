"""The settings each stage of a run receives: frozen groups of ``RunConfig``'s flat fields
(``config.data_spec``, ``config.partition_spec``, ...), with the identity rules of their group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "DataSpec",
    "FederationSpec",
    "InitSpec",
    "LoRASpec",
    "LocalSpec",
    "ModelSpec",
    "PartitionSpec",
    "RuntimeSpec",
]


@dataclass(frozen=True)
class DataSpec:
    dataset: str
    options: dict[str, Any]


@dataclass(frozen=True)
class PartitionSpec:
    """What the partition stage reads (field names as in ``RunConfig``)."""

    dataset: str
    partition: str
    num_clients: int
    alpha: float
    shards_per_client: int
    min_size: int
    test_frac: float
    public_frac: float
    seed: int
    dirichlet_cut: str
    partition_file: str | None

    def identity(self) -> dict[str, Any]:
        """The settings the partitioner reads (alpha only for Dirichlet ones, shards for shards)."""
        read: dict[str, Any] = {
            "partition": self.partition,
            "num_clients": self.num_clients,
            "test_frac": self.test_frac,
            "public_frac": self.public_frac,
        }
        if self.partition_file is not None:
            return {**read, "partition_file": self.partition_file}
        if self.partition.startswith("dirichlet"):
            read.update(alpha=self.alpha, min_size=self.min_size)
        if self.partition == "dirichlet":
            read["dirichlet_cut"] = self.dirichlet_cut
        if self.partition == "shards":
            read["shards_per_client"] = self.shards_per_client
        return read


@dataclass(frozen=True)
class ModelSpec:
    name: str
    options: dict[str, Any]
    head_layers: int


@dataclass(frozen=True)
class InitSpec:
    pretrained: bool
    weights: str | None
    backbone: str
    pretrain_epochs: int
    pretrain_lr: float

    def pretrains(self, uses_lora: bool) -> bool:
        """Whether the run starts from a backbone pretrained on the public fraction."""
        if self.weights or self.pretrained or self.backbone == "random":
            return False
        return self.backbone == "public" or uses_lora


@dataclass(frozen=True)
class LoRASpec:
    rank: int | None
    alpha: float
    targets: str


@dataclass(frozen=True)
class FederationSpec:
    num_clients: int
    frac: float
    rounds: int
    eval_every: int


@dataclass(frozen=True)
class LocalSpec:
    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    momentum: float
    weight_decay: float
    max_grad_norm: float

    def identity(self) -> dict[str, Any]:
        read = {
            "local_epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "optimizer": self.optimizer,
            "weight_decay": self.weight_decay,
            "max_grad_norm": self.max_grad_norm,
        }
        if self.optimizer == "sgd":
            read["momentum"] = self.momentum
        return read


@dataclass(frozen=True)
class RuntimeSpec:
    seed: int
    device: str
    executor: str
    out: str
    threads: int
