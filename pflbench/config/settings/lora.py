"""LoRA: a frozen backbone with low-rank adapters on some linear layers (any algorithm with
``--lora-rank``; LoRA algorithms choose their rank themselves, ``Algorithm.lora_rank``). LoRA's
run defaults (model, public fraction, optimizer) are ``config.lora.RUN_DEFAULTS``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, option, refuse_first


@dataclass(frozen=True)
class LoRASettings(SettingGroup):
    title = "LoRA"

    lora_rank: int | None = option(
        None, "LoRA rank r: freeze the backbone and train LoRA on --lora-targets plus the head (any algorithm)."
    )
    lora_alpha: float = option(16.0, "LoRA α; the low-rank update is scaled by α/r.")
    lora_targets: str = option(
        "attn.proj,mlp.fc2", "Comma-separated name suffixes of the linear layers LoRA adapts (e.g. qkv,proj,fc1,fc2)."
    )

    def validate(self, config: Any) -> None:
        refuse_first(
            [
                (self.lora_rank is None or self.lora_rank >= 1, f"--lora-rank must be ≥ 1, got {self.lora_rank}"),
                (self.lora_alpha > 0, f"--lora-alpha must be > 0, got {self.lora_alpha}"),
            ]
        )

    def identity(self, run: RunReads) -> dict[str, Any]:
        """The rank the algorithm builds (``run.lora_rank``, not necessarily --lora-rank), α and
        the targets; none for a run without LoRA."""
        if not run.uses_lora:
            return {}
        return {"lora_rank": run.lora_rank, "lora_alpha": self.lora_alpha, "lora_targets": self.lora_targets}

    def inert(self, run: RunReads) -> dict[str, str]:
        if run.uses_lora:
            return {}
        why = f"--algo {run.config.algo} without --lora-rank trains no LoRA layers"
        return {"lora_alpha": why, "lora_targets": why}
