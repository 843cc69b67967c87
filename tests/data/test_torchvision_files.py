"""The datasets' own on-disk formats (``pflbench.datasets.torchvision_files``): MNIST-family IDX
files (plain and .gz, flat or in torchvision's ``<root>/<Name>/raw``) and CIFAR's python pickles
(``cifar-10-batches-py``, ``cifar-100-python``), written here byte for byte in those formats
(the CIFAR files as Python 2 pickles, as distributed); plus the real Fashion-MNIST when installed.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.data.dataset import load_dataset
from pflbench.datasets import hub
from pflbench.datasets import torchvision_files as files
from pflbench.errors import ConfigError
from pflbench.testing import assert_refused

pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/data/conftest.py
REAL_FMNIST = Path("/usr/share/datasets/fashion-mnist")


# ----------------------------------------------------------------------------- writers


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic 0x00 0x00 0x08 ndim, big-endian sizes, bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def write_idx_dataset(
    folder: Path,
    sizes: tuple[int, int] = (30, 12),
    gz: bool = False,
    train: str = "train",
    test: str = "t10k",
    classes: int = 10,
    first_label: int = 0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Four IDX files of 28×28 images; returns the pooled (train then test) images and labels."""
    rng = np.random.default_rng(seed)
    suffix = ".gz" if gz else ""
    images, labels = [], []
    for prefix, n in ((train, sizes[0]), (test, sizes[1])):
        split_images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        split_labels = (np.arange(n) % classes + first_label).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", split_images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", split_labels)
        images.append(split_images)
        labels.append(split_labels)
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)


class Py2Pickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Pickles bytes as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING), as CIFAR's files do."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_bytes(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes


def py2_pickle(obj: object) -> bytes:
    """``obj`` as CIFAR's Python 2 files hold it: protocol 2, bytes keys, numpy.core globals."""
    import io

    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def write_cifar10(folder: Path, per_batch: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        batch_labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        names = [f"img_{i}.png".encode() for i in range(per_batch)]
        batch = {b"batch_label": name.encode(), b"labels": batch_labels, b"data": data, b"filenames": names}
        (folder / name).write_bytes(py2_pickle(batch))
        images.append(data.reshape(-1, 3, 32, 32))
        labels.append(batch_labels)
    meta = {
        b"label_names": [f"class{i}".encode() for i in range(10)],
        b"num_cases_per_batch": per_batch,
        b"num_vis": 3072,
    }
    (folder / "batches.meta").write_bytes(py2_pickle(meta))
    return np.concatenate(images), np.concatenate(labels)


def write_cifar100(folder: Path, sizes: tuple[int, int] = (10, 4), seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, list] = {"images": [], "fine": [], "coarse": []}
    for name, n in (("train", sizes[0]), ("test", sizes[1])):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, n)]
        coarse = [f // 5 for f in fine]
        batch = {
            b"filenames": [b"x.png"] * n,
            b"batch_label": name.encode(),
            b"fine_labels": fine,
            b"coarse_labels": coarse,
            b"data": data,
        }
        (folder / name).write_bytes(py2_pickle(batch))
        written["images"].append(data.reshape(-1, 3, 32, 32))
        written["fine"].append(fine)
        written["coarse"].append(coarse)
    meta = {
        b"fine_label_names": [f"f{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"c{i}".encode() for i in range(20)],
    }
    (folder / "meta").write_bytes(py2_pickle(meta))
    return {key: np.concatenate(values) for key, values in written.items()}


# ----------------------------------------------------------------------------- IDX


def test_parse_idx_by_hand() -> None:
    raw = bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6])  # 2×1×3 images
    assert files.parse_idx(raw, 3, "x").tolist() == [[[1, 2, 3]], [[4, 5, 6]]]
    assert files.parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 2, 7, 9]), 1, "y").tolist() == [7, 9]
    with pytest.raises(ConfigError, match=r"x has magic number 0x00000801, expected 0x00000803"):
        files.parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 2, 7, 9]), 3, "x")
    with pytest.raises(ConfigError, match=r"x is truncated: 21 bytes, expected 22 \(16-byte header \+ 2×1×3 bytes\)"):
        files.parse_idx(raw[:-1], 3, "x")
    with pytest.raises(ConfigError, match="longer than its header says"):
        files.parse_idx(raw + b"\0", 3, "x")


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["flat", "torchvision root", "raw folder's parent"])
def test_fashion_mnist_idx_layouts(tmp_path: Path, gz: bool, layout: str) -> None:
    folder = {
        "flat": tmp_path,
        "torchvision root": tmp_path / "FashionMNIST" / "raw",
        "raw folder's parent": tmp_path / "raw",
    }[layout]
    images, labels = write_idx_dataset(folder, gz=gz)
    data = load_dataset("fashion_mnist", {"data_dir": str(tmp_path)})
    assert data.inputs.dtype == torch.uint8 and data.inputs.shape == (42, 1, 28, 28)
    assert torch.equal(data.inputs[:, 0], torch.from_numpy(images))
    assert data.labels.tolist() == labels.tolist() and data.num_classes == 10
    assert data.info["splits"] == {"train": 30, "test": 12} and data.info["classes"][0] == "T-shirt/top"
    assert "Fashion-MNIST IDX files" in data.source


