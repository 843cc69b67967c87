"""SVHN (``ufldl-stanford/svhn``, config ``cropped_digits``) through the real hub loader.

Everything runs offline on tiny generated files with the hub dataset's schema (``image``: 32×32
RGB, ``label``: ClassLabel 0-9; splits train/test/extra), in the forms the loader accepts: a clone
of the hub repository (README ``configs:`` and ``cropped_digits/<split>-*.parquet`` next to the
other config ``full_numbers``), the same files without the README, the config folder alone, and a
``save_to_disk`` folder.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import datasets
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Sequence, Value
from pflbench.cli import cli
from pflbench.data.dataset import load_dataset
from pflbench.errors import ConfigError

DIGITS = [str(i) for i in range(10)]
SIZES = {"train": 30, "test": 12, "extra": 9}
SVHN_README = """---
configs:
- config_name: cropped_digits
  data_files:
  - split: train
    path: cropped_digits/train-*
  - split: test
    path: cropped_digits/test-*
  - split: extra
    path: cropped_digits/extra-*
- config_name: full_numbers
  data_files:
  - split: train
    path: full_numbers/train-*
  - split: test
    path: full_numbers/test-*
  - split: extra
    path: full_numbers/extra-*
---
"""


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/data/conftest.py


def svhn_splits(seed: int = 0) -> DatasetDict:
    """The cropped_digits config's schema: 32×32 RGB ``image``, ClassLabel ``label`` 0-9."""
    rng = np.random.default_rng(seed)
    features = Features({"image": Image(), "label": ClassLabel(names=DIGITS)})
    return DatasetDict(
        {
            split: Dataset.from_dict(
                {
                    "image": list(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)),
                    "label": (np.arange(n) % 10).tolist(),
                },
                features=features,
            )
            for split, n in SIZES.items()
        }
    )


def full_numbers_split(n: int = 2) -> Dataset:
    """The other config (full_numbers): variable-size images and per-digit boxes, no ``label``."""
    features = Features(
        {
            "image": Image(),
            "digits": {
                "bbox": Sequence(Sequence(Value("int32"), length=4)),
                "label": Sequence(ClassLabel(names=DIGITS)),
            },
        }
    )
    images = list(np.zeros((n, 40, 60, 3), dtype=np.uint8))
    return Dataset.from_dict(
        {"image": images, "digits": [{"bbox": [[1, 2, 3, 4]], "label": [3]}] * n}, features=features
    )


def write_svhn_repo(root: Path, readme: bool = True) -> DatasetDict:
    """A hub-repository-like folder: ``cropped_digits/{train,test,extra}-00000-of-00001.parquet``,
    ``full_numbers/...`` (a different schema) and, with ``readme``, the README's ``configs:``."""
    splits = svhn_splits()
    for split, data in splits.items():
        file = root / "cropped_digits" / f"{split}-00000-of-00001.parquet"
        file.parent.mkdir(parents=True, exist_ok=True)
        data.to_parquet(str(file))
        other = root / "full_numbers" / f"{split}-00000-of-00001.parquet"
        other.parent.mkdir(parents=True, exist_ok=True)
        full_numbers_split().to_parquet(str(other))
    if readme:
        (root / "README.md").write_text(SVHN_README)
    return splits


