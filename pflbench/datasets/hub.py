"""MNIST, Fashion-MNIST, KMNIST, EMNIST, CIFAR-10, CIFAR-100 and SVHN: from the dataset's own
on-disk format, the Hugging Face Hub or a local copy of it.

Each loader pools all of the dataset's splits (train + test) into one ``TensorDataset`` (SVHN:
train + test, its ``extra`` split only with the option ``extra=true``).

``data_dir`` holding the dataset's own files is read directly (``datasets.torchvision_files``):
MNIST-family IDX files (plain or ``.gz``) in the folder itself or in torchvision's
``<data_dir>/<Name>/raw``; CIFAR's python pickles in the folder or in ``<data_dir>/cifar-10-batches-py``
/ ``cifar-100-python``. KMNIST and EMNIST are read only so. ``fashion_mnist`` without ``data_dir``
reads ``/usr/share/datasets/fashion-mnist`` when it exists (Debian's ``dataset-fashion-mnist``).
Otherwise ``data_dir`` names a Hugging Face local copy, in either of two forms:

* a clone of the hub repository (``git clone https://huggingface.co/datasets/<hub id>`` with
  git-lfs), or any folder of its parquet files; it is passed as the path to
  ``datasets.load_dataset``;
* a folder written by ``datasets.load_dataset(<hub id>).save_to_disk(folder)``.

A hub dataset with several configs (SVHN: ``cropped_digits`` and ``full_numbers``) names the one
to load in ``HubSource.config``; it is passed as ``name`` to ``datasets.load_dataset`` for the hub
id and for a clone whose README declares configs (the hub repository's ``configs:`` metadata).
A folder that declares none is taken as that config's files: its subfolder ``<config>/`` if there
is one (the hub layout, e.g. ``cropped_digits/train-00000-of-00001.parquet``), else the folder
itself; shards named ``<split>-NNNNN-of-NNNNN.parquet`` give their split names (so SVHN's
``extra`` is found, which Hugging Face's default file patterns do not know). A ``save_to_disk``
folder holds one config already and is loaded as it is.

Without ``data_dir`` the hub id is loaded through Hugging Face's own cache (``HF_HOME`` /
``HF_DATASETS_CACHE``). With ``HF_HUB_OFFLINE=1`` only that cache is read; otherwise the hub is
probed once (a few seconds at most) so that an unreachable hub fails fast, not after retries.
Either way, data that cannot be had raises a one-line ``ConfigError`` saying how to get it.

The helpers in the first section (image decoding, labels, column checks) are shared with
``pflbench.datasets.local_files``. Hugging Face ``datasets`` is imported where used: it takes
about a second, and every pflbench command imports the dataset plugins.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch
from huggingface_hub.utils import get_session, httpx
from PIL import Image

from pflbench.data.dataset import TensorDataset
from pflbench.datasets import torchvision_files as files
from pflbench.errors import ConfigError
from pflbench.registry import register_dataset
from pflbench.util import progress

if TYPE_CHECKING:
    import datasets

HUB_PROBE_TIMEOUT_S = 3.0
_GRAYSCALE_MODES = frozenset({"1", "L", "LA"})
_LFS_POINTER = b"version https://git-lfs"


@dataclass(frozen=True)
class HubSource:
    """Where a dataset lives on the hub and which of its columns hold the image and label."""

    name: str
    hub_id: str
    image_column: str
    label_column: str
    config: str | None = None  # the hub dataset's config (``name`` of ``datasets.load_dataset``)


# ----------------------------------------------------------------------------- shared helpers


def image_sources(column: pa.ChunkedArray, name: str) -> list[bytes | str]:
    """The encoded bytes (or, where absent, the file path) of each HF ``Image`` struct."""
    fields = {field.name for field in column.type} if pa.types.is_struct(column.type) else set()
    if not {"bytes", "path"} <= fields:
        raise ConfigError(
            f"column {name!r} is not an image column: expected Hugging Face Image "
            f"structs {{bytes, path}}, found {column.type}"
        )
    sources: list[bytes | str] = []
    for chunk in column.chunks:
        encoded, paths = chunk.field("bytes").to_pylist(), chunk.field("path").to_pylist()
        sources.extend(data if data is not None else path for data, path in zip(encoded, paths))
    return sources


def _decode(source: bytes | str, size: tuple[int, int] | None) -> np.ndarray:
    """One image as uint8 [H, W] (grayscale) or [H, W, 3] (anything else, as RGB)."""
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
        mode = "L" if image.mode in _GRAYSCALE_MODES else "RGB"
        converted = image.convert(mode) if image.mode != mode else image
        if size is not None and converted.size != (size[1], size[0]):
            converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        return np.asarray(converted, dtype=np.uint8)


DECODE_CHUNK = 500  # images decoded between progress updates


def decode_images(sources: Sequence[bytes | str], size: tuple[int, int] | None = None) -> torch.Tensor:
    """Encoded images (bytes or paths) → uint8 [N, C, H, W]; C=1 if all are grayscale, else 3.

    ``size`` (H, W) resizes every image; without it all images must share one size.
    """
    arrays = []
    with progress.stage("decoding images", len(sources), "image") as stage:
        for start in range(0, len(sources), DECODE_CHUNK):
            chunk = sources[start : start + DECODE_CHUNK]
            arrays.extend(_decode(source, size) for source in chunk)
            stage.advance(len(chunk))
    if not arrays:
        raise ConfigError("the dataset holds no images")
    shapes = sorted({array.shape[:2] for array in arrays})
    if len(shapes) > 1:
        raise ConfigError(
            f"images have different sizes ({shapes[0][0]}x{shapes[0][1]} and "
            f"{shapes[-1][0]}x{shapes[-1][1]}); pass the size option, e.g. size=32"
        )
    if all(array.ndim == 2 for array in arrays):
        return torch.from_numpy(np.stack(arrays)).unsqueeze(1).contiguous()
    rgb = [np.repeat(array[:, :, None], 3, axis=2) if array.ndim == 2 else array for array in arrays]
    return torch.from_numpy(np.stack(rgb)).permute(0, 3, 1, 2).contiguous()


def label_info(feature: Any, labels: np.ndarray, name: str) -> tuple[int, list[str] | None]:
    """Number of classes (and their names) from a ``ClassLabel`` feature, else max label + 1."""
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        num_classes, names = feature.num_classes, list(feature.names)
    else:
        num_classes, names = int(labels.max(initial=-1)) + 1, None
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            f"label column {name!r} has values outside 0..{num_classes - 1} (min {labels.min()}, max {labels.max()})"
        )
    return num_classes, names


def reject_lfs_pointers(files: Sequence[Path]) -> None:
    """ConfigError if a file is a git-lfs pointer (a clone made without git-lfs), not data."""
    for file in files:
        with open(file, "rb") as handle:
            if handle.read(len(_LFS_POINTER)) == _LFS_POINTER:
                raise ConfigError(
                    f"{str(file)!r} is a git-lfs pointer, not the data; run "
                    "`git lfs install && git lfs pull` in the clone"
                )


def require_columns(available: Sequence[str], wanted: Sequence[str], where: str) -> None:
    """ConfigError naming the first of ``wanted`` that ``available`` lacks."""
    for column in wanted:
        if column not in available:
            raise ConfigError(f"{where} has no column {column!r}; its columns: {', '.join(available)}")


# ----------------------------------------------------------------------------- getting the data


def _how_to_get(source: HubSource) -> str:
    config = f", '{source.config}'" if source.config else ""
    return (
        f'download it on a machine with network: python -c "import datasets; '
        f"datasets.load_dataset('{source.hub_id}'{config}).save_to_disk('{source.name}')\" and pass "
        f"--data-dir {source.name}, or git clone (with git-lfs) "
        f"https://huggingface.co/datasets/{source.hub_id} and pass --data-dir PATH"
    )


def _unavailable(source: HubSource, reason: str) -> ConfigError:
    reason = " ".join(reason.split())
    config = f", config {source.config}" if source.config else ""
    return ConfigError(
        f"dataset {source.name!r} (hub id {source.hub_id}{config}) is not available: {reason}; {_how_to_get(source)}"
    )


def _hub_reachable() -> bool:
    """One request to the hub endpoint, no retries: any HTTP answer counts as reachable."""
    import datasets

    try:
        get_session().head(datasets.config.HF_ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.TransportError:
        return False
    return True


def _as_splits(loaded: datasets.Dataset | datasets.DatasetDict) -> dict[str, datasets.Dataset]:
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        return dict(loaded)
    return {"all": loaded}


def _from_hub(source: HubSource) -> dict[str, datasets.Dataset]:
    """The hub dataset through Hugging Face's cache; ConfigError fast when it cannot be had."""
    import datasets

    if not datasets.config.HF_HUB_OFFLINE and not _hub_reachable():
        raise _unavailable(
            source,
            f"the Hugging Face Hub ({datasets.config.HF_ENDPOINT}) is "
            "unreachable (set HF_HUB_OFFLINE=1 to use a copy already in "
            "the Hugging Face cache)",
        )
    try:
        return _as_splits(datasets.load_dataset(source.hub_id, source.config))
    except ConnectionError as error:  # offline (or the network dropped) and not cached
        raise _unavailable(source, str(error)) from error


