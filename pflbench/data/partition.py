"""The run's partition stage: the one owner of how a run's samples are split over clients, and of how many clients there are (a preset partition — file, flwr-datasets, a dataset's own client split — or a registered partitioner)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.config.identity import partitioner_arguments
from pflbench.config.run_config import RunConfig, with_base_defaults
from pflbench.data.flwr import FLWR_PREFIX, flwr_preset
from pflbench.data.partitioners import partition, partition_stats, public_split, split_train_test
from pflbench.data.presets import PresetPartition, read_partition_file, validate_partition
from pflbench.errors import ConfigError
from pflbench.util.seeding import rng_stream

if TYPE_CHECKING:
    from pflbench.config.groups import PartitionSpec
    from pflbench.data.dataset import TensorDataset

DEFAULT_NUM_CLIENTS = 20  # K when --num-clients is unset and no preset partition sets it


@dataclass
class Partition:
    train: list[np.ndarray]
    test: list[np.ndarray]
    stats: dict[str, Any]
    public: np.ndarray  # held out for pretraining, given to no client (--public-frac)

    def to_json(self) -> dict[str, Any]:
        return {
            "train_indices": [s.tolist() for s in self.train],
            "test_indices": [s.tolist() for s in self.test],
            "public_indices": self.public.tolist(),
            "stats": self.stats,
        }


def make_partition(spec: PartitionSpec | RunConfig, dataset: TensorDataset) -> Partition:
    """Hold out the public fraction (public stream), partition the rest over clients
    (partition stream), then split each client (split stream). Reads only the partition group
    (a RunConfig is accepted for convenience: its unset settings take the base defaults)."""
    config = fit_num_clients(with_base_defaults(spec), dataset).partition_spec if isinstance(spec, RunConfig) else spec
    if config.num_clients is None:
        raise RuntimeError("num_clients is unset: fit it first (data.partition.fit_num_clients)")
    labels = dataset.labels.numpy()
    preset = preset_partition(config, dataset)  # --partition-file, or a dataset's own client split
    if preset is not None:
        stats = partition_stats(labels, preset.train, preset.test, dataset.num_classes)
        return Partition(preset.train, preset.test, {**stats, "public_samples": len(preset.public)}, preset.public)
    pool, public = public_split(labels, config.public_frac, config.seed)
    groups = None if dataset.groups is None else np.asarray(dataset.groups)[pool]
    clients = partition(
        config.partition,
        labels[pool],
        config.num_clients,
        rng_stream(config.seed, "partition"),
        groups=groups,
        **partitioner_arguments(config),
    )
    clients = [pool[indices] for indices in clients]
    train, test = split_train_test(labels, clients, config.test_frac, rng_stream(config.seed, "split"))
    stats = {**partition_stats(labels, train, test, dataset.num_classes), "public_samples": len(public)}
    return Partition(train, test, stats, public)


def preset_partition(config: PartitionSpec | RunConfig, dataset: TensorDataset) -> PresetPartition | None:
    """The exact partition a run must use, if any: ``--partition-file``, else the dataset's own
    per-client train/test split under ``--partition natural`` (PFLlib folders). Validated."""
    if config.partition_file is not None and config.partition_file.startswith(FLWR_PREFIX):
        preset = flwr_preset(config, dataset)
        name = None
    elif config.partition_file is not None:
        preset = read_partition_file(config.partition_file)
        name = config.dataset
    elif config.partition == "natural" and "client_splits" in dataset.info:
        splits = dataset.info["client_splits"]
        preset = PresetPartition(
            [np.asarray(s, dtype=np.int64) for s in splits["train"]],
            [np.asarray(s, dtype=np.int64) for s in splits["test"]],
            np.zeros(0, dtype=np.int64),
            f"{config.dataset}'s own client split",
        )
        name = None
    else:
        return None
    validate_partition(preset, len(dataset.labels), name)
    if (config.public_frac or 0) > 0 and len(preset.public) == 0:
        raise ConfigError(
            f"partition {preset.source!r} holds no public samples, but --public-frac "
            f"is {config.public_frac:g}; pass --public-frac 0 (and --weights FILE or "
            "--backbone random for a LoRA run)"
        )
    return preset


def fit_num_clients(config: RunConfig, dataset: TensorDataset | Callable[[], TensorDataset]) -> RunConfig:
    """``config`` with the number of clients K set by THE rule (``run``, ``sweep``, ``partition``
    and library calls all come here): a preset partition (a ``--partition-file``, or the dataset's
    own client split under ``--partition natural``) has its K, and a ``--num-clients`` that is set
    must equal it (a conflict is an error, never a silent change); otherwise K is
    ``--num-clients``, ``DEFAULT_NUM_CLIENTS`` when unset. A flwr-datasets partitioner is built
    for K partitions. ``dataset`` may be a loader, called only when K depends on the data."""
    if config.partition_file is None and config.partition != "natural":
        preset = None  # no preset can exist: K is the option's, the data is not needed
    elif (config.partition_file or "").startswith(FLWR_PREFIX):
        preset = None  # Flower's partitioner is built for --num-clients partitions
    else:
        preset = preset_partition(config, dataset() if callable(dataset) else dataset)
    if preset is None:
        return (
            config if config.num_clients is not None else dataclasses.replace(config, num_clients=DEFAULT_NUM_CLIENTS)
        )
    if config.num_clients is not None and config.num_clients != preset.num_clients:
        raise ConfigError(
            f"--num-clients {config.num_clients} contradicts partition {preset.source!r}, which has "
            f"{preset.num_clients} clients; drop --num-clients (the partition sets it)"
        )
    return dataclasses.replace(config, num_clients=preset.num_clients)