def expected(splits: DatasetDict, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The pooled images (N, 3, 32, 32) and labels of ``names``, in that order."""
    images = np.concatenate([np.stack([np.asarray(image) for image in splits[n]["image"]]) for n in names])
    labels = np.concatenate([np.asarray(splits[n]["label"]) for n in names])
    return images.transpose(0, 3, 1, 2), labels


def check(data, splits: DatasetDict, names: list[str]) -> None:
    images, labels = expected(splits, names)
    assert data.inputs.shape == (len(labels), 3, 32, 32) and data.inputs.dtype == torch.uint8
    assert data.labels.dtype == torch.int64 and data.num_classes == 10
    assert np.array_equal(data.inputs.numpy(), images)
    assert np.array_equal(data.labels.numpy(), labels)
    assert data.info["splits"] == {n: SIZES[n] for n in names} and data.info["classes"] == DIGITS
    assert "ufldl-stanford/svhn, config cropped_digits" in data.source


# ----------------------------------------------------------------------------- the local forms


@pytest.mark.parametrize("readme", [True, False], ids=["hub-clone", "no-readme"])
def test_hub_clone_pools_train_and_test(tmp_path: Path, readme: bool) -> None:
    splits = write_svhn_repo(tmp_path / "svhn", readme)
    data = load_dataset("svhn", {"data_dir": str(tmp_path / "svhn")})
    check(data, splits, ["train", "test"])
    assert len(data.labels) == SIZES["train"] + SIZES["test"]


@pytest.mark.parametrize("readme", [True, False], ids=["hub-clone", "no-readme"])
@pytest.mark.parametrize("value", ["true", 1, "Yes"])
def test_extra_option_adds_the_extra_split(tmp_path: Path, readme: bool, value: object) -> None:
    splits = write_svhn_repo(tmp_path / "svhn", readme)
    data = load_dataset("svhn", {"data_dir": str(tmp_path / "svhn"), "extra": value})
    check(data, splits, ["train", "test", "extra"])
    assert len(data.labels) == sum(SIZES.values())


def test_extra_false_is_the_default(tmp_path: Path) -> None:
    splits = write_svhn_repo(tmp_path / "svhn")
    for value in ("false", 0, "off"):
        check(load_dataset("svhn", {"data_dir": str(tmp_path / "svhn"), "extra": value}), splits, ["train", "test"])


def test_config_folder_alone(tmp_path: Path) -> None:
    splits = write_svhn_repo(tmp_path / "svhn", readme=False)
    folder = tmp_path / "svhn" / "cropped_digits"
    check(load_dataset("svhn", {"data_dir": str(folder), "extra": "true"}), splits, ["train", "test", "extra"])


def test_save_to_disk_copy(tmp_path: Path) -> None:
    splits = svhn_splits()
    splits.save_to_disk(str(tmp_path / "saved"))
    check(load_dataset("svhn", {"data_dir": str(tmp_path / "saved")}), splits, ["train", "test"])
    check(
        load_dataset("svhn", {"data_dir": str(tmp_path / "saved"), "extra": "true"}), splits, ["train", "test", "extra"]
    )


def test_save_to_disk_of_a_hub_clone(tmp_path: Path) -> None:
    """What the docs say (docs/scenarios/datasets.md): ``datasets.load_dataset(<clone or hub id>, 'cropped_digits').save_to_disk``."""
    splits = write_svhn_repo(tmp_path / "svhn")
    datasets.load_dataset(str(tmp_path / "svhn"), "cropped_digits").save_to_disk(str(tmp_path / "saved"))
    check(load_dataset("svhn", {"data_dir": str(tmp_path / "saved")}), splits, ["train", "test"])


def test_decoded_tensors_are_cached(tmp_path: Path) -> None:
    splits = write_svhn_repo(tmp_path / "svhn")
    options = {"data_dir": str(tmp_path / "svhn")}
    load_dataset("svhn", options)
    shutil.rmtree(tmp_path / "svhn")  # the loader would now fail
    check(load_dataset("svhn", options), splits, ["train", "test"])
    with pytest.raises(ConfigError):
        load_dataset("svhn", options, use_cache=False)


# ----------------------------------------------------------------------------- bad input


def _one_line(error: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_offline_without_a_copy_names_hub_id_and_config() -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        load_dataset("svhn")
    assert time.perf_counter() - start < 5
    message = _one_line(error)
    assert "ufldl-stanford/svhn" in message and "cropped_digits" in message and "--data-dir" in message
    assert "load_dataset('ufldl-stanford/svhn', 'cropped_digits').save_to_disk('svhn')" in message


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="ufldl-stanford/svhn.*unreachable") as error:
        load_dataset("svhn")
    assert time.perf_counter() - start < 5
    _one_line(error)


def test_missing_or_empty_local_copy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'[^']*missing' is not a directory") as error:
        load_dataset("svhn", {"data_dir": str(tmp_path / "missing")})
    _one_line(error)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no data files") as error:
        load_dataset("svhn", {"data_dir": str(tmp_path / "empty")})
    _one_line(error)


def test_clone_without_the_config(tmp_path: Path) -> None:
    write_svhn_repo(tmp_path / "svhn")
    (tmp_path / "svhn" / "README.md").write_text(SVHN_README.replace("name: cropped_digits", "name: other_digits"))
    with pytest.raises(ConfigError, match="declares the configs other_digits, full_numbers, not 'cropped_digits'") as e:
        load_dataset("svhn", {"data_dir": str(tmp_path / "svhn")})
    _one_line(e)


def test_bad_extra_value_names_the_choices(tmp_path: Path) -> None:
    write_svhn_repo(tmp_path / "svhn")
    with pytest.raises(ConfigError, match="extra must be true or false .*got 'maybe'") as error:
        load_dataset("svhn", {"data_dir": str(tmp_path / "svhn"), "extra": "maybe"})
    _one_line(error)


def test_extra_requested_but_absent(tmp_path: Path) -> None:
    splits = svhn_splits()
    DatasetDict({n: splits[n] for n in ("train", "test")}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ConfigError, match="no split 'extra' \\(its splits: train, test\\)") as error:
        load_dataset("svhn", {"data_dir": str(tmp_path / "saved"), "extra": "true"})
    _one_line(error)


def test_wrong_config_saved_names_the_columns(tmp_path: Path) -> None:
    DatasetDict({"train": full_numbers_split()}).save_to_disk(str(tmp_path / "full"))
    with pytest.raises(ConfigError, match="no column 'label'; its columns: image, digits") as error:
        load_dataset("svhn", {"data_dir": str(tmp_path / "full")})
    _one_line(error)


# ----------------------------------------------------------------------------- the command line


def test_run_on_a_hub_clone(tmp_path: Path) -> None:
    write_svhn_repo(tmp_path / "svhn")
    args = ["run", "--dataset", "svhn", "--data-dir", str(tmp_path / "svhn"), "--rounds", "1", "--num-clients", "2"]
    args += ["--model", "cnn", "--partition", "iid", "--min-size", "5", "--quiet", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (folder,) = list((tmp_path / "out" / "runs").iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["dataset"] == "svhn" and summary["rounds"] == 1


def test_list_shows_svhn() -> None:
    result = CliRunner().invoke(cli, ["list", "datasets"])
    assert result.exit_code == 0 and "svhn" in result.output
