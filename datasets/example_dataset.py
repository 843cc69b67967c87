"""Example plugin: a small generated dataset (Gaussian blobs), offline and seeded.

What it shows: a dataset is one function registered with ``@register_dataset(name)`` that
returns a ``TensorDataset`` — all samples pooled (the run partitions them over clients and
splits each client into train/test), inputs as float32 ``[N, D]`` features (or uint8
``[N, C, H, W]`` images), labels as int64 ``[N]``. Its keyword arguments become
``--dataset-option KEY=VALUE`` options (values arrive parsed as int, float or str: convert them)
and are part of the run's identity; the values of the data must depend on them only.

The data: C class centres drawn once from N(0, separation²·I_D); each sample is its class's
centre plus N(0, I_D) noise. The classes are balanced; ``seed`` fixes the data, not the
experiment (``--seed`` still drives partition, initialisation and training).

Run it (feature data needs a model that takes vectors: ``--model mlp``):

    pflbench run --plugin datasets/example_dataset.py --dataset example_blobs \\
        --dataset-option num_classes=5 --dataset-option dim=20 \\
        --model mlp --algo fedavg --num-clients 10 --rounds 20
    pflbench list datasets --plugin datasets/example_dataset.py
"""

from __future__ import annotations

import torch

from pflbench import ConfigError, TensorDataset, register_dataset


@register_dataset("example_blobs")
def example_blobs(
    num_samples: int = 1200, num_classes: int = 4, dim: int = 16, separation: float = 1.0, seed: int = 0
) -> TensorDataset:
    """Gaussian blobs: C balanced classes in D dimensions, unit noise around random centres."""
    num_samples, num_classes, dim, separation = int(num_samples), int(num_classes), int(dim), float(separation)
    if num_classes < 2 or num_samples < num_classes or dim < 1 or separation <= 0:
        raise ConfigError(  # one usage error (exit code 2) instead of a traceback
            "example_blobs needs num_classes ≥ 2, num_samples ≥ num_classes, dim ≥ 1 and separation > 0, got "
            f"num_samples={num_samples}, num_classes={num_classes}, dim={dim}, separation={separation}"
        )
    generator = torch.Generator().manual_seed(int(seed))  # its own stream: the data depends on `seed` only
    centres = separation * torch.randn(num_classes, dim, generator=generator)
    labels = torch.arange(num_samples) % num_classes  # balanced classes ...
    labels = labels[torch.randperm(num_samples, generator=generator)]  # ... in random order
    inputs = centres[labels] + torch.randn(num_samples, dim, generator=generator)
    return TensorDataset(
        inputs=inputs.float().contiguous(),
        labels=labels.long(),
        num_classes=num_classes,
        source=f"generated example_blobs (num_samples={num_samples}, num_classes={num_classes}, "
        f"dim={dim}, separation={separation}, seed={seed})",  # recorded in every run's config.json
    )


# pflbench caches a dataset's tensors on disk, keyed by its name and options (not by this file's
# code). Generating these is quicker than reading a cache, and an edited generator must take effect
# at once: no cache. (A dataset that is slow to build keeps the default and changes its name or
# options when its code changes.)
example_blobs.cacheable = False
