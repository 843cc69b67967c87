"""LoRA's run settings: the one owner of LoRA's defaults and of the question "is this a LoRA run?".

Torch-free, so ``--help``, ``pflbench pretrain``'s options and sweep expansion can read them; the
adapter layer itself (``LoRALinear``, ``apply_lora``, peft names) is ``models.lora``.
"""

from __future__ import annotations

from typing import Any

# Defaults of a LoRA run for the settings left unset: LoRA needs a transformer and a pretrained
# backbone, which offline means one pretrained on a public fraction of the data (SPEC §4,
# "Backbone for LoRA methods"); Adam as in the LoRA papers.
RUN_DEFAULTS: dict[str, Any] = {
    "model": "vit_tiny_patch16_224",
    "model_option": ("depth=6", "embed_dim=64", "num_heads=4"),
    "public_frac": 0.2,
    "optimizer": "adam",
    "lr": 1e-3,
}
DEFAULT_RANK = 8  # LoRA algorithms' rank (FedSDG, FlexLoRA homo) when --lora-rank is unset


def lora_rank(algorithm: Any, config: Any, hyperparameters: Any) -> int | None:
    """The rank this run's LoRA layers are built with, None for a run without LoRA (the
    algorithm decides: ``Algorithm.lora_rank``; FedSDG always adapts, FlexLoRA per client)."""
    rank: int | None = algorithm.lora_rank(config, hyperparameters)
    return rank


def is_lora_run(algorithm: Any, config: Any, hyperparameters: Any) -> bool:
    """Whether this run trains LoRA adapters on a frozen backbone."""
    return lora_rank(algorithm, config, hyperparameters) is not None
