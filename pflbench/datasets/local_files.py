"""Local data: class sub-folders of images (``imagefolder``) and parquet tables (``parquet``).

Both take the location as ``path``; ``data_dir`` (what ``--data-dir`` passes) is accepted as the
same thing. Neither touches the network or the Hugging Face cache; Hugging Face ``datasets`` is
imported only to read a label column's ``ClassLabel`` feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

from pflbench.data.dataset import TensorDataset
from pflbench.datasets.hub import decode_images, image_sources, label_info, reject_lfs_pointers, require_columns
from pflbench.errors import ConfigError
from pflbench.registry import register_dataset


def _resolve_path(name: str, path: str | None, data_dir: str | None) -> Path:
    """The one location given as ``path`` or ``data_dir``; ConfigError if absent or missing."""
    if path is not None and data_dir is not None and Path(path) != Path(data_dir):
        raise ConfigError(f"dataset {name!r}: give path or data_dir, not both (got {path!r} and {data_dir!r})")
    given = path if path is not None else data_dir
    if given is None:
        raise ConfigError(f"dataset {name!r} needs a location: --dataset-option path=PATH (or --data-dir PATH)")
    resolved = Path(given).expanduser().resolve()
    if not resolved.exists():
        raise ConfigError(f"dataset {name!r}: path {str(resolved)!r} does not exist")
    return resolved


def files_fingerprint(root: Path) -> dict[str, Any]:
    """The cache key of local data: resolved path + every file's relative name, size, mtime_ns.

    Another folder reached by the same relative name, or a file added, removed, rewritten or
    touched, gives another key, so a stale conversion is never served.
    """
    files = [root] if root.is_file() else sorted(file for file in root.rglob("*") if file.is_file())
    listing = []
    for file in files:
        stat = file.stat()
        name = file.name if file == root else file.relative_to(root).as_posix()
        listing.append([name, stat.st_size, stat.st_mtime_ns])
    return {"root": str(root), "files": listing}


def _fingerprint_of(name: str) -> Any:
    def cache_key(path: str | None = None, data_dir: str | None = None, **_: Any) -> dict[str, Any]:
        return files_fingerprint(_resolve_path(name, path, data_dir))

    return cache_key


def _parse_size(size: int | str | None) -> tuple[int, int] | None:
    """``32`` or ``"32"`` → (32, 32); ``"28x32"`` → (28, 32) as (height, width)."""
    if size is None:
        return None
    try:
        dims = tuple(int(d) for d in str(size).lower().split("x"))
    except ValueError:
        dims = ()
    dims = dims * 2 if len(dims) == 1 else dims
    if len(dims) != 2 or min(dims) < 1:
        raise ConfigError(f"size {size!r} is not N or HxW (e.g. 32 or 28x28)")
    return dims  # type: ignore[return-value]


# ----------------------------------------------------------------------------- imagefolder


def _class_images(root: Path) -> tuple[list[str], list[Path], list[int]]:
    """Sorted class folder names, and every image file under them with its class index."""
    extensions = set(Image.registered_extensions())
    classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = sorted(
            file for file in (root / name).rglob("*") if file.suffix.lower() in extensions and file.is_file()
        )
        files += found
        labels += [label] * len(found)
    return classes, files, labels


@register_dataset("imagefolder")
def imagefolder(path: str | None = None, data_dir: str | None = None, size: int | str | None = None) -> TensorDataset:
    """Images in ``path/<class>/...``; classes sorted by folder name are labels 0..K-1.

    ``size`` (N or HxW) resizes every image; without it all images must share one size.
    """
    root = _resolve_path("imagefolder", path, data_dir)
    if not root.is_dir():
        raise ConfigError(f"imagefolder path {str(root)!r} is not a directory")
    classes, files, labels = _class_images(root)
    if not files:
        raise ConfigError(
            f"imagefolder {str(root)!r} has no images in class sub-folders (expected PATH/<class name>/<image file>)"
        )
    images = decode_images([str(file) for file in files], _parse_size(size))
    return TensorDataset(
        inputs=images,
        labels=torch.tensor(labels, dtype=torch.int64),
        num_classes=len(classes),
        source=f"image folder {root} ({len(files)} images, {len(classes)} classes)",
        info={"classes": classes},
    )


imagefolder.cache_key = _fingerprint_of("imagefolder")


# ----------------------------------------------------------------------------- parquet


def _read_parquet(root: Path) -> tuple[pa.Table, int]:
    """One table from a parquet file or every ``*.parquet`` under a folder, and the file count."""
    files = [root] if root.is_file() else sorted(root.rglob("*.parquet"))
    if not files:
        raise ConfigError(f"parquet path {str(root)!r} holds no .parquet files")
    reject_lfs_pointers(files)
    try:
        return pa.concat_tables([pq.read_table(file) for file in files]), len(files)
    except pa.ArrowInvalid as error:
        raise ConfigError(f"parquet files under {str(root)!r} cannot be read as one table: {error}") from error


def _labels(table: pa.Table, column: str) -> tuple[np.ndarray, int, list[str] | None]:
    """Integer labels, class count and class names; string labels become sorted class indices."""
    values = table[column]
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        names, codes = np.unique(np.asarray(values.to_pylist(), dtype=str), return_inverse=True)
        return codes.astype(np.int64), len(names), names.tolist()
    if not pa.types.is_integer(values.type) or values.null_count:
        raise ConfigError(f"label column {column!r} must hold integers or strings without nulls, found {values.type}")
    import datasets

    labels = values.to_numpy().astype(np.int64)
    feature = datasets.Features.from_arrow_schema(table.schema).get(column)
    return (labels, *label_info(feature, labels, column))


def _feature_names(table: pa.Table, requested: str | Sequence[str] | None, exclude: set[str]) -> list[str]:
    if requested is None:
        return [
            field.name
            for field in table.schema
            if field.name not in exclude and (pa.types.is_integer(field.type) or pa.types.is_floating(field.type))
        ]
    if isinstance(requested, str):
        return [name.strip() for name in requested.split(",") if name.strip()]
    return list(requested)


def _features(table: pa.Table, names: list[str], where: str) -> torch.Tensor:
    """Numeric columns ``names`` → float32 [N, D]."""
    if not names:
        raise ConfigError(
            f"{where} has neither the image column nor numeric feature columns; "
            f"its columns: {', '.join(table.column_names)}"
        )
    require_columns(table.column_names, names, where)
    for name in names:
        column = table[name]
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        if not numeric or column.null_count:
            raise ConfigError(f"feature column {name!r} must be numeric without nulls, found {column.type}")
    matrix = np.column_stack([table[name].to_numpy() for name in names]).astype(np.float32)
    return torch.from_numpy(matrix)


@register_dataset("parquet")
def parquet(
    path: str | None = None,
    data_dir: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    feature_columns: str | Sequence[str] | None = None,
    group_column: str | None = None,
    size: int | str | None = None,
) -> TensorDataset:
    """A parquet file or folder of them (all pooled): images or a numeric feature table.

    With ``image_column`` present (Hugging Face Image structs {bytes, path}) and no
    ``feature_columns``, inputs are uint8 images (``size`` resizes, N or HxW); otherwise
    ``feature_columns`` (comma-separated; default all other numeric columns) give float32
    [N, D] features. ``group_column`` (e.g. FEMNIST ``writer_id``) gives natural client ids.
    """
    root = _resolve_path("parquet", path, data_dir)
    table, num_files = _read_parquet(root)
    where = f"parquet {str(root)!r}"
    require_columns(table.column_names, [label_column, *([group_column] if group_column else [])], where)
    labels, num_classes, names = _labels(table, label_column)
    info: dict[str, Any] = {"files": num_files}
    if feature_columns is None and image_column in table.column_names:
        inputs = decode_images(image_sources(table[image_column], image_column), _parse_size(size))
    else:
        columns = _feature_names(table, feature_columns, {label_column, group_column})
        inputs = _features(table, columns, where)
        info["feature_columns"] = columns
    if names is not None:
        info["classes"] = names
    groups = np.asarray(table[group_column].to_pylist()) if group_column else None
    return TensorDataset(
        inputs=inputs,
        labels=torch.from_numpy(labels),
        num_classes=num_classes,
        source=f"parquet {root} ({table.num_rows} rows from {num_files} file(s))",
        groups=groups,
        info=info,
    )


parquet.cache_key = _fingerprint_of("parquet")
