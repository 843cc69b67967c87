"""Partition files in and out: the document format, export (``partition --export``), reading and
validating a ``--partition-file``. PFLlib folders are read in ``data.pfllib``, flwr-datasets partitioners converted in
``data.flwr``; which preset a run uses (and how many clients it has) is ``data.partition``.

An exported partition (``pflbench partition --export FILE``) is one JSON object::

    {"format": "pflbench-partition", "version": 1,
     "dataset": {"name": "mnist", "size": 70000, "num_classes": 10, "source": "..."},
     "num_clients": K,
     "clients": [{"train": [i, ...], "val": [...], "test": [j, ...]}, ...],   # into the pooled dataset
     "public": [...],                                          # held out, given to no client
     "ood": [...],                 # optional: the held-out domain (--holdout-domain), for ood_acc
     "client_domains": ["photo", ...],                         # optional: each client's domain
     "settings": {...}}                                        # how it was made (informative)

Indices address the pooled dataset (all of the dataset's splits concatenated in order, as the
loaders build it). ``"val"`` (a client's validation split) is optional: it is written when the
partition has one (``--val-frac`` > 0), and a file that records validation indices fixes the
validation split as it fixes train and test; a file without them (older exports, hand-made
files) gets its validation split carved out of each client's train split at ``--val-frac``
(``data.partition.make_partition``). ``--partition-file`` also reads a run's ``partition.json``
(``val_indices``) and the ``partition --save`` file. Whatever the source, a partition is
validated before use: every index in range, no sample twice (across clients and
train/val/test/public), no client without train or test samples; each failure is one
``ConfigError`` line.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.config.value_types import json_kind
from pflbench.errors import ConfigError
from pflbench.store.writer import without_local_paths
from pflbench.util.atomic import atomic_write_text

if TYPE_CHECKING:
    from pflbench.config.run_config import RunConfig
    from pflbench.data.dataset import TensorDataset

FORMAT = "pflbench-partition"
VERSION = 1


@dataclass
class PresetPartition:
    """Exact per-client train/test indices (and public indices) into the pooled dataset; ``val``
    the per-client validation indices when the source records them (None: carve them)."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    public: np.ndarray
    source: str
    dataset_name: str | None = None
    dataset_size: int | None = None
    val: list[np.ndarray] | None = None
    ood: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # held-out domain
    client_domains: list[str] | None = None  # each client's domain, when recorded

    @property
    def num_clients(self) -> int:
        return len(self.train)


# ----------------------------------------------------------------------------- export


