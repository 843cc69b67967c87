"""The model zoo (``mlp``, ``cnn``, ``lenet``), timm models by name, and the body/head split.

Every model declares its layer order from input to output (``layer_names``); the head is the
last ``head_layers`` of them (the final classifier by default), so FedPer/FedRep never guess
from parameter names. timm models get the same declaration from their module tree.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .errors import ConfigError
from .registry import MODELS, register_model


class LayeredModel(nn.Module):
    """Base for zoo models: ``layer_names`` lists the parametrised layers, input → output."""

    layer_names: tuple[str, ...] = ()


def _conv_padding(height: int) -> int:
    # Valid 5×5 convolutions as in the papers for CIFAR-sized inputs; "same" padding keeps
    # small images (8×8 digits) from shrinking to nothing.
    return 0 if height >= 20 else 2


def _pooled_size(size: int, padding: int) -> int:
    for _ in range(2):
        size = (size + 2 * padding - 4) // 2
    return size


@register_model("mlp")
class MLP(LayeredModel):
    """FedAvg's 2NN: flatten → 200 → 200 → classes, ReLU."""

    layer_names = ("fc1", "fc2", "fc3")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


class _TwoConvNet(LayeredModel):
    """conv5 → pool → conv5 → pool → fc → fc → fc (classifier), ReLU."""

    layer_names = ("conv1", "conv2", "fc1", "fc2", "fc3")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 widths: tuple[int, int, int, int]) -> None:
        super().__init__()
        channels, height, width = input_shape
        padding = _conv_padding(min(height, width))
        c1, c2, f1, f2 = widths
        self.conv1 = nn.Conv2d(channels, c1, 5, padding=padding)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=padding)
        self.pool = nn.MaxPool2d(2, 2)
        flat = c2 * _pooled_size(height, padding) * _pooled_size(width, padding)
        if flat <= 0:
            raise ConfigError(f"input {height}×{width} is too small for this CNN (need ≥ 4×4)")
        self.fc1 = nn.Linear(flat, f1)
        self.fc2 = nn.Linear(f1, f2)
        self.fc3 = nn.Linear(f2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x))).flatten(1)
        x = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        return self.fc3(x)


@register_model("cnn")
class CNN(_TwoConvNet):
    """FedRep's CIFAR CNN: conv 64 → conv 128 → fc 256 → fc 128 → classes (5×5 kernels)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__(input_shape, num_classes, (64, 128, 256, 128))


@register_model("lenet")
class LeNet(_TwoConvNet):
    """LeNet-5: conv 6 → conv 16 → fc 120 → fc 84 → classes."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__(input_shape, num_classes, (6, 16, 120, 84))


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                **options: Any) -> nn.Module:
    """A zoo model, or any timm model name, adapted to ``input_shape`` and ``num_classes``."""
    if name in MODELS.items:
        return MODELS.get(name)(input_shape, num_classes, **options)
    import timm

    if not timm.is_model(name):
        raise ConfigError(f"unknown model {name!r}; valid choices: {', '.join(MODELS.names())} "
                          "or a timm model name (see timm.list_models())")
    if len(input_shape) != 3:
        raise ConfigError(f"timm model {name!r} needs image inputs, the data has shape {input_shape}")
    channels, height, _ = input_shape
    kwargs = dict(pretrained=False, num_classes=num_classes, in_chans=channels, **options)
    try:  # ViTs and friends take the image size; CNNs adapt by global pooling
        return timm.create_model(name, img_size=height, **kwargs)
    except TypeError:
        return timm.create_model(name, **kwargs)


def layer_order(model: nn.Module) -> list[str]:
    """Names of the parametrised layers from input to output.

    Zoo models declare ``layer_names``; for other models the top-level children that hold
    parameters are used, with Sequential/ModuleList containers (ViT blocks, ResNet stages)
    expanded one level.
    """
    declared = getattr(model, "layer_names", None)
    if declared:
        return list(declared)
    names = []
    for name, child in model.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (nn.Sequential, nn.ModuleList)):
            names += [f"{name}.{sub}" for sub, grandchild in child.named_children()
                      if any(True for _ in grandchild.parameters())]
        else:
            names.append(name)
    return names


def head_module_names(model: nn.Module, head_layers: int = 1) -> list[str]:
    """The modules forming the head: the last ``head_layers`` layers of ``layer_order``."""
    order = layer_order(model)
    if not 1 <= head_layers < len(order):
        raise ConfigError(f"--head-layers {head_layers} must be in [1, {len(order) - 1}] for "
                          f"this model (layers: {', '.join(order)})")
    return order[-head_layers:]


def head_parameter_names(model: nn.Module, head_layers: int = 1) -> set[str]:
    """Parameter (and buffer) names under the head modules."""
    prefixes = tuple(f"{name}." for name in head_module_names(model, head_layers))
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    return {name for name in names if name.startswith(prefixes)}
