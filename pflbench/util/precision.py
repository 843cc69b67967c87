"""``--precision``: the arithmetic of the model's forward passes, and the device-dependent
evaluation batch.

``fp32`` (the default) runs everything in float32: no autocast at all, the numbers of every run
made before the option. ``bf16`` runs the forward passes and the losses under
``torch.autocast(device_type, dtype=torch.bfloat16)``: matrix products and convolutions in
bfloat16, reductions and losses in float32 (autocast's own op lists), while parameters, their
gradients and the optimizer state stay float32 (autocast, not a cast of the model). bfloat16
keeps float32's exponent range, so no loss scaling is needed (unlike fp16, which is not offered).
The same code serves the CPU (where it is mainly a way to test the path: CPUs without bf16 units
emulate it, slower than fp32) and CUDA (tensor cores). The wrapped places: a client's forward
(``engine.local.LocalTrainer.forward``) and the batch loop's loss, the vmap executor's loss,
evaluation (``engine.executor``, ``engine.evaluation``) and the public pretraining
(``models.pretrain.train_centrally``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from pflbench.errors import ConfigError

# Evaluation batch on an accelerator: a large batch keeps the device busy (evaluation has no
# backward pass, so memory is one batch's activations). On the CPU each caller keeps its own,
# smaller, historical batch: the counts of correct predictions do not depend on the batch (tested),
# but the CPU numbers of earlier runs stay bit-identical this way.
ACCELERATOR_EVAL_BATCH = 4096
PRECISIONS = ("fp32", "bf16")  # config.run_config.PRECISIONS (the config layer imports no torch)


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The context for a forward pass (and its loss) at ``precision``: nothing for fp32, bf16
    autocast on ``device``'s type for bf16."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        # cache_enabled=False: autocast's cache keeps the bf16 copy of a parameter until the
        # context exits, so weights loaded in place inside one context (each client's head in
        # evaluation.evaluate_heads) were read stale, as the first client's; a weight is read
        # once per forward in these models, so the cache saved nothing
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False)
    raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")


def eval_batch(device: torch.device | str, cpu_batch: int) -> int:
    """The evaluation batch on ``device``: ``cpu_batch`` on the CPU, at least
    ``ACCELERATOR_EVAL_BATCH`` on an accelerator."""
    return cpu_batch if torch.device(device).type == "cpu" else max(cpu_batch, ACCELERATOR_EVAL_BATCH)


def bf16_unsupported_reason(device: torch.device) -> str | None:
    """Why ``device`` cannot run bf16 autocast (None: it can). CUDA needs native bf16 units
    (Ampere or newer; older GPUs would only emulate it, slower than fp32); any device must run
    a small product under bf16 autocast."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        return f"{name} has no native bfloat16 support (needs compute capability ≥ 8.0)"
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            probe = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
        if probe.dtype != torch.bfloat16:
            return f"torch.autocast on {device.type} does not compute in bfloat16"
    except (RuntimeError, TypeError, ValueError) as error:  # autocast not available for this device type
        return " ".join(str(error).split())[:160] or type(error).__name__
    return None


def check_precision(precision: str, device: torch.device) -> None:
    """ConfigError (one line) when ``precision`` is unknown or ``device`` cannot run it."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r} is not one of: {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    reason = bf16_unsupported_reason(device)
    if reason is not None:
        raise ConfigError(
            f"--precision {precision} is not supported on --device {device}: {reason}; use --precision fp32"
        )