def partition_document(
    config: RunConfig,
    dataset: TensorDataset,
    train: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    public: np.ndarray,
    val: Sequence[np.ndarray] | None = None,
    ood: np.ndarray | None = None,
    client_domains: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The export JSON object (see the module docstring); each client's ``"val"`` only when
    ``val`` holds a validation sample. Always portable: a file made to be shared names no local
    absolute path (``store.writer.without_local_paths``)."""
    has_val = val is not None and any(len(v) for v in val)
    settings = {
        k: v
        for k, v in dataclasses.asdict(config).items()
        if k
        in (
            "partition",
            "alpha",
            "dirichlet_cut",
            "holdout_domain",
            "shards_per_client",
            "min_size",
            "test_frac",
            "val_frac",
            "public_frac",
            "seed",
            "dataset_option",
            "partition_file",
        )
    }
    if config.sizes != "none":  # quantity skew (data.quantity): recorded only when on
        settings.update(sizes=config.sizes, size_param=config.size_param)
    if config.feature_shift:  # a run setting, not the indices': a run of this file gives it again
        settings.update(feature_shift=config.feature_shift, shift_groups=config.shift_groups)
    return without_local_paths(
        {
            "format": FORMAT,
            "version": VERSION,
            "dataset": {
                "name": config.dataset,
                "size": int(len(dataset.labels)),
                "num_classes": int(dataset.num_classes),
                "source": dataset.source,
            },
            "num_clients": len(train),
            "clients": [
                {
                    "train": np.asarray(tr).tolist(),
                    **({"val": np.asarray(val[k]).tolist()} if has_val else {}),
                    "test": np.asarray(te).tolist(),
                }
                for k, (tr, te) in enumerate(zip(train, test))
            ],
            "public": np.asarray(public).tolist(),
            **({"ood": np.asarray(ood).tolist()} if ood is not None and len(ood) else {}),
            **({"client_domains": list(client_domains)} if client_domains is not None else {}),
            "settings": settings,
        }
    )


def export_partition(path: str | Path, document: dict[str, Any]) -> Path:
    path = Path(path)
    atomic_write_text(path, json.dumps(document))
    return path


# ----------------------------------------------------------------------------- import


def read_partition_file(path: str | Path) -> PresetPartition:
    """A partition from an export file, a run's ``partition.json`` or a ``--save`` file."""
    where = f"--partition-file {str(path)!r}"
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file() and (path / "train").is_dir():
        raise ConfigError(
            f"{where} is a PFLlib dataset folder; load it as a dataset with its own "
            f"clients: --dataset pfllib --data-dir {path} --partition natural"
        )
    if not path.is_file():
        raise ConfigError(f"{where} is not a file")
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{where} is not a JSON file: {error}") from error
    except RecursionError:  # json's parser recurses once per level: 10,000 nested lists
        raise ConfigError(f"{where} is nested too deeply to be a partition") from None
    return partition_from_document(document, where, str(path))


def partition_from_document(document: Any, where: str, source: str) -> PresetPartition:
    """The partition a parsed file holds (export format or ``partition.json``/``--save``), every
    value checked for its JSON type: one ConfigError line naming the key and what is wrong.
    Index ranges and overlaps are checked against the dataset by ``validate_partition``."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where} holds a JSON {json_kind(document).split()[-1]}, not a partition object")
    if document.get("format") == FORMAT:
        version = document.get("version")
        if type(version) is not int or version != VERSION:
            raise ConfigError(f"{where} has format version {version!r}; this pflbench reads version {VERSION}")
        clients = document.get("clients")
        if not isinstance(clients, list) or not all(isinstance(c, dict) for c in clients):
            raise ConfigError(f'{where}: \'clients\' must be a list of {{"train": [...], "test": [...]}}')
        for k, client in enumerate(clients):
            unknown = sorted(set(client) - {"train", "val", "test"})
            missing = [key for key in ("train", "test") if key not in client]
            if unknown or missing:
                wrong = f"has no {missing[0]!r} list" if missing else f"has unknown key {unknown[0]!r}"
                raise ConfigError(f'{where}: client {k} {wrong} (a client is {{"train", "val", "test"}})')
        train = [c["train"] for c in clients]
        test = [c["test"] for c in clients]
        val = [c.get("val", []) for c in clients] if any("val" in c for c in clients) else None
        dataset = document.get("dataset", {})
        if not isinstance(dataset, dict):
            raise ConfigError(
                f'{where}: \'dataset\' must be an object {{"name", "size", ...}}, not {json_kind(dataset)}'
            )
        name = _optional(dataset.get("name"), str, where, "dataset.name", "a string")
        size = _optional(dataset.get("size"), int, where, "dataset.size", "an integer ≥ 0")
        if size is not None and size < 0:
            raise ConfigError(f"{where}: dataset.size must be an integer ≥ 0, got {size}")
        declared = _optional(document.get("num_clients"), int, where, "num_clients", "an integer")
        if declared is not None and declared != len(clients):
            raise ConfigError(f"{where} declares num_clients={declared} but lists {len(clients)} clients")
    elif "train_indices" in document and "test_indices" in document:  # partition.json / --save
        train, test = document["train_indices"], document["test_indices"]
        for key in ("train_indices", "test_indices"):
            if not isinstance(document[key], list):
                raise ConfigError(
                    f"{where}: {key!r} must be one list of indices per client, not {json_kind(document[key])}"
                )
        val = document.get("val_indices")
        recorded = document.get("config", {})
        if not isinstance(recorded, dict):
            raise ConfigError(f"{where}: 'config' must be an object, not {json_kind(recorded)}")
        name = _optional(recorded.get("dataset"), str, where, "config.dataset", "a string")
        size = None
    else:
        raise ConfigError(
            f"{where} is neither a `pflbench partition --export` file nor a run's "
            "partition.json (no 'format' or 'train_indices' key)"
        )
    public = document.get("public", document.get("public_indices", []))
    ood = document.get("ood", document.get("ood_indices", []))
    return PresetPartition(
        train=[_index_array(v, where, f"client {k} train") for k, v in enumerate(train)],
        test=[_index_array(v, where, f"client {k} test") for k, v in enumerate(test)],
        public=_index_array(public, where, "public"),
        source=source,
        dataset_name=name,
        dataset_size=size,
        val=None if val is None else _val_lists(val, len(train), where),
        ood=_index_array(ood, where, "ood"),
        client_domains=_client_domains(_data_domains(document), len(train), where),
    )


def _data_domains(document: dict[str, Any]) -> Any:
    """The data's own client domains. The ``client_domains`` of a feature-shift run's
    partition.json also name its shift (a setting of that run, not of the indices): there the
    data's own are ``feature_shift.data_domains``."""
    shift = document.get("feature_shift")
    if isinstance(shift, dict) and "data_domains" in shift:
        return shift["data_domains"]
    return document.get("client_domains")


def _client_domains(value: Any, num_clients: int, where: str) -> list[str] | None:
    """The recorded per-client domain names (None when absent): one string per client."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != num_clients or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: 'client_domains' must be a list of {num_clients} strings, one per client")
    return list(value)


def _optional(value: Any, kind: type, where: str, key: str, wanted: str) -> Any:
    """``value`` when it is null or of ``kind`` (a boolean is no integer), else ConfigError."""
    if value is None or (type(value) is kind):
        return value
    raise ConfigError(f"{where}: {key} must be {wanted}, got {json.dumps(value)[:50]}")


MAX_INDEX = 2**62  # far above any dataset; keeps every index inside int64


def _val_lists(val: Any, num_clients: int, where: str) -> list[np.ndarray] | None:
    """The recorded validation indices (None when every client's list is empty: none recorded)."""
    if not isinstance(val, list) or len(val) != num_clients:
        raise ConfigError(f"{where}: validation indices must be one list per client ({num_clients} clients)")
    arrays = [_index_array(v, where, f"client {k} val") for k, v in enumerate(val)]
    return arrays if any(len(a) for a in arrays) else None


def _index_array(values: Any, where: str, what: str) -> np.ndarray:
    """A flat list of JSON integers as int64 (floats, booleans, strings and nested lists refused,
    not converted: a file holding them was not written by pflbench)."""
    if not isinstance(values, list):
        raise ConfigError(f"{where}: {what} indices must be a list of integers, not {json_kind(values)}")
    for value in values:
        if type(value) is not int:
            raise ConfigError(
                f"{where}: {what} indices must be a flat list of integers; found "
                + ("a nested list" if isinstance(value, list) else f"{json.dumps(value)[:50]} ({json_kind(value)})")
            )
        if not 0 <= value < MAX_INDEX:
            raise ConfigError(
                f"{where}: {what} index {value} is out of range (indices are ≥ 0 and below the dataset size)"
            )
    return np.asarray(values, dtype=np.int64)


def validate_partition(preset: PresetPartition, dataset_size: int, dataset_name: str | None = None) -> None:
    """ConfigError unless the indices fit a dataset of ``dataset_size`` samples (see module doc)."""
    where = f"partition {preset.source!r}"
    if preset.num_clients == 0:
        raise ConfigError(f"{where} has no clients")
    if len(preset.test) != preset.num_clients:
        raise ConfigError(f"{where} has {preset.num_clients} train lists but {len(preset.test)} test lists")
    val = preset.val or []
    if val and len(val) != preset.num_clients:
        raise ConfigError(f"{where} has {preset.num_clients} train lists but {len(val)} validation lists")
    if preset.dataset_size is not None and preset.dataset_size != dataset_size:
        raise ConfigError(
            f"{where} was made for a dataset of {preset.dataset_size} samples "
            f"({preset.dataset_name}); this dataset has {dataset_size}"
        )
    if dataset_name is not None and preset.dataset_name not in (None, dataset_name):
        raise ConfigError(
            f"{where} was made for dataset {preset.dataset_name!r}, not "
            f"{dataset_name!r}; pass --dataset {preset.dataset_name}"
        )
    for k, (train, test) in enumerate(zip(preset.train, preset.test)):
        if len(train) == 0 or len(test) == 0:
            split = "train" if len(train) == 0 else "test"
            raise ConfigError(f"{where}: client {k} has no {split} samples")
        if val and len(val[k]) == 0:
            raise ConfigError(f"{where}: client {k} has no validation samples (the file records them for others)")
    everything = np.concatenate([*preset.train, *val, *preset.test, preset.public, preset.ood])
    if everything.min() < 0 or everything.max() >= dataset_size:
        bad = everything[(everything < 0) | (everything >= dataset_size)][0]
        raise ConfigError(
            f"{where}: index {bad} is out of range for a dataset of "
            f"{dataset_size} samples (valid: 0..{dataset_size - 1})"
        )
    counts = np.bincount(everything, minlength=dataset_size)
    if counts.max() > 1:
        twice = int(np.flatnonzero(counts > 1)[0])
        raise ConfigError(
            f"{where}: sample {twice} is assigned {counts[twice]} times "
            "(each sample may appear once, in one client's train, validation or test split, public or ood)"
        )
