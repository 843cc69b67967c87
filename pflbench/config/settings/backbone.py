"""The initial weights: timm's hub weights, a local state dict, or a backbone pretrained on the
public fraction of the data (cached), else a random init."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, option, refuse_first


@dataclass(frozen=True)
class BackboneSettings(SettingGroup):
    """Also the view the initial-weights stage reads (``InitSpec``): the same fields."""

    title = "Initial weights"
    section = "Model and initialization"

    pretrained: bool = option(False, "Start from timm's hub weights (network or a filled HF cache).")
    weights: str | None = option(None, "Start from a local state dict file (a head of another shape is skipped).")
    backbone: str = option(
        "auto",
        "Initial weights: auto = --weights/--pretrained if given, else LoRA runs pretrain on the "
        "public fraction and other runs start at random; public = pretrain on the public fraction "
        "(cached); random = random init.",
        choices=("auto", "public", "random"),
    )
    pretrain_epochs: int = option(60, "Epochs of central pretraining on the public fraction.")
    pretrain_lr: float = option(1e-3, "AdamW learning rate of the public pretraining.")

    def pretrains(self, uses_lora: bool) -> bool:
        """Whether the run starts from a backbone pretrained on the public fraction."""
        if self.weights or self.pretrained or self.backbone == "random":
            return False
        return self.backbone == "public" or uses_lora

    def validate(self, config: Any) -> None:
        public_frac = float(config.public_frac or 0)
        refuse_first(
            [
                (
                    self.pretrain_epochs >= 1 and self.pretrain_lr > 0,
                    "--pretrain-epochs must be ≥ 1 and --pretrain-lr > 0",
                ),
                (not (self.pretrained and self.weights), "give either --pretrained or --weights, not both"),
                (
                    self.backbone == "auto" or not (self.pretrained or self.weights),
                    f"--backbone {self.backbone} contradicts --pretrained/--weights; use --backbone auto with them",
                ),
                (
                    self.backbone != "public" or public_frac > 0,
                    "--backbone public pretrains on the public fraction; give --public-frac (e.g. 0.2)",
                ),
            ]
        )

    def identity(self, run: RunReads) -> dict[str, Any]:
        read: dict[str, Any] = {}
        if self.pretrained or self.weights:
            read.update(pretrained=self.pretrained, weights=self.weights)
        if self.pretrains(run.uses_lora):
            read.update(backbone="public", pretrain_epochs=self.pretrain_epochs, pretrain_lr=self.pretrain_lr)
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        if self.pretrains(run.uses_lora):
            return {}
        why = "this run pretrains no backbone (LoRA runs or --backbone public do)"
        return {"pretrain_epochs": why, "pretrain_lr": why}


InitSpec = BackboneSettings  # what the initial-weights stage reads: the group itself