def _from_local_copy(source: HubSource, path: Path) -> dict[str, datasets.Dataset]:
    """A hub-repo clone (parquet files) or a ``save_to_disk`` folder."""
    if not path.is_dir():  # before importing Hugging Face datasets (seconds)
        raise _unavailable(source, f"data_dir {str(path)!r} is not a directory")
    import datasets

    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return _as_splits(datasets.load_from_disk(str(path)))
    reject_lfs_pointers(sorted(path.rglob("*.parquet")))
    try:
        if source.config is None:
            return _as_splits(datasets.load_dataset(str(path)))
        return _config_from_local_copy(source, source.config, path)
    except FileNotFoundError as error:  # EmptyDatasetError, DataFilesNotFoundError
        reason = f"data_dir {str(path)!r} holds no data files ({error})"
        raise _unavailable(source, reason) from error


def _config_from_local_copy(source: HubSource, config: str, path: Path) -> dict[str, datasets.Dataset]:
    """Config ``config`` of a clone (README ``configs:``) or of a folder of its files."""
    import datasets

    declared = datasets.get_dataset_config_names(str(path))
    if declared != ["default"]:  # the README's configs: metadata, as in the hub repository
        if config not in declared:
            reason = f"data_dir {str(path)!r} declares the configs {', '.join(declared)}, not {config!r}"
            raise _unavailable(source, reason)
        return _as_splits(datasets.load_dataset(str(path), config))
    folder = path / config if (path / config).is_dir() else path
    return _as_splits(datasets.load_dataset(str(folder), data_files=_sharded_splits(folder)))


