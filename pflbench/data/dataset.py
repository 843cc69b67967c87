"""Datasets as contiguous tensors, cached on disk; clients are index tensors into them.

A dataset plugin is a function registered with ``@register_dataset(name)`` that returns a
``TensorDataset`` (the dataset's own train and test splits already pooled, SPEC §2).
``load_dataset`` caches its tensors after the first conversion, so later runs read one file.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflbench.errors import ConfigError
from pflbench.registry import DATASETS
from pflbench.util import cache, progress
from pflbench.util.hashing import settings_hash

CACHE_FORMAT_VERSION = 2  # 2: tensors + JSON metadata, content-hashed


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
        if self.is_image:  # one float copy [channels, pixels] filled channel by channel (no temporaries)
            channels = self.inputs.shape[1]
            flat = torch.empty(channels, self.inputs[:, 0].numel(), device=self.inputs.device)
            for channel in range(channels):
                flat[channel].copy_(self.inputs[:, channel].reshape(-1))
            flat.div_(255)
            return flat.mean(dim=1), flat.std(dim=1).clamp_min(1e-6)
        if not self.inputs.is_floating_point():  # integer token ids: reach the model unchanged
            return torch.zeros(self.input_shape), torch.ones(self.input_shape)
        return self.inputs.mean(dim=0), self.inputs.std(dim=0).clamp_min(1e-6)


def cache_dir() -> Path:
    return Path(os.environ.get("PFLBENCH_CACHE", Path.home() / ".cache" / "pflbench"))


def dataset_cache_key(name: str, options: dict[str, Any], loader: Any) -> dict[str, Any]:
    """What the cached tensors depend on: name, options, format version, and, for a loader with
    a ``cache_key(**options)`` (local files), its fingerprint of the files it reads (None: it
    reads none, e.g. a hub dataset read from the Hugging Face cache)."""
    key: dict[str, Any] = {"name": name, "options": options, "v": CACHE_FORMAT_VERSION}
    fingerprint = getattr(loader, "cache_key", None)
    files = fingerprint(**options) if fingerprint is not None else None
    if files is not None:
        key["files"] = files
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def _to_entry(dataset: TensorDataset, key: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """Tensors + JSON metadata for the cache, or None if the dataset cannot round-trip exactly."""
    tensors = {"inputs": dataset.inputs, "labels": dataset.labels}
    meta: dict[str, Any] = {
        "key": key,
        "num_classes": dataset.num_classes,
        "source": dataset.source,
        "info": dataset.info,
        "groups": None,
    }
    if dataset.groups is not None:
        groups = np.asarray(dataset.groups)
        try:
            values, codes = np.unique(groups, return_inverse=True)
        except TypeError:  # unorderable mixed values: not cached, loaded afresh each time
            return None
        tensors["group_codes"] = torch.from_numpy(codes.reshape(-1).astype(np.int64))
        meta["groups"] = {"values": values.tolist(), "dtype": groups.dtype.str}
    if not cache.json_safe(meta):
        return None
    return tensors, meta


def _from_entry(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> TensorDataset:
    groups = None
    if meta["groups"] is not None:
        values = np.asarray(meta["groups"]["values"]).astype(meta["groups"]["dtype"])
        groups = values[tensors["group_codes"].numpy()]
    return TensorDataset(
        inputs=tensors["inputs"],
        labels=tensors["labels"],
        num_classes=meta["num_classes"],
        source=meta["source"],
        groups=groups,
        info=meta["info"],
    )


def load_dataset(name: str, options: dict[str, Any] | None = None, use_cache: bool = True) -> TensorDataset:
    """Load dataset ``name`` with ``options`` (passed to its loader), through the disk cache.

    The cache holds tensors and JSON metadata only (``pflbench.util.cache``): verified by content
    hash on load; a bad entry is reported, deleted and rebuilt.
    """
    loader = DATASETS.get(name)
    options = dict(options or {})
    accepted = inspect.signature(loader).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = ", ".join(accepted) or "none"
        raise ConfigError(f"dataset {name!r} has no option {unknown[0]!r}; its options: {valid}")
    use_cache = use_cache and getattr(loader, "cacheable", True)
    if not use_cache:
        return _call_loader(name, loader, options)
    key = dataset_cache_key(name, options, loader)
    digest = settings_hash(key)
    path = cache_dir() / f"{name}-{digest}.pt"
    entry = cache.load_entry(path, expect={"key": key})
    if entry is not None:
        try:
            return _from_entry(*entry)
        except (KeyError, TypeError, ValueError, IndexError):
            cache.warn(f"cache file {path} has an unexpected layout; deleted it and rebuilding")
            cache.discard(path)
    announced = _Announced(progress.current(), f"preparing dataset {name} (once: later runs read the cache {path})")
    with progress.reporting(announced if progress.active() else progress.current()):
        dataset = _call_loader(name, loader, options)
    announced.announce()
    converted = _to_entry(dataset, key)
    if converted is not None:
        try:
            cache.save_entry(path, *converted)
        except OSError as error:  # a full or read-only cache costs speed, not the run
            cache.warn(f"could not write cache file {path}: {error.strerror or error}")
    return dataset


class _Announced:
    """The current progress reporter, with ``line`` said before the first thing a loader reports
    (a stage, e.g. decoding, or a note) or once it returns: a loader that fails before it reads
    anything (a missing folder, an unreachable hub) is not announced as preparing the dataset."""

    def __init__(self, reporter: progress.Reporter, line: str) -> None:
        self.reporter, self.line, self.said = reporter, line, False

    def announce(self) -> None:
        if not self.said:
            self.said = True
            self.reporter.note(self.line)

    def note(self, line: str) -> None:
        self.announce()
        self.reporter.note(line)

    def start(self, name: str, total: int, unit: str) -> Any:
        self.announce()
        return self.reporter.start(name, total, unit)

    def update(self, handle: Any, done: int, status: str) -> None:
        self.reporter.update(handle, done, status)

    def finish(self, handle: Any, status: str) -> None:
        self.reporter.finish(handle, status)


def _call_loader(name: str, loader: Any, options: dict[str, Any]) -> TensorDataset:
    """The loader's dataset; its failure on bad option values is one usage error naming them."""
    try:
        return loader(**options)
    except ConfigError as error:
        if "--dataset-option" in str(error) or not set(options) - {"data_dir"}:  # --data-dir: no option given
            raise
        raise ConfigError(f"--dataset-option for dataset {name!r}: {error}") from error
    except (TypeError, ValueError, AssertionError, ZeroDivisionError, OverflowError, IndexError) as error:
        given = " ".join(f"{k}={v}" for k, v in options.items()) or "none"
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise ConfigError(f"--dataset-option for dataset {name!r} (given: {given}) is not valid: {reason}") from error


