"""PFLlib dataset folders (``--dataset pfllib --data-dir DIR``): ``config.json``,
``train/<i>.npz``, ``test/<i>.npz``, read with an unpickler that only rebuilds numpy arrays.

The clients' own train/test split becomes the run's partition under ``--partition natural``
(``data.partition.preset_partition``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from pflbench.errors import ConfigError


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
