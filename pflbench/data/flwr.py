"""flwr-datasets partitioners as pflbench partitions: ``--partition-file flwr:<Partitioner>[:k=v,...]``
(``flwr_preset``) and export documents built from Flower partitioners of a hub split
(``flwr_partition_document``). Needs the ``flwr`` extra (``pip install 'pflbench[flwr]'``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.config.run_config import _key_values
from pflbench.data.partitioners import public_split, split_train_test
from pflbench.data.presets import FORMAT, VERSION, PresetPartition
from pflbench.errors import ConfigError
from pflbench.util.seeding import rng_stream

if TYPE_CHECKING:
    from pflbench.config.groups import PartitionSpec
    from pflbench.config.run_config import RunConfig
    from pflbench.data.dataset import TensorDataset

FLWR_PREFIX = "flwr:"
FLWR_INSTALL_HINT = "flwr-datasets is not installed; install the extra: pip install 'pflbench[flwr]'"
_INDEX_COLUMN = "__pflbench_row"


def require_flwr() -> Any:
    """The ``flwr_datasets`` module, or a one-line ConfigError saying how to install it."""
    try:
        import flwr_datasets
    except ImportError as error:
        raise ConfigError(FLWR_INSTALL_HINT) from error
    return flwr_datasets


def flwr_partition_indices(partitioner: Any, dataset: Any) -> list[np.ndarray]:
    """Row indices of ``dataset`` (a Hugging Face ``Dataset``) in each partition of a fresh
    flwr-datasets ``partitioner`` (one with no dataset assigned yet).

    The rows are tagged with their position before the partitioner sees them, so any
    partitioner (IID, Dirichlet, shards, natural id, ...) converts the same way.
    """
    tagged = dataset.add_column(_INDEX_COLUMN, list(range(len(dataset))))
    partitioner.dataset = tagged
    return [
        np.asarray(partitioner.load_partition(k)[_INDEX_COLUMN], dtype=np.int64)
        for k in range(partitioner.num_partitions)
    ]


def flwr_partition_document(
    train_partitioner: Any,
    train_dataset: Any,
    dataset_name: str,
    dataset_size: int,
    test_partitioner: Any = None,
    test_dataset: Any = None,
    test_offset: int | None = None,
    test_frac: float = 0.25,
    seed: int = 0,
) -> dict[str, Any]:
    """An export document from flwr-datasets partitioners (``--partition-file`` reads it).

    pflbench pools a hub dataset's splits in order (train, then test), so train-split row i is
    pooled index i and test-split row j is ``test_offset + j`` (default: len(train_dataset)).
    Without a test partitioner each client's train partition is split into train/test with
    pflbench's label-stratified split (``test_frac``, ``seed``).
    """

    clients = flwr_partition_indices(train_partitioner, train_dataset)
    if test_partitioner is not None:
        offset = len(train_dataset) if test_offset is None else test_offset
        tests = [part + offset for part in flwr_partition_indices(test_partitioner, test_dataset)]
        if len(tests) != len(clients):
            raise ConfigError(f"train partitioner has {len(clients)} partitions, test partitioner {len(tests)}")
        train = clients
    else:
        labels = np.zeros(dataset_size, dtype=np.int64)
        column = _label_column(train_dataset)
        labels[: len(train_dataset)] = np.asarray(train_dataset[column], dtype=np.int64)
        train, tests = split_train_test(labels, clients, test_frac, np.random.default_rng(seed))
    return {
        "format": FORMAT,
        "version": VERSION,
        "dataset": {"name": dataset_name, "size": int(dataset_size)},
        "num_clients": len(train),
        "clients": [{"train": np.sort(tr).tolist(), "test": np.sort(te).tolist()} for tr, te in zip(train, tests)],
        "public": [],
        "settings": {"source": "flwr-datasets", "partitioner": type(train_partitioner).__name__},
    }


def parse_flwr_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``flwr:Name[:key=value,...]`` → (partitioner class name, keyword arguments)."""

    name, _, options = spec[len(FLWR_PREFIX) :].partition(":")
    if not name.isidentifier():
        raise ConfigError(
            f"--partition-file {spec!r}: expected flwr:<Partitioner>[:key=value,...], "
            "e.g. flwr:DirichletPartitioner:alpha=0.5,seed=42"
        )
    items = tuple(item for item in options.split(",") if item)
    return name, _key_values(items, f"--partition-file {spec}")


def flwr_preset(config: PartitionSpec | RunConfig, dataset: TensorDataset) -> PresetPartition:
    """``--partition-file flwr:<Partitioner>[:key=value,...]``: a flwr-datasets partitioner with
    ``num_partitions`` = --num-clients on pflbench's pooled client data (after the public
    fraction is held out), as a Hugging Face Dataset with columns ``label`` (and ``group``
    where the dataset has natural client ids; partitioners take ``partition_by="label"`` by
    default). Each client's samples are then split train/test like every pflbench partition.
    For Flower's exact split of one hub split, build the document in Python with
    ``flwr_partition_document``."""
    import inspect

    import datasets

    name, options = parse_flwr_spec(config.partition_file or "")
    require_flwr()
    import flwr_datasets.partitioner as partitioners

    partitioner_class = getattr(partitioners, name, None)
    if not isinstance(partitioner_class, type):
        valid = ", ".join(n for n in dir(partitioners) if n.endswith("Partitioner") and n != "Partitioner")
        raise ConfigError(f"flwr-datasets has no partitioner {name!r}; valid: {valid}")
    accepted = inspect.signature(partitioner_class).parameters
    if "partition_by" in accepted:
        options.setdefault("partition_by", "label")
    try:
        partitioner = partitioner_class(num_partitions=config.num_clients, **options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"--partition-file {config.partition_file}: {error}") from error
    labels = dataset.labels.numpy()
    pool, public = public_split(labels, config.public_frac, config.seed)
    columns: dict[str, list] = {"label": labels[pool].tolist()}
    if dataset.groups is not None:
        columns["group"] = [str(g) for g in np.asarray(dataset.groups)[pool]]
    clients = [pool[part] for part in flwr_partition_indices(partitioner, datasets.Dataset.from_dict(columns))]
    train, test = split_train_test(labels, clients, config.test_frac, rng_stream(config.seed, "split"))
    return PresetPartition(train, test, public, f"flwr-datasets {name}")


def _label_column(dataset: Any) -> str:
    for name in ("label", "labels", "fine_label", "character"):
        if name in dataset.column_names:
            return name
    raise ConfigError(f"no label column among {dataset.column_names}; pass a test partitioner")