_SHARD = re.compile(r"(?P<split>\w+?)-\d{5}-of-\d{5}\.parquet")
_SPLIT_ORDER = ("train", "validation", "test")


def _sharded_splits(folder: Path) -> dict[str, list[str]] | None:
    """The hub's shard names ``<split>-NNNNN-of-NNNNN.parquet`` directly in ``folder`` → their
    files per split (train, validation, test first); None (Hugging Face's own file patterns) if
    any parquet file there is named otherwise, or there is none."""
    files = sorted(folder.glob("*.parquet"))
    matches = [_SHARD.fullmatch(file.name) for file in files]
    if not files or not all(matches):
        return None
    splits: dict[str, list[str]] = {}
    for match, file in zip(matches, files):
        assert match is not None
        splits.setdefault(match["split"], []).append(str(file))
    rank = {split: index for index, split in enumerate(_SPLIT_ORDER)}
    return {split: splits[split] for split in sorted(splits, key=lambda split: (rank.get(split, len(rank)), split))}


# ----------------------------------------------------------------------------- the loaders


def _pool(splits: dict[str, datasets.Dataset], image_column: str, label_column: str, origin: str) -> TensorDataset:
    """The splits concatenated in order into one TensorDataset."""
    first = next(iter(splits.values()))
    require_columns(first.column_names, [image_column, label_column], origin)
    tables = [split.with_format("arrow") for split in splits.values()]
    sources = [item for table in tables for item in image_sources(table[image_column], image_column)]
    labels = np.concatenate([table[label_column].to_numpy() for table in tables]).astype(np.int64)
    num_classes, names = label_info(first.features[label_column], labels, label_column)
    sizes = {name: len(split) for name, split in splits.items()}
    described = ", ".join(f"{name}: {size}" for name, size in sizes.items())
    info: dict[str, Any] = {"splits": sizes, "label_column": label_column}
    if names is not None:
        info["classes"] = names
    return TensorDataset(
        inputs=decode_images(sources),
        labels=torch.from_numpy(labels),
        num_classes=num_classes,
        source=f"{origin}, splits pooled ({described})",
        info=info,
    )


