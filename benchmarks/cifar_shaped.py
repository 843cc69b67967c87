"""Random CIFAR-100-shaped images, to time the headline job where CIFAR-100 cannot be read
(no network, no local copy; throughput does not depend on pixel values; accuracies are chance):

    pflbench run --plugin benchmarks/cifar_shaped.py --algo fedsdg --dataset cifar100_shaped --alpha 0.1

and its 5-minute try on one CPU thread (docs/guides/running.md; evaluation, not training, is what
costs there, hence the small test split and no validation split):

    pflbench run --plugin benchmarks/cifar_shaped.py --algo fedsdg --dataset cifar100_shaped --alpha 0.1 \\
        --pretrain-epochs 2 --public-frac 0.05 --val-frac 0 --test-frac 0.1 --frac 0.15 --rounds 2 --eval-every 2

``--dataset-option samples=N`` sets the size (default 60,000, CIFAR-100's train + test).
"""

from __future__ import annotations

import torch

from pflbench.data.dataset import TensorDataset
from pflbench.registry import register_dataset

NUM_CLASSES = 100


@register_dataset("cifar100_shaped")
def cifar100_shaped(samples: int = 60_000) -> TensorDataset:
    """``samples`` random uint8 3×32×32 images with random labels among 100 classes."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (samples, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (samples,), generator=generator)
    return TensorDataset(inputs, labels, NUM_CLASSES, "random CIFAR-100-shaped images")


cifar100_shaped.cacheable = False  # type: ignore[attr-defined]  # made in a second, sized per run