def test_plain_file_preferred_when_torchvision_keeps_both(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    images, _ = write_idx_dataset(raw, gz=True, seed=1)
    plain, _ = write_idx_dataset(raw, gz=False, seed=2)
    data = load_dataset("mnist", {"data_dir": str(tmp_path)})
    assert torch.equal(data.inputs[:, 0], torch.from_numpy(plain))


def test_kmnist_and_emnist_splits(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path / "KMNIST" / "raw", gz=True)
    assert load_dataset("kmnist", {"data_dir": str(tmp_path)}).info["classes"][:2] == ["o", "ki"]
    raw = tmp_path / "EMNIST" / "raw"
    write_idx_dataset(raw, train="emnist-balanced-train", test="emnist-balanced-test", classes=47)
    _, letters = write_idx_dataset(
        raw, train="emnist-letters-train", test="emnist-letters-test", classes=26, first_label=1
    )
    balanced = load_dataset("emnist", {"data_dir": str(tmp_path), "split": "balanced"})
    assert balanced.num_classes == 47 and balanced.labels.max() == 29 and balanced.info["classes"][36] == "a"
    read = load_dataset("emnist", {"data_dir": str(raw), "split": "letters"})
    assert read.num_classes == 26 and read.labels.tolist() == (letters - 1).tolist()  # stored 1..26
    with pytest.raises(ConfigError, match="split must be one of byclass, bymerge, balanced, letters, digits, mnist"):
        load_dataset("emnist", {"data_dir": str(raw), "split": "bal"})
    with pytest.raises(ConfigError, match="emnist-digits-train-images-idx3-ubyte"):
        load_dataset("emnist", {"data_dir": str(raw), "split": "digits"})


def test_default_folder_read_without_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images, _ = write_idx_dataset(tmp_path / "fmnist", gz=True)
    monkeypatch.setitem(hub.DEFAULT_DIRS, "fashion_mnist", tmp_path / "fmnist")
    assert torch.equal(load_dataset("fashion_mnist").inputs[:, 0], torch.from_numpy(images))
    monkeypatch.setitem(hub.DEFAULT_DIRS, "fashion_mnist", tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty' holds no data files of dataset 'fashion_mnist'"):
        load_dataset("fashion_mnist")


def test_cache_follows_the_files(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, seed=0)
    first = load_dataset("mnist", {"data_dir": str(tmp_path)})
    images, _ = write_idx_dataset(tmp_path, seed=5)  # rewritten: a new fingerprint, not the stale entry
    os.utime(tmp_path / "train-images-idx3-ubyte", ns=(1, 1))
    second = load_dataset("mnist", {"data_dir": str(tmp_path)})
    assert not torch.equal(first.inputs, second.inputs)
    assert torch.equal(second.inputs[:, 0], torch.from_numpy(images))


# ----------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("below_root", [True, False])
def test_cifar10_python_batches(tmp_path: Path, below_root: bool) -> None:
    images, labels = write_cifar10(tmp_path / "cifar-10-batches-py")
    root = tmp_path if below_root else tmp_path / "cifar-10-batches-py"
    data = load_dataset("cifar10", {"data_dir": str(root)})
    assert data.inputs.shape == (48, 3, 32, 32) and torch.equal(data.inputs, torch.from_numpy(images))
    assert data.labels.tolist() == labels.tolist() and data.num_classes == 10
    assert data.info["splits"] == {"train": 40, "test": 8} and data.info["classes"][3] == "class3"
    # the red plane of pixel (0, 1) of image 0 is byte 1 of row 0; its green plane starts at 1024
    first_row = images.reshape(48, 3072)[0]
    assert data.inputs[0, 0, 0, 1] == first_row[1] and data.inputs[0, 1, 0, 0] == first_row[1024]


def test_cifar100_fine_and_coarse(tmp_path: Path) -> None:
    written = write_cifar100(tmp_path / "cifar-100-python")
    fine = load_dataset("cifar100", {"data_dir": str(tmp_path)})
    coarse = load_dataset("cifar100", {"data_dir": str(tmp_path), "label": "coarse"})
    assert torch.equal(fine.inputs, torch.from_numpy(written["images"])) and torch.equal(coarse.inputs, fine.inputs)
    assert fine.labels.tolist() == written["fine"].tolist() and fine.num_classes == 100
    assert coarse.labels.tolist() == written["coarse"].tolist() and coarse.num_classes == 20
    assert coarse.info["classes"][:2] == ["c0", "c1"]


class _Payload:
    def __reduce__(self) -> tuple:
        return (os.system, ("touch PWNED",))


def test_cifar_pickle_with_other_globals_is_refused_unrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_cifar10(tmp_path / "c")
    (tmp_path / "c" / "data_batch_3").write_bytes(pickle.dumps({b"data": _Payload()}, protocol=4))
    with pytest.raises(ConfigError, match=r"data_batch_3' is not a CIFAR python pickle \(refused: .*system"):
        load_dataset("cifar10", {"data_dir": str(tmp_path / "c")})
    assert not (tmp_path / "PWNED").exists()


# ----------------------------------------------------------------------------- the CLI


def _run(data_dir: Path, dataset: str, out: Path, *extra: str) -> object:
    args = ["run", "--dataset", dataset, "--data-dir", str(data_dir), "--model", "mlp", "--partition", "iid"]
    args += ["--num-clients", "2", "--rounds", "1", "--out", str(out), "--quiet", *extra]
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize("fmt", ["idx", "idx.gz", "torchvision raw", "cifar-10-batches-py", "cifar-100-python"])
def test_cli_runs_each_format(tmp_path: Path, fmt: str) -> None:
    data = tmp_path / "data"
    dataset = {"cifar-10-batches-py": "cifar10", "cifar-100-python": "cifar100"}.get(fmt, "fashion_mnist")
    if fmt == "cifar-10-batches-py":
        write_cifar10(data / fmt)
    elif fmt == "cifar-100-python":
        write_cifar100(data / fmt, sizes=(40, 16))
    else:
        write_idx_dataset(data / "FashionMNIST" / "raw" if fmt == "torchvision raw" else data, gz=fmt == "idx.gz")
    result = _run(data, dataset, tmp_path / "out")
    assert result.exit_code == 0, result.output
    (run,) = (tmp_path / "out" / "runs").iterdir()
    assert (run / "rounds.jsonl").read_text().count("\n") >= 1


def _truncated(folder: Path) -> str:
    write_idx_dataset(folder, gz=True)
    target = folder / "t10k-images-idx3-ubyte.gz"
    target.write_bytes(gzip.compress(gzip.decompress(target.read_bytes())[:-28]))
    return "t10k-images-idx3-ubyte.gz' is truncated: 9396 bytes, expected 9424 (16-byte header + 12×28×28 bytes)"


def _bad_magic(folder: Path) -> str:
    write_idx_dataset(folder)
    target = folder / "train-labels-idx1-ubyte"
    target.write_bytes(b"\0\0\x08\x03" + target.read_bytes()[4:])
    return "train-labels-idx1-ubyte' has magic number 0x00000803, expected 0x00000801"


def _count_mismatch(folder: Path) -> str:
    write_idx_dataset(folder)
    write_idx(folder / "t10k-labels-idx1-ubyte", np.zeros(11, dtype=np.uint8))
    return "t10k-labels-idx1-ubyte' holds 11 labels, expected 12"


def _missing_file(folder: Path) -> str:
    write_idx_dataset(folder)
    (folder / "t10k-labels-idx1-ubyte").unlink()
    return "holds Fashion-MNIST IDX files but not t10k-labels-idx1-ubyte"


def _other_format(folder: Path) -> str:
    write_cifar10(folder)
    return (
        "holds no data files of dataset 'fashion_mnist': expected Fashion-MNIST IDX files train-images-idx3-ubyte[.gz]"
    )


def _cifar_count_mismatch(folder: Path) -> str:
    write_cifar10(folder)
    (folder / "test_batch").write_bytes(py2_pickle({b"data": np.zeros((3, 3072), np.uint8), b"labels": [1, 2]}))
    return "test_batch': b'labels' holds 2 values of type int64, expected 3 integer labels"


@pytest.mark.parametrize(
    ("make", "dataset"),
    [
        (_truncated, "fashion_mnist"),
        (_bad_magic, "fashion_mnist"),
        (_count_mismatch, "fashion_mnist"),
        (_missing_file, "fashion_mnist"),
        (_other_format, "fashion_mnist"),
        (_cifar_count_mismatch, "cifar10"),
    ],
)
def test_bad_files_are_one_error_line_and_nothing_written(tmp_path: Path, make: object, dataset: str) -> None:
    expected = make(tmp_path / "data")  # type: ignore[operator]
    assert_refused(_run(tmp_path / "data", dataset, tmp_path / "out"), tmp_path / "out", expected)


# ----------------------------------------------------------------------------- the real data


@pytest.mark.skipif(not REAL_FMNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_real_fashion_mnist() -> None:
    data = load_dataset("fashion_mnist")  # no data_dir: /usr/share/datasets/fashion-mnist
    assert data.inputs.shape == (70000, 1, 28, 28) and data.inputs.dtype == torch.uint8
    assert data.info["splits"] == {"train": 60000, "test": 10000}
    assert torch.bincount(data.labels, minlength=10).tolist() == [7000] * 10
    assert torch.bincount(data.labels[:60000], minlength=10).tolist() == [6000] * 10
    assert data.labels[0] == 9 and data.labels[60000] == 9  # the first train and test images: ankle boots
    assert str(REAL_FMNIST) in data.source


def test_idx_only_datasets_say_how_to_get_the_files() -> None:
    with pytest.raises(ConfigError, match=r"no data_dir given: .*EMNIST\('DIR', split='letters', download=True\)"):
        load_dataset("emnist", {"split": "letters"})
