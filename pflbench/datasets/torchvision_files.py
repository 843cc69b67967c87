"""The datasets' own on-disk formats, read offline and strictly: MNIST-family IDX files and CIFAR
python pickles, as the original distributions and torchvision's dataset folders hold them.

* **IDX** (MNIST, Fashion-MNIST, KMNIST, EMNIST), plain or ``.gz``: a big-endian magic number
  ``0x0000080D`` (unsigned bytes, D dimensions), D sizes, then the bytes. Every file is checked:
  magic number, dimensions, and that its size is exactly header + product of the sizes (a
  truncated file is refused, not read short); images and labels must agree in count.
  ``train-images-idx3-ubyte`` / ``train-labels-idx1-ubyte`` / ``t10k-...`` (EMNIST:
  ``emnist-<split>-train-images-idx3-ubyte`` ... ``emnist-<split>-test-...``).
* **CIFAR python** (``cifar-10-batches-py``: ``data_batch_1..5``, ``test_batch``,
  ``batches.meta``; ``cifar-100-python``: ``train``, ``test``, ``meta``): Python 2 pickles of
  dicts with byte-string keys (``b'data'`` uint8 [N, 3072], ``b'labels'`` or ``b'fine_labels'`` /
  ``b'coarse_labels'``). They are loaded by an unpickler that rebuilds only builtin containers,
  bytes, numbers and numpy arrays (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``,
  ``numpy.dtype``); any other global is refused, so a hostile file cannot run code.

Where: ``find_idx`` / ``find_cifar`` look in the given folder and in torchvision's layout under
it (``<root>/FashionMNIST/raw``, ``<root>/cifar-10-batches-py``, ...), by the file names alone;
``None`` means the folder holds none of the format's files (another format: the caller decides).
The train and test splits are pooled in that order (as the hub loaders pool theirs). Images come
out as uint8 [N, C, H, W] without any copy beyond the pooling; EMNIST's images are returned as
stored, like torchvision's reader does (transposed relative to MNIST's).
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflbench.data.dataset import TensorDataset
from pflbench.errors import ConfigError

_UBYTE = 0x08  # IDX type code of unsigned bytes, the only one the MNIST family uses
_DIGITS = [str(d) for d in range(10)]
_LOWER = [chr(c) for c in range(ord("a"), ord("z") + 1)]
_UPPER = [c.upper() for c in _LOWER]


# ----------------------------------------------------------------------------- IDX


@dataclass(frozen=True)
class IdxLayout:
    """One IDX dataset: its name, torchvision folder name and its four files' stems."""

    title: str  # for messages, e.g. "Fashion-MNIST"
    torchvision: str  # torchvision's folder under the root, e.g. "FashionMNIST"
    train: str  # file stem prefix of the train split, e.g. "train" → train-images-idx3-ubyte
    test: str
    classes: tuple[str, ...]
    label_offset: int = 0  # subtracted from the stored labels (EMNIST letters: 1..26 → 0..25)
    download_options: str = ""  # torchvision's constructor's further arguments (EMNIST: its split)

    def stems(self) -> dict[tuple[str, str], str]:
        """(split, part) → file name without ``.gz``."""
        return {
            (split, part): f"{prefix}-{part}-idx{3 if part == 'images' else 1}-ubyte"
            for split, prefix in (("train", self.train), ("test", self.test))
            for part in ("images", "labels")
        }


