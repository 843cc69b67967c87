"""Datasets as contiguous tensors, cached on disk; clients are index tensors into them.

A dataset plugin is a function registered with ``@register_dataset(name)`` that returns a
``TensorDataset`` (the dataset's own train and test splits already pooled, SPEC §2).
``load_dataset`` caches its tensors after the first conversion, so later runs read one file.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from .errors import ConfigError
from .registry import DATASETS

CACHE_FORMAT_VERSION = 1


@dataclass
class TensorDataset:
    """The pooled dataset: ``inputs`` uint8 [N, C, H, W] images, float32 [N, D] features or
    integer [N, L] token ids (text, e.g. Shakespeare; not normalised)."""

    inputs: torch.Tensor
    labels: torch.Tensor  # int64 [N]
    num_classes: int
    source: str  # where the data came from, recorded with every run
    groups: np.ndarray | None = None  # natural client id per sample, if the data has one
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs.shape[1:])

    @property
    def is_image(self) -> bool:
        return self.inputs.dtype == torch.uint8 and self.inputs.dim() == 4

    def channel_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean/std of x/255 for images, per-feature for float features."""
        if self.is_image:
            flat = self.inputs.transpose(0, 1).reshape(self.inputs.shape[1], -1).float() / 255
            return flat.mean(dim=1), flat.std(dim=1).clamp_min(1e-6)
        if not self.inputs.is_floating_point():  # integer token ids: reach the model unchanged
            return torch.zeros(self.input_shape), torch.ones(self.input_shape)
        return self.inputs.mean(dim=0), self.inputs.std(dim=0).clamp_min(1e-6)


def cache_dir() -> Path:
    return Path(os.environ.get("PFLBENCH_CACHE", Path.home() / ".cache" / "pflbench"))


def load_dataset(name: str, options: dict[str, Any] | None = None,
                 use_cache: bool = True) -> TensorDataset:
    """Load dataset ``name`` with ``options`` (passed to its loader), through the disk cache."""
    loader = DATASETS.get(name)
    options = dict(options or {})
    accepted = inspect.signature(loader).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = ", ".join(accepted) or "none"
        raise ConfigError(f"dataset {name!r} has no option {unknown[0]!r}; its options: {valid}")
    key = json.dumps({"name": name, "options": options, "v": CACHE_FORMAT_VERSION},
                     sort_keys=True, default=str)
    path = cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.pt"
    if use_cache and path.is_file():
        return TensorDataset(**torch.load(path, weights_only=False))
    dataset = loader(**options)
    if use_cache and getattr(loader, "cacheable", True):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        torch.save(dataset.__dict__, temporary)
        temporary.replace(path)
    return dataset


class FederatedData:
    """The pooled tensors on the device plus each client's train/test index tensors."""

    def __init__(self, dataset: TensorDataset, train_splits: list[np.ndarray],
                 test_splits: list[np.ndarray], device: torch.device) -> None:
        self.device = device
        self.num_classes = dataset.num_classes
        self.input_shape = dataset.input_shape
        self.inputs = dataset.inputs.to(device)
        self.labels = dataset.labels.to(device)
        self.is_image = dataset.is_image
        mean, std = dataset.channel_stats()
        shape = (1, -1, 1, 1) if self.is_image else (1, -1)
        self.mean, self.std = mean.view(shape).to(device), std.view(shape).to(device)
        self.train_indices = [torch.as_tensor(s, dtype=torch.long, device=device) for s in train_splits]
        self.test_indices = [torch.as_tensor(s, dtype=torch.long, device=device) for s in test_splits]
        self.num_train = [len(s) for s in train_splits]
        self.num_test = [len(s) for s in test_splits]

    @property
    def num_clients(self) -> int:
        return len(self.train_indices)

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A normalised float batch and its labels, gathered by index on the device."""
        inputs = self.inputs[indices]
        if self.is_image:
            inputs = inputs.float().div_(255)
        return (inputs - self.mean) / self.std, self.labels[indices]

    def train_batches(self, client_id: int, batch_size: int,
                      generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of shuffled minibatches of the client's train split (last one may be short).

        No batch holds a single sample when ``batch_size`` > 1, so BatchNorm layers (which
        cannot take batch statistics of one sample) never crash on a client's leftovers:
        a trailing single sample is merged into the previous batch (which then holds
        ``batch_size`` + 1), and a client with one train sample gets it as a batch of two
        copies (same mean loss and gradient for a model without batch statistics).
        """
        indices = self.train_indices[client_id]
        order = torch.randperm(len(indices), generator=generator).to(self.device)
        shuffled = indices[order]
        if batch_size > 1 and len(shuffled) == 1:
            shuffled = shuffled.repeat(2)
        starts = list(range(0, len(shuffled), batch_size))
        if batch_size > 1 and len(starts) > 1 and len(shuffled) - starts[-1] == 1:
            starts.pop()
        for start, end in zip(starts, starts[1:] + [len(shuffled)]):
            yield self.gather(shuffled[start:end])
