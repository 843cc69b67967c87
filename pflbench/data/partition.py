"""The run's partition stage: the one owner of how a run's samples are split over clients, and of how many clients there are (a preset partition — file, flwr-datasets, a dataset's own client split — or a registered partitioner)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.config.run_config import RunConfig, with_base_defaults
from pflbench.data.flwr import FLWR_PREFIX, flwr_preset
from pflbench.data.partitioners import partition, partition_stats, public_split, split_train_test
from pflbench.data.presets import PresetPartition, read_partition_file, validate_partition
from pflbench.errors import ConfigError
from pflbench.util.seeding import rng_stream

if TYPE_CHECKING:
    from pflbench.config.groups import PartitionSpec
    from pflbench.data.dataset import TensorDataset


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
    config = with_base_defaults(spec).partition_spec if isinstance(spec, RunConfig) else spec
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
        alpha=config.alpha,
        min_size=config.min_size,
        shards_per_client=config.shards_per_client,
        groups=groups,
        cut=config.dirichlet_cut,
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


def fit_num_clients(config: RunConfig, dataset: TensorDataset, explicit: set[str] | None = None) -> RunConfig:
    """``config`` with ``num_clients`` taken from the preset partition, if there is one.

    A ``--num-clients`` the user set explicitly (``explicit``) must agree with the partition.
    """
    if (config.partition_file or "").startswith(FLWR_PREFIX):
        return config  # Flower's partitioner is built for --num-clients partitions
    preset = preset_partition(config, dataset)
    if preset is None or preset.num_clients == config.num_clients:
        return config
    if explicit is not None and "num_clients" in explicit:
        raise ConfigError(
            f"--num-clients {config.num_clients} contradicts partition "
            f"{preset.source!r}, which has {preset.num_clients} clients; drop "
            "--num-clients (the partition sets it)"
        )
    return dataclasses.replace(config, num_clients=preset.num_clients)