MNIST = IdxLayout("MNIST", "MNIST", "train", "t10k", tuple(_DIGITS))
FASHION_MNIST = IdxLayout(
    "Fashion-MNIST",
    "FashionMNIST",
    "train",
    "t10k",
    ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
)
KMNIST = IdxLayout("KMNIST", "KMNIST", "train", "t10k", ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"))
_MERGED = _DIGITS + _UPPER + list("abdefghnqrt")  # bymerge/balanced: 15 lowercase letters kept
EMNIST_CLASSES = {
    "byclass": _DIGITS + _UPPER + _LOWER,
    "bymerge": _MERGED,
    "balanced": _MERGED,
    "letters": _LOWER,  # stored as 1..26 (case merged): shifted to 0..25
    "digits": _DIGITS,
    "mnist": _DIGITS,
}


def emnist_layout(split: str) -> IdxLayout:
    """The files of EMNIST split ``split`` (torchvision's ``emnist-<split>-train-...``)."""
    if split not in EMNIST_CLASSES:
        raise ConfigError(f"emnist option split must be one of {', '.join(EMNIST_CLASSES)}, got {split!r}")
    return IdxLayout(
        f"EMNIST ({split})",
        "EMNIST",
        f"emnist-{split}-train",
        f"emnist-{split}-test",
        tuple(EMNIST_CLASSES[split]),
        label_offset=1 if split == "letters" else 0,
        download_options=f", split={split!r}",
    )


def _read_file(path: Path) -> bytes:
    """The file's bytes, gunzipped if it ends in ``.gz``; ConfigError if it cannot be read."""
    try:
        if path.suffix != ".gz":
            return path.read_bytes()
        with gzip.open(path, "rb") as handle:
            return handle.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ConfigError(f"{str(path)!r} is not a complete gzip file ({error})") from error
    except OSError as error:
        raise ConfigError(f"cannot read {str(path)!r}: {error.strerror or error}") from error


def parse_idx(raw: bytes, ndim: int, where: str) -> np.ndarray:
    """An IDX file's bytes → uint8 array of ``ndim`` dimensions (a view of ``raw``, read-only).

    ConfigError naming ``where`` and what was expected on a wrong magic number or a size that is
    not exactly header + product of the dimensions.
    """
    expected_magic = (_UBYTE << 8) | ndim
    kind = "images (idx3, unsigned bytes)" if ndim == 3 else f"{ndim}-dimensional unsigned bytes (idx{ndim})"
    if len(raw) < 4:
        raise ConfigError(f"{where} is truncated: {len(raw)} bytes, not even an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        raise ConfigError(
            f"{where} has magic number 0x{magic:08X}, expected 0x{expected_magic:08X} (IDX {kind}); "
            "it is not an IDX file of this kind"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(f"{where} is truncated: {len(raw)} bytes, shorter than its {header}-byte IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        shape = "×".join(str(d) for d in dims)
        state = "truncated" if len(raw) < expected else "longer than its header says"
        raise ConfigError(
            f"{where} is {state}: {len(raw)} bytes, expected {expected} ({header}-byte header + {shape} bytes)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """The IDX file ``path`` (plain or ``.gz``) as a uint8 array (see ``parse_idx``)."""
    return parse_idx(_read_file(path), ndim, repr(str(path)))


def _idx_folders(root: Path, layout: IdxLayout) -> list[Path]:
    """Where a layout's files may be: the folder itself, torchvision's ``<root>/<Name>/raw``,
    ``<root>/raw`` (the dataset folder of a torchvision root) and ``<root>/<Name>``."""
    return [root, root / layout.torchvision / "raw", root / "raw", root / layout.torchvision]


def _present(folder: Path, stem: str) -> Path | None:
    """``stem`` or ``stem.gz`` in ``folder`` (the plain file first: torchvision keeps both)."""
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def find_idx(root: Path, layout: IdxLayout) -> dict[tuple[str, str], Path] | None:
    """The four IDX files of ``layout`` under ``root`` ((split, part) → path), from the first
    folder of ``_idx_folders`` that holds any of them; None if none does. ConfigError if that
    folder lacks one of the four."""
    stems = layout.stems()
    for folder in _idx_folders(root, layout):
        found = {key: _present(folder, stem) for key, stem in stems.items()}
        if any(path is not None for path in found.values()):
            missing = [stems[key] for key, path in found.items() if path is None]
            if missing:
                raise ConfigError(
                    f"{str(folder)!r} holds {layout.title} IDX files but not {missing[0]} (or {missing[0]}.gz); "
                    f"expected all four: {', '.join(stems.values())}"
                )
            return {key: path for key, path in found.items() if path is not None}
    return None


def load_idx(files: dict[tuple[str, str], Path], layout: IdxLayout) -> TensorDataset:
    """The train and test splits of ``files`` (from ``find_idx``) pooled: uint8 [N, 1, H, W]."""
    images, labels, sizes = [], [], {}
    for split in ("train", "test"):
        image_file, label_file = files[(split, "images")], files[(split, "labels")]
        split_images, split_labels = read_idx(image_file, 3), read_idx(label_file, 1)
        if len(split_images) != len(split_labels):
            raise ConfigError(
                f"{str(label_file)!r} holds {len(split_labels)} labels, expected {len(split_images)} "
                f"(one per image of {str(image_file)!r})"
            )
        if images and split_images.shape[1:] != images[0].shape[1:]:
            raise ConfigError(
                f"{str(image_file)!r} holds {split_images.shape[1]}×{split_images.shape[2]} images, "
                f"expected {images[0].shape[1]}×{images[0].shape[2]} like the train split"
            )
        images.append(split_images)
        labels.append(split_labels)
        sizes[split] = len(split_images)
    pooled = torch.from_numpy(np.concatenate(images)).unsqueeze(1)  # a fresh, writable array
    targets = np.concatenate(labels).astype(np.int64) - layout.label_offset
    _check_labels(targets, len(layout.classes), [str(files[(s, "labels")]) for s in ("train", "test")])
    folder = files[("train", "images")].parent
    return TensorDataset(
        inputs=pooled,
        labels=torch.from_numpy(targets),
        num_classes=len(layout.classes),
        source=f"{layout.title} IDX files in {folder}, splits pooled (train: {sizes['train']}, test: {sizes['test']})",
        info={"splits": sizes, "format": "idx", "classes": list(layout.classes)},
    )


def _check_labels(labels: np.ndarray, num_classes: int, files: Sequence[str]) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            f"labels in {' / '.join(repr(f) for f in files)} must lie in 0..{num_classes - 1}, "
            f"found {labels.min()}..{labels.max()}"
        )


# ----------------------------------------------------------------------------- CIFAR pickles


def _numpy_reconstruct() -> Any:
    core = getattr(np, "_core", None)  # numpy ≥ 2; numpy.core is its deprecated alias
    return (core if core is not None else np.core).multiarray._reconstruct


class _CifarUnpickler(pickle.Unpickler):
    """Rebuilds builtin containers, bytes, numbers and numpy arrays; refuses every other global."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
    }

    def find_class(self, module: str, name: str) -> Any:
        allowed = self._ALLOWED.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR file never holds")
        return allowed()


def load_cifar_pickle(path: Path) -> dict[str, Any]:
    """A CIFAR python file as a dict with str keys; ConfigError naming the file if it is not one."""
    raw = _read_file(path)
    try:
        loaded = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        reason = " ".join(str(error).split())[:160] or type(error).__name__
        raise ConfigError(f"{str(path)!r} is not a CIFAR python pickle (refused: {reason})") from error
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{str(path)!r} is not a CIFAR python pickle (expected a dict, found {type(loaded).__name__})"
        )
    return {key.decode("latin1") if isinstance(key, bytes) else str(key): value for key, value in loaded.items()}


@dataclass(frozen=True)
class CifarLayout:
    title: str
    folder: str  # torchvision's folder under the root
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    num_classes: int
    label_key: str
    names_key: str  # the class names' key in the meta file


CIFAR10 = CifarLayout(
    "CIFAR-10",
    "cifar-10-batches-py",
    tuple(f"data_batch_{i}" for i in range(1, 6)),
    ("test_batch",),
    "batches.meta",
    10,
    "labels",
    "label_names",
)
CIFAR100_FINE = CifarLayout(
    "CIFAR-100", "cifar-100-python", ("train",), ("test",), "meta", 100, "fine_labels", "fine_label_names"
)
CIFAR100_COARSE = CifarLayout(
    "CIFAR-100 (coarse labels)",
    "cifar-100-python",
    ("train",),
    ("test",),
    "meta",
    20,
    "coarse_labels",
    "coarse_label_names",
)


def find_cifar(root: Path, layout: CifarLayout) -> Path | None:
    """The folder holding ``layout``'s files: ``root`` or ``root/<cifar-...>``; None if neither
    holds any of them. ConfigError if that folder lacks one of them."""
    names = (*layout.train, *layout.test, layout.meta)
    for folder in (root, root / layout.folder):
        present = [name for name in names if (folder / name).is_file()]
        if present:
            missing = [name for name in names if name not in present]
            if missing:
                raise ConfigError(
                    f"{str(folder)!r} holds {layout.title} python files but not {missing[0]!r}; "
                    f"expected all of: {', '.join(names)}"
                )
            return folder
    return None


def _cifar_batch(path: Path, layout: CifarLayout) -> tuple[np.ndarray, np.ndarray]:
    """One batch file's images (uint8 [N, 3, 32, 32]) and labels, checked."""
    batch = load_cifar_pickle(path)
    data, labels = batch.get("data"), batch.get(layout.label_key)
    if not isinstance(data, np.ndarray) or labels is None:
        raise ConfigError(
            f"{str(path)!r} is not a {layout.title} batch: expected keys b'data' (a numpy array) and "
            f"b'{layout.label_key}', found {', '.join(sorted(batch))}"
        )
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ConfigError(
            f"{str(path)!r}: b'data' is {data.dtype} {list(data.shape)}, expected uint8 [N, 3072] (32×32 RGB rows)"
        )
    targets = np.asarray(labels)
    if targets.ndim != 1 or len(targets) != len(data) or not np.issubdtype(targets.dtype, np.integer):
        raise ConfigError(
            f"{str(path)!r}: b'{layout.label_key}' holds {targets.size} values of type {targets.dtype}, "
            f"expected {len(data)} integer labels (one per row of b'data')"
        )
    return data.reshape(-1, 3, 32, 32), targets.astype(np.int64)


def load_cifar(folder: Path, layout: CifarLayout) -> TensorDataset:
    """The train and test files of ``folder`` (from ``find_cifar``) pooled: uint8 [N, 3, 32, 32]."""
    meta = load_cifar_pickle(folder / layout.meta)
    names = meta.get(layout.names_key)
    if not isinstance(names, list) or len(names) != layout.num_classes:
        raise ConfigError(
            f"{str(folder / layout.meta)!r}: expected b'{layout.names_key}', a list of {layout.num_classes} class names"
        )
    images, labels, sizes = [], [], {}
    for split, files in (("train", layout.train), ("test", layout.test)):
        sizes[split] = 0
        for name in files:
            data, targets = _cifar_batch(folder / name, layout)
            _check_labels(targets, layout.num_classes, [str(folder / name)])
            images.append(data)
            labels.append(targets)
            sizes[split] += len(data)
    return TensorDataset(
        inputs=torch.from_numpy(np.concatenate(images)),
        labels=torch.from_numpy(np.concatenate(labels)),
        num_classes=layout.num_classes,
        source=f"{layout.title} python files in {folder}, splits pooled (train: {sizes['train']}, test: {sizes['test']})",
        info={
            "splits": sizes,
            "format": "cifar-python",
            "label_column": layout.label_key,
            "classes": [n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names],
        },
    )


# ----------------------------------------------------------------------------- cache keys


def fingerprint(files: Sequence[Path]) -> list[list[Any]]:
    """Each file's resolved path, size and mtime_ns: what a cached conversion depends on."""
    listing = []
    for file in sorted(files):
        stat = file.stat()
        listing.append([str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    return listing
