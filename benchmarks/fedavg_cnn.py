"""PFLlib's ``FedAvgCNN`` as a pflbench model (``--plugin benchmarks/fedavg_cnn.py --model
fedavg_cnn``), for running both programs on the same network (``bench_cross_device.py``):

    conv 5×5 → 32, ReLU, max-pool 2 → conv 5×5 → 64, ReLU, max-pool 2 → fc 512, ReLU → fc classes

no padding, so a 3×32×32 input flattens to 1,600 features (PFLlib's ``dim=1600`` for Cifar10)
and a 1×28×28 one to 1,024 (``dim=1024`` for MNIST). The same parameter shapes as PFLlib's (its
names carry a ``.0`` from ``nn.Sequential``: ``conv1.0.weight`` here is ``conv1.weight``); the
head is ``fc``, PFLlib's ``BaseHeadSplit`` head for FedPer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pflbench.errors import ConfigError
from pflbench.models.zoo import LayeredModel
from pflbench.registry import register_model


@register_model("fedavg_cnn")
class FedAvgCNN(LayeredModel):
    """PFLlib's FedAvgCNN: conv 32 → conv 64 (5×5, no padding, each ReLU + max-pool 2) → fc 512 → classes."""

    layer_names = ("conv1", "conv2", "fc1", "fc")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"fedavg_cnn needs image inputs [C, H, W], the data has shape {input_shape}")
        channels, height, width = input_shape
        side = [((size - 4) // 2 - 4) // 2 for size in (height, width)]
        if min(side) <= 0:
            raise ConfigError(f"fedavg_cnn needs images of at least 16×16, the data has {height}×{width}")
        self.conv1 = nn.Conv2d(channels, 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        self.pool = nn.MaxPool2d(kernel_size=2)
        self.fc1 = nn.Linear(64 * side[0] * side[1], 512)
        self.fc = nn.Linear(512, num_classes)

    def stages(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (
            lambda x: self.pool(torch.relu(self.conv1(x))),
            lambda x: self.pool(torch.relu(self.conv2(x))).flatten(1),
            lambda x: torch.relu(self.fc1(x)),
            self.fc,
        )