def hub_splits(source: HubSource, data_dir: str | None) -> tuple[dict[str, datasets.Dataset], str]:
    """The splits of ``source`` (hub cache, or the local copy ``data_dir``) and their origin."""
    hub_id = f"{source.hub_id}, config {source.config}" if source.config else source.hub_id
    if data_dir is None:
        return _from_hub(source), f"Hugging Face hub {hub_id}"
    path = Path(data_dir).expanduser().resolve()
    return _from_local_copy(source, path), f"{path} (local copy of {hub_id})"


def load_hub_dataset(source: HubSource, data_dir: str | None, label_column: str | None = None) -> TensorDataset:
    """All splits of ``source`` pooled into one TensorDataset (see the module docstring)."""
    splits, origin = hub_splits(source, data_dir)
    return _pool(splits, source.image_column, label_column or source.label_column, origin)


MNIST = HubSource("mnist", "ylecun/mnist", "image", "label")
FASHION_MNIST = HubSource("fashion_mnist", "zalando-datasets/fashion_mnist", "image", "label")
CIFAR10 = HubSource("cifar10", "uoft-cs/cifar10", "img", "label")
CIFAR100 = HubSource("cifar100", "uoft-cs/cifar100", "img", "fine_label")
CIFAR100_LABELS = {"fine": "fine_label", "coarse": "coarse_label"}
SVHN = HubSource("svhn", "ufldl-stanford/svhn", "image", "label", config="cropped_digits")
SVHN_EXTRA_SPLIT = "extra"
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
# read when the loader is given no data_dir: a system-wide copy in the dataset's own format
DEFAULT_DIRS = {"fashion_mnist": Path("/usr/share/datasets/fashion-mnist")}  # Debian: dataset-fashion-mnist
_HF_MARKERS = ("dataset_dict.json", "state.json")


@dataclass(frozen=True)
class OnDisk:
    """A dataset's own on-disk format: how to find its files under a folder and read them."""

    describe: str  # what the folder should hold, for messages
    download: str  # torchvision's call that downloads the files into DIR
    locate: Callable[[Path], list[Path] | None]  # its files (None: the folder holds none of them)
    read: Callable[[Path], TensorDataset]


def idx_format(layout: files.IdxLayout) -> OnDisk:
    stems = layout.stems()

    def locate(folder: Path) -> list[Path] | None:
        found = files.find_idx(folder, layout)
        return None if found is None else list(found.values())

    def read(folder: Path) -> TensorDataset:
        found = files.find_idx(folder, layout)
        assert found is not None  # located before being read
        return files.load_idx(found, layout)

    where = f"in the folder, its {layout.torchvision}/raw or raw/"
    described = f"{layout.title} IDX files {', '.join(s + '[.gz]' for s in stems.values())} ({where})"
    download = f"torchvision.datasets.{layout.torchvision}('DIR'{layout.download_options}, download=True)"
    return OnDisk(described, download, locate, read)


def cifar_format(layout: files.CifarLayout) -> OnDisk:
    names = (*layout.train, *layout.test, layout.meta)

    def locate(folder: Path) -> list[Path] | None:
        found = files.find_cifar(folder, layout)
        return None if found is None else [found / name for name in names]

    def read(folder: Path) -> TensorDataset:
        found = files.find_cifar(folder, layout)
        assert found is not None
        return files.load_cifar(found, layout)

    described = f"{layout.title} python files {', '.join(names)} (in the folder or its {layout.folder}/)"
    download = f"torchvision.datasets.{'CIFAR10' if layout.num_classes == 10 else 'CIFAR100'}('DIR', download=True)"
    return OnDisk(described, download, locate, read)


