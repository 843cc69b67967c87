"""Natural clients (FEMNIST writers, Shakespeare roles) on generated files with the hub schema,
the char LSTM, and training batches that BatchNorm models survive."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch

from datasets import ClassLabel, Dataset, Features, Image, Value
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset, load_dataset
from pflbench.data.partition import make_partition
from pflbench.errors import ConfigError
from pflbench.models.zoo import build_model, head_module_names
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness

FEMNIST_NAMES = list(string.digits + string.ascii_uppercase + string.ascii_lowercase)


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/data/conftest.py


def write_femnist(root: Path, writers: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """flwrlabs/femnist's schema: image (28×28 L), writer_id (str), character (62-class label),
    hsf_id (int); one train split in ``data/``."""
    rng = np.random.default_rng(seed)
    ids = [w for w, n in writers.items() for _ in range(n)]
    images = rng.integers(0, 256, (len(ids), 28, 28), dtype=np.uint8)
    characters = rng.integers(0, 62, len(ids))
    features = Features(
        {
            "image": Image(),
            "writer_id": Value("string"),
            "hsf_id": Value("int64"),
            "character": ClassLabel(names=FEMNIST_NAMES),
        }
    )
    columns = {"image": list(images), "writer_id": ids, "hsf_id": [4] * len(ids), "character": characters.tolist()}
    (root / "data").mkdir(parents=True)
    Dataset.from_dict(columns, features=features).to_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    return {"image": images, "character": characters, "writer_id": np.asarray(ids)}


def write_shakespeare(root: Path, roles: dict[str, int], seed: int = 0) -> dict[str, list[str]]:
    """flwrlabs/shakespeare's schema: character_id (str), x (80 characters), y (next character)."""
    rng = np.random.default_rng(seed)
    text = "".join(rng.choice(list("abcdefgh ,.!THE"), 4000))
    ids, xs, ys = [], [], []
    for role, n in roles.items():
        for _ in range(n):
            start = int(rng.integers(0, len(text) - 81))
            ids.append(role)
            xs.append(text[start : start + 80])
            ys.append(text[start + 80])
    features = Features({"character_id": Value("string"), "x": Value("string"), "y": Value("string")})
    (root / "data").mkdir(parents=True)
    Dataset.from_dict({"character_id": ids, "x": xs, "y": ys}, features=features).to_parquet(
        str(root / "data" / "train-00000-of-00001.parquet")
    )
    return {"character_id": ids, "x": xs, "y": ys}


def test_femnist_schema_loads_with_writers_as_groups(tmp_path: Path) -> None:
    written = write_femnist(tmp_path / "femnist", {"f0001_12": 30, "f0002_40": 12, "f0003_08": 25})
    data = load_dataset("femnist", {"data_dir": str(tmp_path / "femnist")})
    assert data.inputs.shape == (67, 1, 28, 28) and data.inputs.dtype == torch.uint8
    np.testing.assert_array_equal(data.inputs[:, 0].numpy(), written["image"])
    np.testing.assert_array_equal(data.labels.numpy(), written["character"])
    np.testing.assert_array_equal(data.groups, written["writer_id"])
    assert data.num_classes == 62 and data.info["classes"] == FEMNIST_NAMES
    assert "flwrlabs/femnist" in data.source


def test_shakespeare_schema_loads_as_token_ids(tmp_path: Path) -> None:
    written = write_shakespeare(tmp_path / "shakespeare", {"HAMLET": 20, "OPHELIA": 15, "GHOST": 3})
    data = load_dataset("shakespeare", {"data_dir": str(tmp_path / "shakespeare")})
    vocab = data.info["vocab"]
    assert data.input_shape == (80,) and not data.inputs.is_floating_point()
    assert data.num_classes == len(vocab) and vocab == "".join(sorted(set("".join(written["x"] + written["y"]))))
    decoded = ["".join(vocab[i] for i in row) for row in data.inputs.tolist()]
    assert decoded == written["x"]
    assert "".join(vocab[i] for i in data.labels.tolist()) == "".join(written["y"])
    assert list(data.groups) == written["character_id"]
    mean, std = data.channel_stats()  # token ids are not normalised
    assert torch.all(mean == 0) and torch.all(std == 1)


@pytest.mark.parametrize("name, hub_id", [("femnist", "flwrlabs/femnist"), ("shakespeare", "flwrlabs/shakespeare")])
def test_offline_without_data_is_one_clear_line(name: str, hub_id: str) -> None:
    with pytest.raises(ConfigError, match=hub_id) as error:
        load_dataset(name)
    assert "\n" not in str(error.value) and "--data-dir" in str(error.value)


def test_missing_column_names_the_column(tmp_path: Path) -> None:
    root = tmp_path / "femnist"
    (root / "data").mkdir(parents=True)
    Dataset.from_dict(
        {"image": [np.zeros((28, 28), np.uint8)], "character": [1]},
        features=Features({"image": Image(), "character": Value("int64")}),
    ).to_parquet(str(root / "data" / "train.parquet"))
    with pytest.raises(ConfigError, match="no column 'writer_id'"):
        load_dataset("femnist", {"data_dir": str(root)})


