"""The settings each stage of a run receives: frozen groups of ``RunConfig``'s flat fields
(``config.partition_spec``, ``config.federation_spec``, ...). A stage reads its group, not the
whole flat config: the partition stage ``PartitionSpec``, the initial weights ``InitSpec``, the
client programs ``LocalSpec``, the round loop ``FederationSpec``, an executor ``ExecutorSpec``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
class PartitionSpec:
    """What the partition stage reads (field names as in ``RunConfig``)."""

    dataset: str
    partition: str
    num_clients: int | None  # None until fitted (data.partition.fit_num_clients)
    alpha: float
    shards_per_client: int
    min_size: int
    test_frac: float
    public_frac: float
    seed: int
    dirichlet_cut: str
    partition_file: str | None
    val_frac: float  # each client's validation split, carved out of its train split
    new_clients: float  # fraction of clients held out of training (data.partition.choose_new_clients)
    sizes: str = "none"  # quantity skew: the size distribution (data.quantity); "none" = off
    size_param: float = 1.0  # its parameter (β or σ)
    feature_shift: str = ""  # comma-separated transforms (data.feature_shift); "" = off
    shift_groups: int = 0  # domains of the feature shift; 0 = one per client
    holdout_domain: str | None = None  # domain kept out of training for ood_acc (data.domains); None = off


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
class AvailabilitySpec:
    """Client availability, dropout, stragglers and a deadline (``engine.availability``; field
    names as in ``RunConfig``). At the defaults it is off: every sampled client reports."""

    dropout: float = 0.0
    availability: str = "always"
    availability_rate: float = 0.5
    availability_period: int = 24
    straggler_model: str = "none"
    straggler_sigma: float = 1.0
    sample_time: float = 0.01
    bandwidth: float = 1.0
    deadline: float | None = None
    deadline_policy: str = "drop"
    over_select: float = 0.0

    @property
    def active(self) -> bool:
        """Whether anything is simulated (then rounds.jsonl records who reported and sim_time)."""
        return (
            self.dropout > 0
            or self.availability != "always"
            or self.straggler_model != "none"
            or self.deadline is not None
            or self.over_select > 0
        )


@dataclass(frozen=True)
class PrivacySpec:
    """Differential privacy (``engine.privacy``): ``mode`` client (DP-FedAvg) or sample (DP-SGD),
    the clip norm C, the noise multiplier z, δ of the reported ε and adaptive clipping's target
    quantile γ (0: fixed clip), its learning rate η_C and count noise σ_b (0: m/20)."""

    mode: str
    clip: float
    noise: float
    delta: float
    adaptive_quantile: float = 0.0
    clip_lr: float = 0.2
    count_noise: float = 0.0


@dataclass(frozen=True)
class AttackSpec:
    """Malicious clients (``engine.attacks``): the attack, the fraction of the training clients
    that are attackers, λ / σ of the scaled and Gaussian updates, and the backdoor's target
    label and share of each attacker's train samples that carry the trigger."""

    kind: str
    fraction: float
    scale: float = 10.0
    backdoor_target: int = 0
    backdoor_frac: float = 0.5


@dataclass(frozen=True)
class RobustSpec:
    """``--robust-agg`` (``engine.robust``) and its parameters: β per side (trimmed mean), f and
    the number selected (Krum / Multi-Krum), M (norm bounding)."""

    rule: str
    trim_frac: float = 0.1
    krum_f: int = 1
    krum_select: int = 0  # 0: m − f (the reports of the round less the Byzantine clients assumed)
    norm_bound: float = 1.0


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


@dataclass(frozen=True)
class LocalSpec:
    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    momentum: float
    weight_decay: float
    max_grad_norm: float
    # --precision: the forward passes' and losses' arithmetic (util.precision); in the run
    # identity through ``config.identity.run_identity`` (it shapes evaluation and pretraining too)
    precision: str = "fp32"

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
class ExecutorSpec:
    """What an executor may read when it is built (``engine.executor.make_executor``)."""

    kind: str
    device: str
    sampled_per_round: int
    ray_address: str | None
    ray_workers: int | None