def _data_folder(name: str, data_dir: str | None) -> tuple[Path | None, bool]:
    """The folder to look in (``data_dir``, else the dataset's default folder if it exists) and
    whether it is the default."""
    if data_dir is not None:
        return Path(data_dir).expanduser().resolve(), False
    default = DEFAULT_DIRS.get(name)
    return (default, True) if default is not None and default.is_dir() else (None, False)


def _is_hub_copy(folder: Path) -> bool:
    """Whether ``folder`` looks like a Hugging Face copy (parquet/arrow files or save_to_disk)."""
    if any((folder / marker).is_file() for marker in _HF_MARKERS):
        return True
    return any(True for pattern in ("*.parquet", "*.arrow") for _ in folder.rglob(pattern))


def _contents(folder: Path, limit: int = 6) -> str:
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    shown = ", ".join(entries[:limit]) + (f", ... ({len(entries)} entries)" if len(entries) > limit else "")
    return f"it holds {shown}" if entries else "it is empty"


def load_local_or_hub(
    source: HubSource | None, data_dir: str | None, on_disk: OnDisk, name: str, label_column: str | None = None
) -> TensorDataset:
    """``on_disk``'s files under ``data_dir`` (or the default folder), else the hub copy or the hub.

    A folder that holds neither the on-disk format nor a Hugging Face copy is one ConfigError
    naming both; the default folder must hold the on-disk format (no silent fallback)."""
    folder, is_default = _data_folder(name, data_dir)
    if folder is not None and folder.is_dir():
        if on_disk.locate(folder) is not None:
            return on_disk.read(folder)
        if is_default or source is None or not _is_hub_copy(folder):
            hub = (
                ""
                if source is None or is_default
                else " or a Hugging Face copy (parquet files or a save_to_disk folder)"
            )
            raise ConfigError(
                f"{str(folder)!r} holds no data files of dataset {name!r}: expected {on_disk.describe}{hub}; "
                f"{_contents(folder)}"
            )
    if source is None:
        reason = "no data_dir given" if folder is None else f"data_dir {str(folder)!r} is not a directory"
        raise ConfigError(
            f"dataset {name!r} is read from its IDX files, {reason}: pass --data-dir with {on_disk.describe} "
            f'(torchvision writes them: python -c "import torchvision; {on_disk.download}" '
            "on a machine with network, then --data-dir DIR)"
        )
    return load_hub_dataset(source, data_dir, label_column)


def on_disk_cache_key(name: str, on_disk: Callable[..., OnDisk]) -> Callable[..., dict[str, Any] | None]:
    """A loader's ``cache_key``: the fingerprint of the on-disk files it would read (None when it
    reads the hub: the cache key is then the options alone, as before)."""

    def cache_key(data_dir: str | None = None, **options: Any) -> dict[str, Any] | None:
        folder, _ = _data_folder(name, data_dir)
        located = on_disk(**options).locate(folder) if folder is not None and folder.is_dir() else None
        return None if located is None else {"on_disk": files.fingerprint(located)}

    return cache_key


def _option(value: str, choices: Sequence[str], what: str) -> str:
    if value not in choices:
        raise ConfigError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value


@register_dataset("mnist")
def mnist(data_dir: str | None = None) -> TensorDataset:
    """MNIST: 70,000 28×28 grayscale handwritten digits, 10 classes (IDX files or ylecun/mnist)."""
    return load_local_or_hub(MNIST, data_dir, idx_format(files.MNIST), "mnist")


@register_dataset("fashion_mnist")
def fashion_mnist(data_dir: str | None = None) -> TensorDataset:
    """Fashion-MNIST: 70,000 28×28 grayscale, 10 classes (IDX files, by default
    /usr/share/datasets/fashion-mnist if present; or zalando-datasets/fashion_mnist)."""
    return load_local_or_hub(FASHION_MNIST, data_dir, idx_format(files.FASHION_MNIST), "fashion_mnist")


