"""Hub datasets (mnist, fashion_mnist, cifar10, cifar100) and local files (imagefolder, parquet).

Everything runs offline on tiny generated files with the hub datasets' real schemas, laid out
like the hub repositories, loaded through ``pflbench.data.dataset.load_dataset``.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image as PILImage

import datasets
from datasets import ClassLabel, Dataset, Features, Image, Value
from pflbench.data.dataset import load_dataset
from pflbench.errors import ConfigError

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_README = """---
configs:
- config_name: plain_text
  data_files:
  - split: train
    path: plain_text/train-*
  - split: test
    path: plain_text/test-*
---
"""


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/data/conftest.py


def _random_images(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8)


def _write_split(file: Path, features: Features, columns: dict[str, list]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns, features=features).to_parquet(str(file))


def _write_hub_repo(
    root: Path,
    config: str,
    image_column: str,
    shape: tuple[int, ...],
    label_features: dict[str, ClassLabel],
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A hub-repo-like folder: ``config/{train,test}-00000-of-00001.parquet`` (12 + 6 rows)."""
    rng = np.random.default_rng(seed)
    features = Features({image_column: Image(), **label_features})
    written: dict[str, list[np.ndarray]] = {image_column: [], **{k: [] for k in label_features}}
    for split, n in [("train", 12), ("test", 6)]:
        columns = {image_column: list(_random_images(rng, n, shape))}
        columns |= {k: rng.integers(0, f.num_classes, n).tolist() for k, f in label_features.items()}
        _write_split(root / config / f"{split}-00000-of-00001.parquet", features, columns)
        for key, values in columns.items():
            written[key].append(np.asarray(values))
    return {key: np.concatenate(values) for key, values in written.items()}


def _cifar10_repo(root: Path) -> dict[str, np.ndarray]:
    written = _write_hub_repo(root, "plain_text", "img", (32, 32, 3), {"label": ClassLabel(names=CIFAR10_NAMES)})
    (root / "README.md").write_text(CIFAR10_README)
    return written


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ----------------------------------------------------------------------------- hub datasets


def test_cifar10_from_hub_repo_clone_pools_splits(tmp_path: Path) -> None:
    written = _cifar10_repo(tmp_path / "cifar10")
    data = load_dataset("cifar10", {"data_dir": str(tmp_path / "cifar10")})
    assert data.inputs.shape == (18, 3, 32, 32) and data.inputs.dtype == torch.uint8
    assert data.labels.dtype == torch.int64
    assert np.array_equal(data.inputs.permute(0, 2, 3, 1).numpy(), written["img"])
    assert np.array_equal(data.labels.numpy(), written["label"])
    assert data.num_classes == 10 and data.info["classes"] == CIFAR10_NAMES
    assert data.info["splits"] == {"train": 12, "test": 6}
    assert "uoft-cs/cifar10" in data.source and "train: 12, test: 6" in data.source


@pytest.mark.parametrize(
    "name, hub_id, config",
    [
        ("mnist", "ylecun/mnist", "mnist"),
        ("fashion_mnist", "zalando-datasets/fashion_mnist", "fashion_mnist"),
    ],
)
def test_grayscale_hub_datasets(tmp_path: Path, name: str, hub_id: str, config: str) -> None:
    labels = {"label": ClassLabel(names=[str(i) for i in range(10)])}
    written = _write_hub_repo(tmp_path / name, config, "image", (28, 28), labels)
    data = load_dataset(name, {"data_dir": str(tmp_path / name)})
    assert data.inputs.shape == (18, 1, 28, 28)
    assert np.array_equal(data.inputs[:, 0].numpy(), written["image"])
    assert np.array_equal(data.labels.numpy(), written["label"]) and data.num_classes == 10
    assert hub_id in data.source


def test_cifar100_fine_and_coarse_labels(tmp_path: Path) -> None:
    labels = {
        "fine_label": ClassLabel(names=[f"fine{i}" for i in range(100)]),
        "coarse_label": ClassLabel(names=[f"coarse{i}" for i in range(20)]),
    }
    written = _write_hub_repo(tmp_path / "c100", "cifar100", "img", (32, 32, 3), labels)
    fine = load_dataset("cifar100", {"data_dir": str(tmp_path / "c100")})
    coarse = load_dataset("cifar100", {"data_dir": str(tmp_path / "c100"), "label": "coarse"})
    assert fine.num_classes == 100 and np.array_equal(fine.labels.numpy(), written["fine_label"])
    assert coarse.num_classes == 20
    assert np.array_equal(coarse.labels.numpy(), written["coarse_label"])
    assert np.array_equal(fine.inputs.numpy(), coarse.inputs.numpy())
    with pytest.raises(ConfigError, match="fine, coarse"):
        load_dataset("cifar100", {"data_dir": str(tmp_path / "c100"), "label": "medium"})


def test_save_to_disk_copy(tmp_path: Path) -> None:
    written = _cifar10_repo(tmp_path / "repo")
    datasets.load_dataset(str(tmp_path / "repo")).save_to_disk(str(tmp_path / "saved"))
    data = load_dataset("cifar10", {"data_dir": str(tmp_path / "saved")})
    assert np.array_equal(data.labels.numpy(), written["label"])
    assert data.info["splits"] == {"train": 12, "test": 6}


def test_offline_without_data_fails_fast_with_hub_id() -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="uoft-cs/cifar10") as error:
        load_dataset("cifar10")
    assert time.perf_counter() - start < 5
    assert "\n" not in str(error.value) and "--data-dir" in str(error.value)


