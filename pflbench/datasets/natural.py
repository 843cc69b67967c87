"""Datasets with natural clients: FEMNIST and Shakespeare (hub), and PFLlib dataset folders.

Each sample carries its client id in ``TensorDataset.groups``; ``--partition natural`` makes
the clients from it (K writers/roles chosen at random among those with ≥ ``--min-size``
samples, see ``pflbench.data.partition.natural``).

* ``femnist`` — ``flwrlabs/femnist``: 28×28 grayscale ``image``, ``character`` (62 classes:
  digits, upper- and lower-case letters), ``writer_id`` (the client), ``hsf_id`` (unused).
* ``shakespeare`` — ``flwrlabs/shakespeare``: ``x`` (80 characters of a play), ``y`` (the next
  character), ``character_id`` (the speaking role: the client). Next-character prediction:
  inputs are the characters of ``x`` as token ids [N, 80], the label is ``y``'s id; the
  vocabulary is every character that occurs in ``x`` or ``y`` (sorted), recorded in
  ``info["vocab"]``. Use it with ``--model char_lstm``.
* ``pfllib`` — a folder written by PFLlib's ``generate_*.py`` (``config.json``,
  ``train/<i>.npz``, ``test/<i>.npz``). ``--partition natural`` keeps PFLlib's exact clients
  and per-client train/test split; any other partitioner re-partitions the pooled samples.

The hub datasets load like the other hub datasets (``pflbench.datasets.hub``): from the
Hugging Face cache or a local copy (``--data-dir``), with a one-line error offline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pflbench.data.dataset import TensorDataset
from pflbench.data.pfllib import read_pfllib_folder
from pflbench.datasets.hub import HubSource, _pool, hub_splits, require_columns
from pflbench.errors import ConfigError
from pflbench.registry import register_dataset

FEMNIST = HubSource("femnist", "flwrlabs/femnist", "image", "character")
FEMNIST_CLASSES = 62
SHAKESPEARE = HubSource("shakespeare", "flwrlabs/shakespeare", "x", "y")
SHAKESPEARE_CLIENT = "character_id"
FEMNIST_CLIENT = "writer_id"


def _group_column(splits: dict[str, Any], column: str) -> np.ndarray:
    values = [split.with_format("arrow")[column].to_pylist() for split in splits.values()]
    return np.asarray([str(v) for part in values for v in part])


@register_dataset("femnist")
def femnist(data_dir: str | None = None) -> TensorDataset:
    """FEMNIST (flwrlabs/femnist): 28×28 handwritten characters, 62 classes, writers as clients."""
    splits, origin = hub_splits(FEMNIST, data_dir)
    first = next(iter(splits.values()))
    require_columns(first.column_names, [FEMNIST.image_column, FEMNIST.label_column, FEMNIST_CLIENT], origin)
    dataset = _pool(splits, FEMNIST.image_column, FEMNIST.label_column, origin)
    if dataset.num_classes < FEMNIST_CLASSES:  # a plain int column: the label set is fixed
        dataset.num_classes = FEMNIST_CLASSES
    dataset.groups = _group_column(splits, FEMNIST_CLIENT)
    dataset.info["group_column"] = FEMNIST_CLIENT
    return dataset


def _char_codes(column: pa.ChunkedArray, length: int | None, name: str) -> np.ndarray:
    """Strings → uint32 code points [N, L]; shorter strings are left-padded with spaces."""
    strings = column.to_pylist()
    if any(s is None for s in strings):
        raise ConfigError(f"shakespeare column {name!r} has missing values")
    longest = max((len(s) for s in strings), default=0) if length is None else length
    if any(len(s) != longest for s in strings):
        if length is not None:
            raise ConfigError(f"shakespeare column {name!r} must hold {length}-character strings")
        strings = [s.rjust(longest) for s in strings]
    encoded = "".join(strings).encode("utf-32-le")
    return np.frombuffer(encoded, dtype=np.uint32).reshape(len(strings), longest)


@register_dataset("shakespeare")
def shakespeare(data_dir: str | None = None) -> TensorDataset:
    """Shakespeare (flwrlabs/shakespeare): next character after 80, speaking roles as clients."""
    splits, origin = hub_splits(SHAKESPEARE, data_dir)
    first = next(iter(splits.values()))
    require_columns(first.column_names, ["x", "y", SHAKESPEARE_CLIENT], origin)
    tables = [split.with_format("arrow") for split in splits.values()]
    x = np.concatenate([_char_codes(t["x"], None, "x") for t in tables]) if tables else None
    y = np.concatenate([_char_codes(t["y"], 1, "y")[:, 0] for t in tables])
    if x is None or len(x) == 0:
        raise ConfigError(f"{origin} holds no samples")
    codes = np.union1d(np.unique(x), np.unique(y))
    lookup = np.zeros(int(codes.max()) + 1, dtype=np.int64)
    lookup[codes] = np.arange(len(codes))
    dtype = torch.uint8 if len(codes) <= 256 else torch.int64
    inputs = torch.from_numpy(lookup[x]).to(dtype).contiguous()
    labels = torch.from_numpy(lookup[y])
    vocab = "".join(chr(c) for c in codes)
    sizes = {name: len(split) for name, split in splits.items()}
    described = ", ".join(f"{name}: {size}" for name, size in sizes.items())
    return TensorDataset(
        inputs=inputs,
        labels=labels,
        num_classes=len(codes),
        source=f"{origin}, splits pooled ({described})",
        groups=_group_column(splits, SHAKESPEARE_CLIENT),
        info={"splits": sizes, "vocab": vocab, "group_column": SHAKESPEARE_CLIENT, "task": "next-character prediction"},
    )


def _pfllib_inputs(x: np.ndarray, where: str) -> tuple[torch.Tensor, str]:
    """PFLlib ``x`` as pflbench inputs, and a note on the conversion."""
    if x.ndim == 3:  # [N, H, W] grayscale
        x = x[:, None]
    if x.ndim == 4:
        if x.dtype == np.uint8:
            return torch.from_numpy(np.ascontiguousarray(x)), "uint8 images"
        # PFLlib stores normalised float images; pflbench keeps uint8 images and standardises
        # each channel itself, so a global affine rescale to 0..255 loses only 8-bit rounding.
        low, high = float(x.min()), float(x.max())
        scaled = np.rint((x - low) / max(high - low, 1e-12) * 255).astype(np.uint8)
        return torch.from_numpy(scaled), f"float images rescaled from [{low:.4g}, {high:.4g}] to uint8"
    if x.ndim == 2 and np.issubdtype(x.dtype, np.integer):
        return torch.from_numpy(x.astype(np.int64)), "integer token ids"
    if x.ndim == 2:
        return torch.from_numpy(x.astype(np.float32)), "float features"
    raise ConfigError(
        f"{where}: x has shape {x.shape[1:]} per sample; expected images "
        "[C, H, W] / [H, W], features [D] or token ids [L]"
    )


@register_dataset("pfllib")
def pfllib(data_dir: str | None = None) -> TensorDataset:
    """A PFLlib dataset folder (config.json, train/<i>.npz, test/<i>.npz) with its own clients."""
    if data_dir is None:
        raise ConfigError(
            "dataset 'pfllib' needs --data-dir FOLDER (PFLlib's dataset/<name> "
            "folder holding config.json, train/ and test/)"
        )
    folder = read_pfllib_folder(data_dir)
    inputs, note = _pfllib_inputs(folder["x"], f"PFLlib folder {data_dir!r}")
    return TensorDataset(
        inputs=inputs,
        labels=torch.from_numpy(folder["y"]),
        num_classes=folder["num_classes"],
        source=f"PFLlib folder {data_dir} ({len(folder['train'])} clients, {note})",
        groups=folder["client"],
        info={
            "client_splits": {
                "train": [s.tolist() for s in folder["train"]],
                "test": [s.tolist() for s in folder["test"]],
            },
            "group_column": "PFLlib client",
        },
    )


pfllib.cacheable = False  # reading the .npz files is quick, and a regenerated folder must show