@register_dataset("kmnist")
def kmnist(data_dir: str | None = None) -> TensorDataset:
    """Kuzushiji-MNIST: 70,000 28×28 grayscale cursive Japanese characters, 10 classes (IDX files)."""
    return load_local_or_hub(None, data_dir, idx_format(files.KMNIST), "kmnist")


@register_dataset("emnist")
def emnist(data_dir: str | None = None, split: str = "balanced") -> TensorDataset:
    """EMNIST (IDX files emnist-<split>-...): split=balanced (131,600 images, 47 classes), byclass
    (62), bymerge (47), letters (26; stored 1..26, read as 0..25), digits or mnist (10)."""
    return load_local_or_hub(None, data_dir, idx_format(files.emnist_layout(split)), "emnist")


@register_dataset("cifar10")
def cifar10(data_dir: str | None = None) -> TensorDataset:
    """CIFAR-10: 60,000 32×32 RGB images, 10 classes (cifar-10-batches-py or uoft-cs/cifar10)."""
    return load_local_or_hub(CIFAR10, data_dir, cifar_format(files.CIFAR10), "cifar10")


def _cifar100_format(label: str = "fine") -> OnDisk:
    _option(label, list(CIFAR100_LABELS), "cifar100 option label")
    return cifar_format(files.CIFAR100_FINE if label == "fine" else files.CIFAR100_COARSE)


@register_dataset("cifar100")
def cifar100(data_dir: str | None = None, label: str = "fine") -> TensorDataset:
    """CIFAR-100: 60,000 32×32 RGB; label="fine" (100) or "coarse" (20) (cifar-100-python or uoft-cs/cifar100)."""
    on_disk = _cifar100_format(label)
    return load_local_or_hub(CIFAR100, data_dir, on_disk, "cifar100", CIFAR100_LABELS[label])


mnist.cache_key = on_disk_cache_key("mnist", lambda: idx_format(files.MNIST))
fashion_mnist.cache_key = on_disk_cache_key("fashion_mnist", lambda: idx_format(files.FASHION_MNIST))
kmnist.cache_key = on_disk_cache_key("kmnist", lambda: idx_format(files.KMNIST))
emnist.cache_key = on_disk_cache_key("emnist", lambda split="balanced": idx_format(files.emnist_layout(split)))
cifar10.cache_key = on_disk_cache_key("cifar10", lambda: cifar_format(files.CIFAR10))
cifar100.cache_key = on_disk_cache_key("cifar100", _cifar100_format)


def _flag(value: bool | int | str, what: str) -> bool:
    """A yes/no dataset option: a bool, 1/0, or true/false, yes/no, on/off (any case)."""
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    choices = f"{' or '.join(words[0] for words in (TRUE_WORDS, FALSE_WORDS))} (or {', '.join(TRUE_WORDS[1:] + FALSE_WORDS[1:])})"
    raise ConfigError(f"{what} must be {choices}, got {value!r}")


@register_dataset("svhn")
def svhn(data_dir: str | None = None, extra: bool | int | str = False) -> TensorDataset:
    """SVHN (ufldl-stanford/svhn, config cropped_digits): 32×32 RGB house-number digits, 10 classes.

    Pools train + test (73,257 + 26,032 = 99,289 images), as the usual FL benchmarks do;
    extra=true adds the 531,131 "extra" images (630,420 in all).

    The hub dataset and a clone of it hold all three splits; Hugging Face prepares them all in its
    cache even when extra is not used (the decoded tensors, cached by pflbench, hold only those used).
    """
    include_extra = _flag(extra, "svhn option extra")
    splits, origin = hub_splits(SVHN, data_dir)
    if include_extra and SVHN_EXTRA_SPLIT not in splits:
        raise ConfigError(
            f"svhn option extra=true: {origin} has no split {SVHN_EXTRA_SPLIT!r} (its splits: {', '.join(splits)})"
        )
    chosen = {name: split for name, split in splits.items() if include_extra or name != SVHN_EXTRA_SPLIT}
    if not chosen:
        raise ConfigError(f"svhn: {origin} holds only the split {SVHN_EXTRA_SPLIT!r}; pass --dataset-option extra=true")
    return _pool(chosen, SVHN.image_column, SVHN.label_column, origin)
