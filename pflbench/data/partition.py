"""The run's partition stage: the one owner of how a run's samples are split over clients, and of
how many clients there are (a preset partition — file, flwr-datasets, a dataset's own client
split — or a registered partitioner), each client's train / validation / test split, and which
clients are new (held out of training, ``--new-clients``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.config.identity import partitioner_arguments
from pflbench.config.run_config import RunConfig, new_client_count, with_base_defaults
from pflbench.data.domains import DOMAIN_PARTITIONERS, client_domain_names, held_out_indices
from pflbench.data.feature_shift import FeatureShift, plan_feature_shift
from pflbench.data.flwr import FLWR_PREFIX, flwr_preset
from pflbench.data.partitioners import (
    partition,
    partition_stats,
    public_split,
    split_train_test,
    split_validation,
)
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
    val: list[np.ndarray] = field(default_factory=list)  # per client; empty arrays without --val-frac
    new_clients: list[int] = field(default_factory=list)  # held out of training (--new-clients)
    # --holdout-domain: every sample of the held-out domain, given to no client (ood_acc)
    ood: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    client_domains: list[str] | None = None  # each client's domain, where clients have one
    feature_shift: FeatureShift | None = None  # --feature-shift: each client's domain transform

    def shifted(self, dataset: TensorDataset) -> TensorDataset:
        """``dataset`` with each client's samples under its feature-shift domain (applied once,
        when a run builds its data); ``dataset`` itself without ``--feature-shift``."""
        if self.feature_shift is None:
            return dataset
        val = self.val or [np.zeros(0, dtype=np.int64)] * len(self.train)
        clients = [np.concatenate([tr, va, te]) for tr, va, te in zip(self.train, val, self.test)]
        return self.feature_shift.apply(dataset, clients)

    @property
    def domain_labels(self) -> list[str] | None:
        """Each client's domain as partition.json's ``client_domains`` records it: the data's own
        domain, the feature-shift domain, or both ("photo d3 rotate=45")."""
        if self.feature_shift is None:
            return self.client_domains
        shift = self.feature_shift.client_labels()
        if self.client_domains is None:
            return shift
        return [f"{own} {label}" for own, label in zip(self.client_domains, shift)]

    @property
    def has_val(self) -> bool:
        return any(len(v) for v in self.val)

    def to_json(self) -> dict[str, Any]:
        """partition.json: indices per client (``val_indices`` and ``new_clients`` when there
        are any), the public indices and the statistics."""
        return {
            "train_indices": [s.tolist() for s in self.train],
            **({"val_indices": [s.tolist() for s in self.val]} if self.has_val else {}),
            "test_indices": [s.tolist() for s in self.test],
            **({"new_clients": list(self.new_clients)} if self.new_clients else {}),
            "public_indices": self.public.tolist(),
            **({"ood_indices": self.ood.tolist()} if len(self.ood) else {}),
            **({"client_domains": self.domain_labels} if self.domain_labels is not None else {}),
            **(
                {"feature_shift": {**self.feature_shift.to_json(), "data_domains": self.client_domains}}
                if self.feature_shift is not None
                else {}
            ),
            "stats": self.stats,
        }


def choose_new_clients(num_clients: int, fraction: float, seed: int) -> list[int]:
    """The clients ``--new-clients fraction`` holds out of training: ``config.new_client_count``
    of the K, drawn without replacement from the ``new_clients`` stream (sorted)."""
    count = new_client_count(num_clients, fraction)
    if count == 0:
        return []
    chosen = rng_stream(seed, "new_clients").choice(num_clients, size=count, replace=False)
    return sorted(int(k) for k in chosen)


def with_validation(
    labels: np.ndarray,
    train: list[np.ndarray],
    test: list[np.ndarray],
    recorded: list[np.ndarray] | None,
    config: PartitionSpec,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train, validation) per client: a recorded validation split as it is, else one carved out
    of each client's train split at ``val_frac`` (``val`` stream); the test split is never touched."""
    if recorded is not None:
        return train, recorded
    return split_validation(labels, train, test, config.val_frac, rng_stream(config.seed, "val"))


def make_partition(spec: PartitionSpec | RunConfig, dataset: TensorDataset) -> Partition:
    """Hold out the public fraction (public stream), partition the rest over clients
    (partition stream), split each client into train/test (split stream), carve its validation
    split out of its train split (val stream: the test split is the one without validation),
    and choose the new clients (new_clients stream). Reads only the partition group (a
    RunConfig is accepted for convenience: its unset settings take the base defaults)."""
    config = fit_num_clients(with_base_defaults(spec), dataset).partition_spec if isinstance(spec, RunConfig) else spec
    if config.num_clients is None:
        raise RuntimeError("num_clients is unset: fit it first (data.partition.fit_num_clients)")
    labels = dataset.labels.numpy()
    preset = preset_partition(config, dataset)  # --partition-file, or a dataset's own client split
    new_clients = choose_new_clients(config.num_clients, config.new_clients, config.seed)
    if preset is not None:
        train, val = with_validation(labels, preset.train, preset.test, preset.val, config)
        stats = partition_stats(labels, train, preset.test, dataset.num_classes, val)
        stats = {**stats, "public_samples": len(preset.public), **_ood_stats(preset.ood)}
        split = Partition(train, preset.test, stats, preset.public, val, new_clients, preset.ood, preset.client_domains)
        return with_feature_shift(split, config, dataset)
    pool, public = public_split(labels, config.public_frac, config.seed)
    ood = np.zeros(0, dtype=np.int64)
    holdout = partitioner_arguments(config).get("holdout_domain")
    if holdout is not None:  # the held-out domain is given to no client, and not to pretraining either
        ood = held_out_indices(dataset.groups, holdout)
        public = np.setdiff1d(public, ood)
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
    train, val = with_validation(labels, train, test, None, config)
    stats = {**partition_stats(labels, train, test, dataset.num_classes, val), "public_samples": len(public)}
    domains = client_domain_names(dataset.groups, clients) if config.partition in DOMAIN_PARTITIONERS else None
    split = Partition(train, test, {**stats, **_ood_stats(ood)}, public, val, new_clients, ood, domains)
    return with_feature_shift(split, config, dataset)


def with_feature_shift(split: Partition, config: PartitionSpec, dataset: TensorDataset) -> Partition:
    """``split`` with the run's feature shift (``data.feature_shift``), None without one. It is
    a setting of the run, not of the indices: ``client_domains`` keeps the data's own domains
    (what an export records), ``domain_labels`` adds the shift's."""
    shift = plan_feature_shift(config, dataset, len(split.train))
    return split if shift is None else dataclasses.replace(split, feature_shift=shift)


def _ood_stats(ood: np.ndarray | None) -> dict[str, int]:
    """``ood_samples`` in the statistics when a domain is held out."""
    return {"ood_samples": len(ood)} if ood is not None and len(ood) else {}


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
        fitted = (
            config if config.num_clients is not None else dataclasses.replace(config, num_clients=DEFAULT_NUM_CLIENTS)
        )
        new_client_count(fitted.num_clients or 0, fitted.new_clients)  # some client must train
        return fitted
    if config.num_clients is not None and config.num_clients != preset.num_clients:
        raise ConfigError(
            f"--num-clients {config.num_clients} contradicts partition {preset.source!r}, which has "
            f"{preset.num_clients} clients; drop --num-clients (the partition sets it)"
        )
    new_client_count(preset.num_clients, config.new_clients)
    return dataclasses.replace(config, num_clients=preset.num_clients)
