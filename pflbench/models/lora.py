"""LoRA (Hu et al., arXiv:2106.09685): the one low-rank adapter of ``nn.Linear`` every method uses.

An adapted layer computes ``y = base(x) + s·x Aᵀ Bᵀ`` with the base weight W [out, in] and bias
frozen, ``lora_A`` [r, in] (Kaiming-uniform), ``lora_B`` [out, r] (zeros, so the layer equals the
base layer at init) and s = α/r.

Heterogeneous ranks: the factors are allocated at the run's largest rank r_max and only the
first ``active_rank`` components are used (scaling α/active_rank), so one working model serves
clients of different ranks. ``active_rank`` is a (non-trainable, int64) buffer, i.e. model *state*:
FlexLoRA's client program sets it per client in the state it assembles, like any tensor.

Extra branches (FedSDG's gated private pair): a subclass adds its parameters and overrides
``adapter`` and ``delta_weight`` with sums of ``branch``/``branch_delta`` over its branches,
e.g. ``branch(x, A, B) + m·branch(x, A_private, B_private)``; ``apply_lora(..., layer_class=...)``
installs it. There is no second LoRA implementation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pflbench.errors import ConfigError
from pflbench.models.zoo import head_parameter_names


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` (``base``) plus trainable ``lora_A`` [r_max, in], ``lora_B`` [out, r_max]."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        if not 1 <= rank <= min(base.in_features, base.out_features):
            raise ConfigError(
                f"LoRA rank {rank} must be in [1, min(in, out) = "
                f"{min(base.in_features, base.out_features)}] for a {base}"
            )
        self.base = base.requires_grad_(False)
        self.alpha = float(alpha)
        self.max_rank = rank
        self.register_buffer("active_rank", torch.tensor(rank, device=base.weight.device))
        self.variable_rank = False  # True: clients of different ranks share this layer (FlexLoRA)
        self.padded = False  # True (set by --executor vmap): variable ranks computed at full width
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's (and peft's) init

    @property
    def scaling(self) -> float:
        """s = α / active_rank."""
        return self.alpha / self.rank

    @property
    def rank(self) -> int:
        """The rank in use: ``max_rank`` unless per-client ranks are on (``variable_rank``, set by
        FlexLoRA), then the ``active_rank`` buffer — read per forward only in that case (a
        device sync on a GPU), never for fixed-rank LoRA."""
        return int(self.active_rank) if self.variable_rank else self.max_rank

    def set_active_rank(self, rank: int) -> None:
        if not 1 <= rank <= self.max_rank:
            raise ValueError(f"active rank {rank} is not in [1, {self.max_rank}]")
        self.variable_rank = True
        self.active_rank.fill_(rank)

    def branch(self, x: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor) -> torch.Tensor:
        """s·x A[:r]ᵀ B[:, :r]ᵀ: [..., in] → [..., out] (r = active rank)."""
        if self.variable_rank and self.padded:
            return F.linear(F.linear(x, lora_A), lora_B) * self.padded_scaling()
        r = self.rank
        return F.linear(F.linear(x, lora_A[:r]), lora_B[:, :r]) * self.scaling

    def branch_delta(self, lora_A: torch.Tensor, lora_B: torch.Tensor) -> torch.Tensor:
        """s·B[:, :r]·A[:r]: the branch's weight update [out, in]."""
        if self.variable_rank and self.padded:
            return self.padded_scaling() * (lora_B @ lora_A)
        r = self.rank
        return self.scaling * (lora_B[:, :r] @ lora_A[:r])

    def padded_scaling(self) -> torch.Tensor:
        """α / active_rank as a tensor, for the full-width (``padded``) form: the factors beyond a
        client's rank are zero (FlexLoRA's ``assemble`` pads them) and get zero gradients, so
        s·x Aᵀ Bᵀ over all r_max components is the rank-r branch, rounding aside, and needs no
        ``int(active_rank)``: ``vmap`` runs it with a different rank per client."""
        return self.alpha / self.active_rank

    def adapter(self, x: torch.Tensor) -> torch.Tensor:
        """Output of every low-rank branch (here the one shared pair)."""
        return self.branch(x, self.lora_A, self.lora_B)

    def delta_weight(self) -> torch.Tensor:
        """ΔW [out, in] such that forward(x) = x (W + ΔW)ᵀ + b."""
        return self.branch_delta(self.lora_A, self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.adapter(x)

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """A new ``nn.Linear`` with weight W + ΔW and the same bias; this module is left unchanged."""
        base = self.base
        merged = nn.Linear(
            base.in_features,
            base.out_features,
            bias=base.bias is not None,
            device=base.weight.device,
            dtype=base.weight.dtype,
        )
        merged.weight.copy_(base.weight + self.delta_weight())
        if base.bias is not None:
            merged.bias.copy_(base.bias)
        return merged

    def extra_repr(self) -> str:
        return f"rank={self.max_rank}, active_rank={self.rank}, alpha={self.alpha:g}"


def parse_targets(text: str) -> list[str]:
    """``"attn.proj, mlp.fc2"`` → ``["attn.proj", "mlp.fc2"]``."""
    targets = [t.strip() for t in text.split(",") if t.strip()]
    if not targets:
        raise ConfigError("--lora-targets is empty; give module-name suffixes such as attn.proj,mlp.fc2")
    return targets


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    targets: Sequence[str],
    layer_class: type[LoRALinear] = LoRALinear,
    head_layers: int = 1,
) -> list[str]:
    """Wrap every ``nn.Linear`` whose name ends with a target; freeze all but LoRA and the head.

    A target matches a module named ``target`` or ``….target`` (``attn.proj`` matches
    ``blocks.3.attn.proj``). The head (the last ``head_layers`` layers, ``head_parameter_names``)
    stays trainable and is never wrapped. Returns the adapted module names.
    """
    head = head_parameter_names(model, head_layers)
    linears = [
        name for name, module in model.named_modules() if isinstance(module, nn.Linear) and f"{name}.weight" not in head
    ]
    adapted: list[str] = []
    for target in targets:
        matches = [name for name in linears if name == target or name.endswith("." + target)]
        if not matches:
            listed = ", ".join(
                sorted({name.split(".", 2)[-1] if name.startswith("blocks.") else name for name in linears})
            )
            raise ConfigError(
                f"--lora-targets {target!r} matches no linear layer of the model "
                f"(the head is never adapted); its linear layers: {listed}"
            )
        adapted += [name for name in matches if name not in adapted]
    model.requires_grad_(False)
    for name in adapted:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer_class(getattr(parent, child), rank, alpha))
    for name, parameter in model.named_parameters():
        if name in head:
            parameter.requires_grad_(True)
    return sorted(adapted, key=linears.index)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every adapted layer by module name (parameters ``<name>.lora_A`` / ``<name>.lora_B``)."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}
