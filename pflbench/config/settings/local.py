"""Local training: how each client trains in a round (the ``LocalSpec`` of its program). The
settings left unset (``lr``, ``optimizer``, ``max_grad_norm``) take the algorithm's or the model
family's defaults (``config.resolve``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, option, refuse_first
from pflbench.config.settings.execution import ExecutionSettings


@dataclass(frozen=True)
class LocalSettings(SettingGroup):
    title = "Local training"

    local_epochs: int = option(1, "Local epochs per round.")
    batch_size: int = option(32, "Local minibatch size.")
    lr: float | None = option(
        None, "Local learning rate [default: 0.1 for the zoo's mlp/cnn/lenet/cnn_bn, else 0.01; LoRA runs 1e-3]."
    )
    optimizer: str | None = option(None, "Local optimizer [default: sgd; LoRA runs adam].", choices=("sgd", "adam"))
    momentum: float = option(0.0, "SGD momentum (optimizer state is fresh each round).")
    weight_decay: float = option(0.0, "Weight decay of the local optimizer.")
    max_grad_norm: float | None = option(
        None, "Clip each local step's gradient to this norm; 0 = no clipping [default: 0; fedsdg 1.0]."
    )

    def spec(self, precision: str) -> LocalSpec:
        """What a client program reads (a resolved config: lr, optimizer, max_grad_norm set)."""
        return LocalSpec(
            epochs=self.local_epochs,
            batch_size=self.batch_size,
            lr=resolved(self.lr, "lr"),
            optimizer=resolved(self.optimizer, "optimizer"),
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            max_grad_norm=resolved(self.max_grad_norm, "max_grad_norm"),
            precision=precision,
        )

    def validate(self, config: Any) -> None:
        lr, max_grad_norm = float(self.lr or 0), float(self.max_grad_norm or 0)
        refuse_first(
            [
                (self.local_epochs >= 0, f"--local-epochs must be ≥ 0, got {self.local_epochs}"),
                (self.batch_size >= 1, f"--batch-size must be ≥ 1, got {self.batch_size}"),
                (math.isfinite(lr) and lr > 0, f"--lr must be a finite number > 0, got {self.lr}"),
                (
                    math.isfinite(max_grad_norm) and max_grad_norm >= 0,
                    f"--max-grad-norm must be ≥ 0 (0 = no clipping), got {self.max_grad_norm}",
                ),
                (self.momentum >= 0 and self.weight_decay >= 0, "--momentum and --weight-decay must be ≥ 0"),
            ]
        )

    def identity(self, run: RunReads) -> dict[str, Any]:
        read: dict[str, Any] = {
            "local_epochs": self.local_epochs,
            "batch_size": self.batch_size,
            "lr": resolved(self.lr, "lr"),
            "optimizer": resolved(self.optimizer, "optimizer"),
            "weight_decay": self.weight_decay,
            "max_grad_norm": resolved(self.max_grad_norm, "max_grad_norm"),
        }
        if self.optimizer == "sgd":
            read["momentum"] = self.momentum
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        if self.optimizer is not None and self.optimizer != "sgd":
            return {"momentum": f"--optimizer {self.optimizer} has no momentum (use --optimizer sgd)"}
        return {}


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
    # identity through ``ExecutionSettings`` (it shapes evaluation and pretraining too)
    precision: str = ExecutionSettings.default("precision")


def resolved(value: Any, name: str) -> Any:
    """``value`` of a setting ``config.resolve`` fills; RuntimeError while it is unset."""
    if value is None:
        raise RuntimeError(f"{name} is unset: resolve the config first (config.resolve)")
    return value
