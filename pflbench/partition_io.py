"""Partitions in and out: export files, ``--partition-file``, PFLlib folders, flwr-datasets.

An exported partition (``pflbench partition --export FILE``) is one JSON object::

    {"format": "pflbench-partition", "version": 1,
     "dataset": {"name": "mnist", "size": 70000, "num_classes": 10, "source": "..."},
     "num_clients": K,
     "clients": [{"train": [i, ...], "test": [j, ...]}, ...],   # indices into the pooled dataset
     "public": [...],                                          # held out, given to no client
     "settings": {...}}                                        # how it was made (informative)

Indices address the pooled dataset (all of the dataset's splits concatenated in order, as the
loaders build it). ``--partition-file`` also reads a run's ``partition.json`` (and the
``partition --save`` file). Whatever the source, a partition is validated before use: every
index in range, no sample twice (across clients and train/test/public), no client without
train or test samples; each failure is one ``ConfigError`` line.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import PartitionSpec, RunConfig
    from .data import TensorDataset

FORMAT = "pflbench-partition"
VERSION = 1
FLWR_PREFIX = "flwr:"
FLWR_INSTALL_HINT = "flwr-datasets is not installed; install the extra: pip install 'pflbench[flwr]'"
_INDEX_COLUMN = "__pflbench_row"


@dataclass
class PresetPartition:
    """Exact per-client train/test indices (and public indices) into the pooled dataset."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    public: np.ndarray
    source: str
    dataset_name: str | None = None
    dataset_size: int | None = None

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
) -> dict[str, Any]:
    """The export JSON object (see the module docstring)."""
    settings = {
        k: v
        for k, v in dataclasses.asdict(config).items()
        if k
        in (
            "partition",
            "alpha",
            "dirichlet_cut",
            "shards_per_client",
            "min_size",
            "test_frac",
            "public_frac",
            "seed",
            "dataset_option",
            "partition_file",
        )
    }
    return {
        "format": FORMAT,
        "version": VERSION,
        "dataset": {
            "name": config.dataset,
            "size": int(len(dataset.labels)),
            "num_classes": int(dataset.num_classes),
            "source": dataset.source,
        },
        "num_clients": len(train),
        "clients": [{"train": np.asarray(tr).tolist(), "test": np.asarray(te).tolist()} for tr, te in zip(train, test)],
        "public": np.asarray(public).tolist(),
        "settings": settings,
    }


def export_partition(path: str | Path, document: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
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
    if not isinstance(document, dict):
        raise ConfigError(f"{where} holds a JSON {type(document).__name__}, not a partition object")
    if document.get("format") == FORMAT:
        if document.get("version") != VERSION:
            raise ConfigError(
                f"{where} has format version {document.get('version')!r}; this pflbench reads version {VERSION}"
            )
        clients = document.get("clients")
        if not isinstance(clients, list) or not all(isinstance(c, dict) for c in clients):
            raise ConfigError(f'{where}: \'clients\' must be a list of {{"train": [...], "test": [...]}}')
        train = [c.get("train") for c in clients]
        test = [c.get("test") for c in clients]
        dataset = document.get("dataset") or {}
        name, size = dataset.get("name"), dataset.get("size")
        declared = document.get("num_clients")
        if declared is not None and declared != len(clients):
            raise ConfigError(f"{where} declares num_clients={declared} but lists {len(clients)} clients")
    elif "train_indices" in document and "test_indices" in document:  # partition.json / --save
        train, test = document["train_indices"], document["test_indices"]
        name = (document.get("config") or {}).get("dataset")
        size = None
    else:
        raise ConfigError(
            f"{where} is neither a `pflbench partition --export` file nor a run's "
            "partition.json (no 'format' or 'train_indices' key)"
        )
    public = document.get("public", document.get("public_indices", []))
    preset = PresetPartition(
        train=[_index_array(v, where, f"client {k} train") for k, v in enumerate(train)],
        test=[_index_array(v, where, f"client {k} test") for k, v in enumerate(test)],
        public=_index_array(public, where, "public"),
        source=str(path),
        dataset_name=name,
        dataset_size=size,
    )
    return preset


def _index_array(values: Any, where: str, what: str) -> np.ndarray:
    if not isinstance(values, list):
        raise ConfigError(f"{where}: {what} indices must be a list of integers")
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ConfigError(f"{where}: {what} indices must be a flat list of integers")
    return array.astype(np.int64)


def validate_partition(preset: PresetPartition, dataset_size: int, dataset_name: str | None = None) -> None:
    """ConfigError unless the indices fit a dataset of ``dataset_size`` samples (see module doc)."""
    where = f"partition {preset.source!r}"
    if preset.num_clients == 0:
        raise ConfigError(f"{where} has no clients")
    if len(preset.test) != preset.num_clients:
        raise ConfigError(f"{where} has {preset.num_clients} train lists but {len(preset.test)} test lists")
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
    everything = np.concatenate([*preset.train, *preset.test, preset.public])
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
            "(each sample may appear once, in one client's train or test split or public)"
        )


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