# the splits a model is evaluated on (``FederatedData.eval_indices``); "ood": the held-out domain
# (--holdout-domain), the same samples for every client; "backdoor": each client's test samples
# with the trigger stamped (--attack backdoor, engine.attacks: the attack success rate)
EVAL_SPLITS = ("test", "val", "ood", "backdoor")


def minibatches(shuffled: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``shuffled`` indices cut into batches of ``batch_size``, none of a single sample when
    ``batch_size`` > 1 (BatchNorm cannot take batch statistics of one sample): a trailing single
    sample joins the previous batch, and a lone sample is a batch of two copies of itself (the
    same mean loss and gradient for a model without batch statistics)."""
    if batch_size > 1 and len(shuffled) == 1:
        shuffled = shuffled.repeat(2)
    starts = list(range(0, len(shuffled), batch_size))
    if batch_size > 1 and len(starts) > 1 and len(shuffled) - starts[-1] == 1:
        starts.pop()
    return [shuffled[start:end] for start, end in zip(starts, starts[1:] + [len(shuffled)])]


class FederatedData:
    """The pooled tensors on the device plus each client's train/validation/test index tensors."""

    def __init__(
        self,
        dataset: TensorDataset,
        train_splits: list[np.ndarray],
        test_splits: list[np.ndarray],
        device: torch.device,
        val_splits: list[np.ndarray] | None = None,
        ood: np.ndarray | None = None,
        backdoor: list[np.ndarray] | None = None,
    ) -> None:
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
        val_splits = val_splits if val_splits else [np.zeros(0, dtype=np.int64)] * len(train_splits)
        self.val_indices = [torch.as_tensor(s, dtype=torch.long, device=device) for s in val_splits]
        self.num_val = [len(s) for s in val_splits]
        # the held-out domain's samples (--holdout-domain): one tensor, listed once per client
        held_out = torch.as_tensor(ood if ood is not None else np.zeros(0, dtype=np.int64), dtype=torch.long)
        self.ood_indices = [held_out.to(device)] * len(train_splits)
        self.num_ood = [len(held_out)] * len(train_splits)
        backdoor = backdoor if backdoor else [np.zeros(0, dtype=np.int64)] * len(train_splits)
        self.backdoor_indices = [torch.as_tensor(s, dtype=torch.long, device=device) for s in backdoor]
        self.num_backdoor = [len(s) for s in backdoor]

    def eval_indices(self, split: str) -> list[torch.Tensor]:
        """Each client's indices of evaluation split ``split``: ``test``, ``val``, ``ood`` or ``backdoor``."""
        if split not in EVAL_SPLITS:
            raise ValueError(f"unknown evaluation split {split!r}; valid: {', '.join(EVAL_SPLITS)}")
        return {
            "test": self.test_indices,
            "val": self.val_indices,
            "ood": self.ood_indices,
            "backdoor": self.backdoor_indices,
        }[split]

    def eval_counts(self, split: str) -> list[int]:
        """Each client's number of samples in evaluation split ``split``."""
        self.eval_indices(split)  # a bad name fails here
        return {"test": self.num_test, "val": self.num_val, "ood": self.num_ood, "backdoor": self.num_backdoor}[split]

    @property
    def num_clients(self) -> int:
        return len(self.train_indices)

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A normalised float batch and its labels, gathered by index on the device."""
        inputs = self.inputs[indices]
        if self.is_image:
            inputs = inputs.float().div_(255)
        return (inputs - self.mean) / self.std, self.labels[indices]

    def train_batches(
        self, client_id: int, batch_size: int, generator: torch.Generator
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of shuffled minibatches of the client's train split (last one may be short):
        ``gather`` of each of ``train_batch_indices``."""
        for batch in self.train_batch_indices(client_id, batch_size, generator):
            yield self.gather(batch)

    def train_batch_indices(self, client_id: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
        """One epoch's minibatches as index tensors (one ``randperm`` of ``generator``).

        No batch holds a single sample when ``batch_size`` > 1, so BatchNorm layers (which
        cannot take batch statistics of one sample) never crash on a client's leftovers:
        a trailing single sample is merged into the previous batch (which then holds
        ``batch_size`` + 1), and a client with one train sample gets it as a batch of two
        copies (same mean loss and gradient for a model without batch statistics).
        """
        indices = self.train_indices[client_id]
        order = torch.randperm(len(indices), generator=generator).to(self.device)
        return minibatches(indices[order], batch_size)
