"""Offline built-in datasets: scikit-learn's bundled ``digits`` and a generated ``synthetic`` set."""

from __future__ import annotations

import numpy as np
import torch

from pflbench.data.dataset import TensorDataset
from pflbench.errors import ConfigError
from pflbench.registry import register_dataset


@register_dataset("digits")
def digits() -> TensorDataset:
    """scikit-learn's 1,797 8×8 handwritten digits (0–16 grey levels scaled to 0–255), 10 classes."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.clip(np.rint(bunch.images * (255 / 16)), 0, 255).astype(np.uint8)
    return TensorDataset(
        inputs=torch.from_numpy(images).unsqueeze(1).contiguous(),
        labels=torch.from_numpy(bunch.target.astype(np.int64)),
        num_classes=10,
        source="sklearn.datasets.load_digits (bundled, offline)",
    )


def _parse_shape(shape: str | tuple) -> tuple[int, int, int]:
    if isinstance(shape, str):
        try:
            dims = tuple(int(d) for d in shape.lower().split("x"))
        except ValueError:
            dims = ()
    else:
        dims = tuple(shape)
    if len(dims) != 3 or min(dims) < 1:
        raise ConfigError(f"synthetic shape {shape!r} is not CxHxW (e.g. 3x32x32)")
    return dims  # type: ignore[return-value]


@register_dataset("synthetic")
def synthetic(
    num_samples: int = 6000, num_classes: int = 10, shape: str = "3x32x32", noise: float = 0.6, seed: int = 0
) -> TensorDataset:
    """Class-structured images: a smooth random prototype per class plus per-sample noise.

    Default is CIFAR-shaped (3×32×32, 10 classes). ``noise`` (relative to the prototypes'
    spread) sets the difficulty; ``seed`` fixes the generated data, not the experiment.
    """
    num_samples, num_classes, noise, seed = int(num_samples), int(num_classes), float(noise), int(seed)
    if num_samples < num_classes or num_classes < 2:
        raise ConfigError(
            f"synthetic needs num_classes ≥ 2 and num_samples ≥ num_classes, "
            f"got num_samples={num_samples}, num_classes={num_classes}"
        )
    channels, height, width = _parse_shape(shape)
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, channels, max(2, height // 4), max(2, width // 4), generator=generator)
    prototypes = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    labels = torch.arange(num_samples) % num_classes
    labels = labels[torch.randperm(num_samples, generator=generator)]
    # in place and the prototypes added in chunks: one float copy of the images at a time (60k
    # CIFAR-shaped images: 0.7 GB instead of 2.9 GB), the same numbers as the plain expression
    # prototypes[labels] + noise·randn, then (x − mean) / std · 50 + 128
    images = torch.randn(num_samples, channels, height, width, generator=generator).mul_(noise)
    for start in range(0, num_samples, 4096):
        images[start : start + 4096].add_(prototypes[labels[start : start + 4096]])
    mean, std = images.mean(), images.std()
    images.sub_(mean).div_(std).mul_(50).add_(128).clamp_(0, 255).round_()
    return TensorDataset(
        inputs=images.to(torch.uint8).contiguous(),
        labels=labels.long(),
        num_classes=num_classes,
        source=f"generated synthetic (num_samples={num_samples}, num_classes={num_classes}, "
        f"shape={channels}x{height}x{width}, noise={noise}, seed={seed})",
    )