# ----------------------------------------------------------------------------- PFLlib folders


def read_pfllib_folder(path: str | Path) -> dict[str, Any]:
    """A PFLlib dataset folder: ``config.json``, ``train/<i>.npz``, ``test/<i>.npz``.

    Each ``.npz`` holds ``data``, a pickled dict with ``x`` and ``y`` (PFLlib's ``save_file``).
    Returns ``x`` and ``y`` pooled client by client (client 0 train, client 0 test, client 1
    train, ...), ``client`` (the client id of each sample), the per-client ``train``/``test``
    index lists into the pooled arrays, and ``num_classes``.
    """
    root = Path(path).expanduser()
    where = f"PFLlib folder {str(root)!r}"
    if not (root / "config.json").is_file():
        raise ConfigError(f"{where} has no config.json (expected config.json, train/<i>.npz, test/<i>.npz)")
    try:
        config = json.loads((root / "config.json").read_text())
        num_clients = int(config["num_clients"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"{where}: config.json has no valid num_clients ({error})") from error
    xs, ys, train, test, owner = [], [], [], [], []
    offset = 0
    for client in range(num_clients):
        for split, indices in (("train", train), ("test", test)):
            x, y = _read_pfllib_npz(root / split / f"{client}.npz", where)
            xs.append(x)
            ys.append(y)
            indices.append(np.arange(offset, offset + len(y), dtype=np.int64))
            owner.append(np.full(len(y), client, dtype=np.int64))
            offset += len(y)
    labels = np.concatenate(ys)
    num_classes = int(config.get("num_classes") or labels.max(initial=-1) + 1)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(f"{where}: labels outside 0..{num_classes - 1} (config.json num_classes)")
    shapes = {x.shape[1:] for x in xs}
    if len(shapes) > 1:
        raise ConfigError(f"{where}: clients' x arrays have different shapes {sorted(shapes)}")
    return {
        "x": np.concatenate(xs),
        "y": labels,
        "client": np.concatenate(owner),
        "train": train,
        "test": test,
        "num_classes": num_classes,
    }


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays, dtypes and plain containers; any other global is refused, so a
    crafted file cannot run code (no ``np.load(allow_pickle=True)``)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        return super().find_class(module, name)


def safe_pickled_npz_entry(file: Path, key: str) -> Any:
    """The object stored under ``key`` of an ``.npz`` (a pickled 0-d object array), rebuilt with
    an unpickler that only knows numpy arrays and containers."""
    import io
    import zipfile

    with zipfile.ZipFile(file) as archive, archive.open(f"{key}.npy") as stream:
        major, _ = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
        if dtype.hasobject:
            value = _ArraysOnlyUnpickler(io.BytesIO(stream.read())).load()
            return value.item() if isinstance(value, np.ndarray) and value.shape == () else value
        return np.lib.format.read_array(archive.open(f"{key}.npy"), allow_pickle=False)


def _read_pfllib_npz(file: Path, where: str) -> tuple[np.ndarray, np.ndarray]:
    if not file.is_file():
        raise ConfigError(
            f"{where} has no {file.parent.name}/{file.name} (config.json lists more clients than there are files)"
        )
    try:
        data = safe_pickled_npz_entry(file, "data")  # PFLlib pickles a dict into 'data'
        x, y = np.asarray(data["x"]), np.asarray(data["y"]).astype(np.int64).reshape(-1)
    except Exception as error:  # any unreadable file is bad input here
        raise ConfigError(
            f"{where}: {file.parent.name}/{file.name} is not a PFLlib client file "
            f"(an .npz with data={{'x': ..., 'y': ...}}): {error}"
        ) from error
    if len(x) != len(y):
        raise ConfigError(f"{where}: {file.parent.name}/{file.name} has {len(x)} x rows but {len(y)} labels")
    return x, y


# ----------------------------------------------------------------------------- flwr-datasets


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
    from .partition import split_train_test

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
    from .config import _key_values

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

    from .partition import split_train_test
    from .pretrain import public_split
    from .seeding import rng_stream

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