def test_natural_partition_takes_k_random_writers(tmp_path: Path) -> None:
    write_femnist(tmp_path / "femnist", {"a": 30, "b": 12, "c": 25, "d": 5, "e": 14})
    config = RunConfig(
        dataset="femnist", data_dir=str(tmp_path / "femnist"), partition="natural", num_clients=3, min_size=10
    )
    dataset = load_dataset("femnist", config.dataset_options())
    split = make_partition(config, dataset)
    chosen = [set(dataset.groups[np.concatenate([tr, te])]) for tr, te in zip(split.train, split.test)]
    assert all(len(c) == 1 for c in chosen)  # one writer per client, all of its samples
    names = [c.pop() for c in chosen]
    assert "d" not in names and len(set(names)) == 3  # "d" has fewer than min_size samples
    for name, tr, va, te in zip(names, split.train, split.val, split.test):
        assert len(tr) + len(va) + len(te) == int((dataset.groups == name).sum())
    with pytest.raises(ConfigError, match="only 4 groups have at least min_size=10"):
        make_partition(RunConfig(**{**config.__dict__, "num_clients": 5}), dataset)


def test_femnist_natural_run(tmp_path: Path) -> None:
    write_femnist(tmp_path / "femnist", {"a": 30, "b": 22, "c": 25})
    config = RunConfig(
        algo="fedavg",
        dataset="femnist",
        data_dir=str(tmp_path / "femnist"),
        partition="natural",
        num_clients=3,
        model="lenet",
        rounds=1,
        out=str(tmp_path / "out"),
    )
    summary = execute(prepare(config))
    assert summary["num_clients"] == 3 and 0 <= summary["pers_acc"] <= 1


@pytest.mark.parametrize("algo", ["fedper", "fedrep"])
def test_shakespeare_char_lstm_with_a_private_head(tmp_path: Path, algo: str) -> None:
    write_shakespeare(tmp_path / "sh", {"HAMLET": 24, "OPHELIA": 20, "GHOST": 16})
    config = RunConfig(
        algo=algo,
        dataset="shakespeare",
        data_dir=str(tmp_path / "sh"),
        partition="natural",
        num_clients=3,
        model="char_lstm",
        model_option=("hidden=16", "layers=1"),
        rounds=1,
        batch_size=8,
        out=str(tmp_path / "out"),
    )
    prepared = prepare(config, {"head_epochs": 1} if algo == "fedrep" else None)
    assert head_module_names(Harness(prepared).model) == ["fc"]
    assert all(name.startswith("fc.") for name in Harness(prepared).private_names)
    assert Harness(prepared).private_names and Harness(prepared).shared_names
    summary = execute(prepared)
    assert 0 <= summary["pers_acc"] <= 1


def test_char_lstm_shapes() -> None:
    model = build_model("char_lstm", (80,), 60)
    assert model.lstm.hidden_size == 256 and model.lstm.num_layers == 2
    assert model.embedding.embedding_dim == 8
    tokens = torch.randint(0, 60, (4, 80))
    assert model(tokens).shape == (4, 60) and model(tokens.float()).shape == (4, 60)
    with pytest.raises(ConfigError, match="token sequences"):
        build_model("char_lstm", (1, 28, 28), 10)


# ----------------------------------------------------------------------------- BatchNorm batches


def _federated(train_sizes: list[int]) -> FederatedData:
    total = sum(train_sizes) + len(train_sizes)
    rng = np.random.default_rng(0)
    dataset = TensorDataset(
        inputs=torch.from_numpy(rng.integers(0, 256, (total, 1, 8, 8), dtype=np.uint8)),
        labels=torch.from_numpy(rng.integers(0, 10, total)),
        num_classes=10,
        source="generated",
    )
    train, test, start = [], [], 0
    for n in train_sizes:
        train.append(np.arange(start, start + n))
        test.append(np.array([start + n]))
        start += n + 1
    return FederatedData(dataset, train, test, torch.device("cpu"))


def test_no_training_batch_holds_a_single_sample() -> None:
    data = _federated([33, 32, 1, 65, 5])
    sizes = {k: [len(t) for _, t in data.train_batches(k, 32, torch.Generator().manual_seed(0))] for k in range(5)}
    assert sizes == {0: [33], 1: [32], 2: [2], 3: [32, 33], 4: [5]}
    merged = torch.cat([x for x, _ in data.train_batches(3, 32, torch.Generator().manual_seed(0))])
    assert len(merged) == 65  # every sample once per epoch
    # batch size 1 is the user's explicit choice: left alone
    assert [len(t) for _, t in data.train_batches(0, 1, torch.Generator())] == [1] * 33


@pytest.mark.parametrize("model_name", ["cnn_bn", "resnet18"])
def test_batchnorm_models_train_on_tiny_clients(tmp_path: Path, model_name: str) -> None:
    # digits: 8×8 images, so resnet18's last stage is 1×1 and BatchNorm needs ≥ 2 samples;
    # with --min-size 2 and K = 60 some clients train on 1 sample, others on 32k + 1.
    config = RunConfig(
        algo="fedavg",
        dataset="digits",
        model=model_name,
        num_clients=60,
        alpha=0.5,
        min_size=2,
        rounds=1,
        batch_size=4 if model_name == "resnet18" else 2,
        frac=0.1 if model_name == "resnet18" else 1.0,
        out=str(tmp_path),
    )
    prepared = prepare(config)
    train_sizes = Harness(prepared).data.num_train
    assert any(n % config.batch_size == 1 for n in train_sizes)
    summary = execute(prepared)
    assert np.isfinite(summary["final_train_loss"])