def test_unreachable_hub_fails_fast_without_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="ylecun/mnist.*unreachable"):
        load_dataset("mnist")
    assert time.perf_counter() - start < 5


def test_bad_data_dirs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        load_dataset("cifar10", {"data_dir": str(tmp_path / "missing")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no data files"):
        load_dataset("cifar10", {"data_dir": str(tmp_path / "empty")})
    pointer = tmp_path / "clone" / "plain_text" / "train-00000-of-00001.parquet"
    pointer.parent.mkdir(parents=True)
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    with pytest.raises(ConfigError, match="git lfs pull"):
        load_dataset("cifar10", {"data_dir": str(tmp_path / "clone")})


def test_disk_cache_skips_the_loader(tmp_path: Path) -> None:
    _cifar10_repo(tmp_path / "cifar10")
    options = {"data_dir": str(tmp_path / "cifar10")}
    first = load_dataset("cifar10", options)
    shutil.rmtree(tmp_path / "cifar10")  # the loader would now fail
    second = load_dataset("cifar10", options)
    assert np.array_equal(first.inputs.numpy(), second.inputs.numpy())
    assert second.source == first.source and second.info == first.info
    with pytest.raises(ConfigError):
        load_dataset("cifar10", options, use_cache=False)


# ----------------------------------------------------------------------------- local files


def _write_image_folder(root: Path, sizes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    written = {}
    for index, (name, shape) in enumerate(sizes.items()):
        written[name] = _random_images(rng, 1, shape)[0]
        folder = root / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        PILImage.fromarray(written[name]).save(folder / f"{name}.png")
    return written


def test_imagefolder(tmp_path: Path) -> None:
    written = _write_image_folder(tmp_path / "rgb", {f"im{i}": (8, 8, 3) for i in range(5)})
    data = load_dataset("imagefolder", {"path": str(tmp_path / "rgb")})
    assert data.inputs.shape == (5, 3, 8, 8) and data.num_classes == 2
    assert data.info["classes"] == ["class0", "class1"]
    assert data.labels.tolist() == [0, 0, 0, 1, 1]  # class0: im0, im2, im4; class1: im1, im3
    expected = np.stack([written[name] for name in ["im0", "im2", "im4", "im1", "im3"]])
    assert np.array_equal(data.inputs.permute(0, 2, 3, 1).numpy(), expected)


def test_imagefolder_grayscale_resize_and_errors(tmp_path: Path) -> None:
    _write_image_folder(tmp_path / "gray", {"a": (6, 6), "b": (9, 7), "c": (6, 6)})
    with pytest.raises(ConfigError, match="different sizes"):
        load_dataset("imagefolder", {"path": str(tmp_path / "gray")})
    data = load_dataset("imagefolder", {"data_dir": str(tmp_path / "gray"), "size": "4x5"})
    assert data.inputs.shape == (3, 1, 4, 5)
    with pytest.raises(ConfigError, match="nowhere"):
        load_dataset("imagefolder", {"path": str(tmp_path / "nowhere")})


def test_parquet_images_with_groups_pools_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    images = _random_images(rng, 10, (28, 28))
    writers = [f"f{i % 3:04d}" for i in range(10)]
    features = Features({"image": Image(), "character": ClassLabel(num_classes=62), "writer_id": Value("string")})
    for part, rows in enumerate([slice(0, 6), slice(6, 10)]):
        _write_split(
            tmp_path / "femnist" / f"part-{part}.parquet",
            features,
            {"image": list(images[rows]), "character": list(range(10))[rows], "writer_id": writers[rows]},
        )
    data = load_dataset(
        "parquet", {"path": str(tmp_path / "femnist"), "label_column": "character", "group_column": "writer_id"}
    )
    assert data.inputs.shape == (10, 1, 28, 28) and data.num_classes == 62
    assert np.array_equal(data.inputs[:, 0].numpy(), images)
    assert data.labels.tolist() == list(range(10)) and data.groups.tolist() == writers


def test_parquet_feature_table(tmp_path: Path) -> None:
    table = pd.DataFrame(
        {"f1": [0.5, 1.5, 2.5, 3.5], "f2": [1, 2, 3, 4], "label": ["cat", "dog", "cat", "emu"], "client": [7, 7, 8, 8]}
    )
    table.to_parquet(tmp_path / "table.parquet")
    data = load_dataset("parquet", {"path": str(tmp_path / "table.parquet"), "group_column": "client"})
    assert data.inputs.shape == (4, 2) and data.inputs.dtype == torch.float32
    assert data.inputs[:, 1].tolist() == [1, 2, 3, 4]
    assert data.info["feature_columns"] == ["f1", "f2"]
    assert data.labels.tolist() == [0, 1, 0, 2] and data.num_classes == 3
    assert data.groups.tolist() == [7, 7, 8, 8]
    only_f2 = load_dataset("parquet", {"path": str(tmp_path / "table.parquet"), "feature_columns": "f2"})
    assert only_f2.inputs.shape == (4, 1)
    with pytest.raises(ConfigError, match="no column 'nope'"):
        load_dataset("parquet", {"path": str(tmp_path / "table.parquet"), "label_column": "nope"})
    with pytest.raises(ConfigError, match="absent.parquet"):
        load_dataset("parquet", {"path": str(tmp_path / "absent.parquet")})
