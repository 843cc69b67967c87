"""The model: its name, its options, and how many of its output layers form the private head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, option
from pflbench.config.settings.experiment import key_values
from pflbench.errors import ConfigError


@dataclass(frozen=True)
class ModelSettings(SettingGroup):
    title = "Model"
    section = "Model and initialization"

    model: str | None = option(
        None,
        "Model: a zoo name (`pflbench list models`) or a timm model "
        "name [default: cnn; LoRA runs a 6-block ViT, see config.lora.RUN_DEFAULTS].",
    )
    head_layers: int = option(1, "Layers (from the output) that form the private head.")
    model_option: tuple[str, ...] = option(
        (), "Model option KEY=VALUE, repeatable (ViTs: depth=6, embed_dim=192, num_heads=3, patch_size=2)."
    )

    def model_options(self) -> dict[str, Any]:
        return key_values(self.model_option, "--model-option")

    def validate(self, config: Any) -> None:
        if self.head_layers < 1:
            raise ConfigError(f"--head-layers must be ≥ 1, got {self.head_layers}")

    def identity(self, run: RunReads) -> dict[str, Any]:
        read: dict[str, Any] = {"model": self.model, "model_options": self.model_options()}
        if run.uses_head_layers:
            read["head_layers"] = self.head_layers
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        if run.uses_head_layers:
            return {}
        algo = run.config.algo
        return {"head_layers": f"--algo {algo} has no private head (fedper, fedrep or LoRA runs use it)"}
