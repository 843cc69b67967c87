"""Memory-lean data preparation computes exactly what the plain expressions
compute: the synthetic images (in place, prototypes added in chunks) and the per-channel
statistics (one float copy filled channel by channel)."""

from __future__ import annotations

import pytest
import torch

from pflbench.data.dataset import TensorDataset
from pflbench.datasets.builtin import synthetic


def plain_synthetic_images(num_samples: int, num_classes: int, shape: tuple[int, int, int], noise: float, seed: int):
    channels, height, width = shape
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, channels, max(2, height // 4), max(2, width // 4), generator=generator)
    prototypes = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    labels = torch.arange(num_samples) % num_classes
    labels = labels[torch.randperm(num_samples, generator=generator)]
    images = prototypes[labels] + noise * torch.randn(num_samples, channels, height, width, generator=generator)
    images = ((images - images.mean()) / images.std() * 50 + 128).clamp(0, 255).round()
    return images.to(torch.uint8), labels


@pytest.mark.parametrize("num_samples,num_classes,shape,noise", [(9000, 10, (3, 8, 8), 0.6), (501, 7, (2, 5, 7), 1.3)])
def test_synthetic_images_equal_the_plain_expression(num_samples, num_classes, shape, noise) -> None:
    data = synthetic(num_samples, num_classes, "x".join(map(str, shape)), noise, seed=3)
    images, labels = plain_synthetic_images(num_samples, num_classes, shape, noise, 3)
    assert torch.equal(data.inputs, images) and torch.equal(data.labels, labels)


def test_channel_stats_equal_the_plain_expression() -> None:
    generator = torch.Generator().manual_seed(0)
    for shape in ((3333, 3, 17, 19), (100, 1, 8, 8), (257, 5, 4, 4)):
        inputs = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
        dataset = TensorDataset(
            inputs=inputs, labels=torch.zeros(shape[0], dtype=torch.long), num_classes=2, source="t"
        )
        flat = inputs.transpose(0, 1).reshape(shape[1], -1).float() / 255
        mean, std = dataset.channel_stats()
        assert torch.equal(mean, flat.mean(dim=1)) and torch.equal(std, flat.std(dim=1).clamp_min(1e-6))
