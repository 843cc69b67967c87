"""Partitions in and out: ``partition --export`` → ``run --partition-file``, validation errors,
PFLlib dataset folders and flwr-datasets partitioners."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import load_dataset
from pflbench.data.flwr import FLWR_INSTALL_HINT, flwr_partition_document, flwr_partition_indices, require_flwr
from pflbench.data.partition import make_partition
from pflbench.data.presets import read_partition_file
from pflbench.errors import ConfigError
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness

DIGITS_SIZE = 1797
TINY_RUN = ["--dataset", "digits", "--model", "mlp", "--rounds", "1", "--quiet"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _export(tmp_path: Path, *extra: str) -> tuple[Path, dict]:
    file = tmp_path / "split.json"
    code, output = invoke(
        "partition",
        "--dataset",
        "digits",
        "--num-clients",
        "5",
        "--alpha",
        "0.3",
        "--seed",
        "7",
        *extra,
        "--export",
        str(file),
    )
    assert code == 0, output
    return file, json.loads(file.read_text())


def test_export_then_run_uses_exactly_those_indices(tmp_path: Path) -> None:
    file, document = _export(tmp_path)
    assert document["format"] == "pflbench-partition" and document["version"] == 1
    assert document["dataset"]["name"] == "digits" and document["dataset"]["size"] == DIGITS_SIZE
    assert document["num_clients"] == 5 and len(document["clients"]) == 5
    # a different seed and partitioner on the command line change nothing: the file rules
    code, output = invoke(
        "run",
        *TINY_RUN,
        "--partition-file",
        str(file),
        "--seed",
        "1",
        "--partition",
        "iid",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, output
    (run,) = (tmp_path / "out" / "runs").iterdir()
    used = json.loads((run / "partition.json").read_text())
    assert used["train_indices"] == [c["train"] for c in document["clients"]]
    assert used["test_indices"] == [c["test"] for c in document["clients"]]
    config = json.loads((run / "config.json").read_text())
    assert config["num_clients"] == 5 and config["partition_file"] == str(file)


def test_a_runs_partition_json_is_a_partition_file_too(tmp_path: Path) -> None:
    file, document = _export(tmp_path)
    config = RunConfig(dataset="digits", partition_file=str(file), num_clients=5)
    dataset = load_dataset("digits")
    first = make_partition(config, dataset)
    saved = tmp_path / "partition.json"
    saved.write_text(
        json.dumps(
            {
                "train_indices": [s.tolist() for s in first.train],
                "val_indices": [s.tolist() for s in first.val],
                "test_indices": [s.tolist() for s in first.test],
            }
        )
    )
    again = make_partition(RunConfig(dataset="digits", partition_file=str(saved), num_clients=5), dataset)
    assert all(
        np.array_equal(a, b) for a, b in zip(first.train + first.val + first.test, again.train + again.val + again.test)
    )


def test_the_partition_sets_num_clients_unless_contradicted(tmp_path: Path) -> None:
    file, _ = _export(tmp_path)
    prepared = prepare(RunConfig(dataset="digits", model="mlp", rounds=1, partition_file=str(file), out=str(tmp_path)))
    assert prepared.config.num_clients == 5 and Harness(prepared).data.num_clients == 5
    code, output = invoke(
        "run", *TINY_RUN, "--partition-file", str(file), "--num-clients", "4", "--out", str(tmp_path / "out")
    )
    assert code == 2 and "--num-clients 4 contradicts partition" in output
    assert "has 5 clients" in output and len(output.strip().splitlines()) == 1


def test_num_clients_equal_to_the_old_default_still_contradicts_a_partition_file(tmp_path: Path) -> None:
    """One rule everywhere: a --num-clients that is given must agree with the file, even when it
    is 20 (the value that used to be the default and was silently replaced by the file's K)."""
    file, _ = _export(tmp_path)  # 5 clients
    out = ["--out", str(tmp_path / "out")]
    for command in (
        ["run", *TINY_RUN, *out],
        ["sweep", "--algos", "fedavg", "--datasets", "digits", "--model", "mlp", "--rounds", "1", *out],
        ["partition", "--dataset", "digits"],
    ):
        code, output = invoke(*command, "--num-clients", "20", "--partition-file", str(file))
        assert code == 2 and "--num-clients 20 contradicts partition" in output, (command, output)
        assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="--num-clients 20 contradicts"):
        prepare(RunConfig(dataset="digits", model="mlp", num_clients=20, partition_file=str(file), out=str(tmp_path)))
    unset = prepare(RunConfig(dataset="digits", model="mlp", partition_file=str(file), out=str(tmp_path)))
    assert unset.config.num_clients == 5
    assert prepare(RunConfig(dataset="digits", model="mlp", rounds=1, out=str(tmp_path))).config.num_clients == 20


def _write(tmp_path: Path, document: dict) -> str:
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(document))
    return str(file)


def _document(clients: list[tuple[list[int], list[int]]], size: int = DIGITS_SIZE, name: str = "digits") -> dict:
    return {
        "format": "pflbench-partition",
        "version": 1,
        "dataset": {"name": name, "size": size},
        "num_clients": len(clients),
        "clients": [{"train": tr, "test": te} for tr, te in clients],
        "public": [],
    }


@pytest.mark.parametrize(
    "clients, kwargs, message",
    [
        ([([0, 1], [2]), ([3], [DIGITS_SIZE])], {}, f"index {DIGITS_SIZE} is out of range"),
        ([([0, 1], [2]), ([3], [-1])], {}, "index -1 is out of range"),
        ([([0, 1], [2]), ([2], [4])], {}, "sample 2 is assigned 2 times"),
        ([([0, 1], [1]), ([3], [4])], {}, "sample 1 is assigned 2 times"),
        ([([0, 1], [2]), ([], [4])], {}, "client 1 has no train samples"),
        ([([0, 1], []), ([3], [4])], {}, "client 0 has no test samples"),
        ([([0, 1], [2])], {"size": 60000}, "made for a dataset of 60000 samples"),
        ([([0, 1], [2])], {"name": "mnist"}, "made for dataset 'mnist', not 'digits'"),
    ],
)
def test_bad_partition_files_are_one_line_errors(tmp_path: Path, clients, kwargs, message) -> None:
    file = _write(tmp_path, _document(clients, **kwargs))
    code, output = invoke("run", *TINY_RUN, "--partition-file", file, "--out", str(tmp_path / "o"))
    assert code == 2, output
    assert message in output and len(output.strip().splitlines()) == 1, output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "is not a JSON file"),
        ("[1, 2]", "holds a JSON list"),
        ('{"clients": []}', "neither a `pflbench partition --export` file"),
        ('{"format": "pflbench-partition", "version": 9, "clients": []}', "format version 9"),
        (
            '{"format": "pflbench-partition", "version": 1, "clients": [{"train": [0.5], "test": [1]}]}',
            "must be a flat list of integers",
        ),
    ],
)
def test_unreadable_partition_files(tmp_path: Path, content: str, message: str) -> None:
    file = tmp_path / "p.json"
    file.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_partition_file(file)
    with pytest.raises(ConfigError, match="is not a file"):
        read_partition_file(tmp_path / "missing.json")


def test_public_fraction_needs_public_indices_in_the_file(tmp_path: Path) -> None:
    file, _ = _export(tmp_path)
    config = RunConfig(dataset="digits", partition_file=str(file), num_clients=5, public_frac=0.2)
    with pytest.raises(ConfigError, match="holds no public samples"):
        make_partition(config, load_dataset("digits"))
    # an export made with a public fraction carries it
    file, document = _export(tmp_path, "--public-frac", "0.2")
    split = make_partition(
        RunConfig(dataset="digits", partition_file=str(file), num_clients=5, public_frac=0.2), load_dataset("digits")
    )
    assert split.public.tolist() == document["public"] and len(split.public) > 300


# ----------------------------------------------------------------------------- PFLlib folders


def write_pfllib_folder(
    root: Path, clients: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], num_classes: int
) -> None:
    """PFLlib's layout (dataset_utils.save_file): config.json, train/<i>.npz, test/<i>.npz, each
    .npz holding ``data`` = {'x': ..., 'y': ...} (a pickled dict)."""
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    for i, (x_train, y_train, x_test, y_test) in enumerate(clients):
        with open(root / "train" / f"{i}.npz", "wb") as f:
            np.savez_compressed(f, data={"x": x_train, "y": y_train})
        with open(root / "test" / f"{i}.npz", "wb") as f:
            np.savez_compressed(f, data={"x": x_test, "y": y_test})
    config = {
        "num_clients": len(clients),
        "num_classes": num_classes,
        "non_iid": True,
        "balance": False,
        "partition": "dir",
        "Size of samples for labels in clients": [],
        "alpha": 0.1,
        "batch_size": 10,
    }
    (root / "config.json").write_text(json.dumps(config))


@pytest.fixture
def pfllib_folder(tmp_path: Path) -> tuple[Path, list]:
    rng = np.random.default_rng(0)
    clients = []
    for n_train, n_test in [(13, 5), (7, 3), (21, 6)]:
        # PFLlib stores normalised float32 images [N, 1, 28, 28] (ToTensor + Normalize(0.5, 0.5))
        x = ((rng.integers(0, 256, (n_train + n_test, 1, 28, 28)) / 255 - 0.5) / 0.5).astype(np.float32)
        x[0, 0, 0, :2] = [-1.0, 1.0]  # the full range occurs
        y = rng.integers(0, 10, n_train + n_test)
        clients.append((x[:n_train], y[:n_train], x[n_train:], y[n_train:]))
    root = tmp_path / "MNIST"
    write_pfllib_folder(root, clients, 10)
    return root, clients


def test_pfllib_folder_imports_every_clients_exact_split(pfllib_folder) -> None:
    root, clients = pfllib_folder
    dataset = load_dataset("pfllib", {"data_dir": str(root)})
    assert dataset.num_classes == 10 and dataset.input_shape == (1, 28, 28)
    config = RunConfig(dataset="pfllib", data_dir=str(root), partition="natural", num_clients=3, val_frac=0)
    split = make_partition(config, dataset)
    pixels = dataset.inputs.numpy().astype(np.float64) / 255 * 2 - 1  # back to PFLlib's [-1, 1]
    for k, (x_train, y_train, x_test, y_test) in enumerate(clients):
        for indices, x, y in ((split.train[k], x_train, y_train), (split.test[k], x_test, y_test)):
            assert len(indices) == len(y)
            np.testing.assert_array_equal(dataset.labels.numpy()[indices], y)
            np.testing.assert_allclose(pixels[indices], x, atol=1e-6)


def test_pfllib_folder_runs_and_sets_num_clients(pfllib_folder, tmp_path: Path) -> None:
    root, clients = pfllib_folder
    code, output = invoke(
        "run",
        "--dataset",
        "pfllib",
        "--data-dir",
        str(root),
        "--partition",
        "natural",
        "--model",
        "mlp",
        "--rounds",
        "1",
        "--quiet",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, output
    (run,) = (tmp_path / "out" / "runs").iterdir()
    used = json.loads((run / "partition.json").read_text())
    # the validation split (--val-frac 0.1) is carved out of each client's own train split
    assert [len(t) + len(v) for t, v in zip(used["train_indices"], used["val_indices"])] == [len(c[1]) for c in clients]
    assert [len(t) for t in used["test_indices"]] == [len(c[3]) for c in clients]


def test_a_pfllib_folder_as_partition_file_says_how_to_load_it(pfllib_folder) -> None:
    root, _ = pfllib_folder
    with pytest.raises(ConfigError, match="--dataset pfllib --data-dir .* --partition natural"):
        read_partition_file(root)


def test_pfllib_token_and_feature_folders(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tokens = [
        (rng.integers(0, 80, (6, 80)), rng.integers(0, 80, 6), rng.integers(0, 80, (3, 80)), rng.integers(0, 80, 3))
        for _ in range(2)
    ]
    write_pfllib_folder(tmp_path / "shakespeare", tokens, 80)
    dataset = load_dataset("pfllib", {"data_dir": str(tmp_path / "shakespeare")})
    assert dataset.inputs.dtype.is_floating_point is False and dataset.input_shape == (80,)
    np.testing.assert_array_equal(dataset.inputs[:6].numpy(), tokens[0][0])
    features = [(rng.normal(size=(5, 4)), rng.integers(0, 3, 5), rng.normal(size=(2, 4)), rng.integers(0, 3, 2))]
    write_pfllib_folder(tmp_path / "tabular", features, 3)
    dataset = load_dataset("pfllib", {"data_dir": str(tmp_path / "tabular")})
    assert dataset.inputs.dtype.is_floating_point and dataset.input_shape == (4,)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda root: (root / "config.json").unlink(), "has no config.json"),
        (lambda root: (root / "test" / "1.npz").unlink(), "has no test/1.npz"),
        (lambda root: (root / "train" / "0.npz").write_bytes(b"junk"), "train/0.npz is not a PFLlib client file"),
        (lambda root: (root / "config.json").write_text("{}"), "config.json has no valid num_clients"),
    ],
)
def test_broken_pfllib_folders(pfllib_folder, damage, message) -> None:
    root, _ = pfllib_folder
    damage(root)
    with pytest.raises(ConfigError, match=message):
        load_dataset("pfllib", {"data_dir": str(root)})


# ----------------------------------------------------------------------------- flwr-datasets


class FakePartitioner:
    """The part of flwr-datasets' ``Partitioner`` API the conversion uses: a ``dataset`` that
    is assigned once, ``num_partitions`` and ``load_partition(i)`` returning a Dataset."""

    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = num_partitions
        self._dataset = None

    @property
    def dataset(self):
        return self._dataset

    @dataset.setter
    def dataset(self, value) -> None:
        assert self._dataset is None, "assigned twice"
        self._dataset = value

    def load_partition(self, partition_id: int):
        # a label-sorted shard split, so partitions are not contiguous row ranges
        order = np.argsort(np.asarray(self._dataset["label"]), kind="stable")
        return self._dataset.select(np.array_split(order, self.num_partitions)[partition_id])


def test_flwr_partition_conversion_on_a_fake_partitioner(tmp_path: Path) -> None:
    import datasets

    labels = np.random.default_rng(0).integers(0, 10, 300)
    train = datasets.Dataset.from_dict({"label": labels[:200].tolist()})
    test = datasets.Dataset.from_dict({"label": labels[200:].tolist()})
    parts = flwr_partition_indices(FakePartitioner(4), train)
    order = np.argsort(labels[:200], kind="stable")
    for part, expected in zip(parts, np.array_split(order, 4)):
        np.testing.assert_array_equal(part, expected)
    document = flwr_partition_document(
        FakePartitioner(4), train, "mnist-like", 300, test_partitioner=FakePartitioner(4), test_dataset=test
    )
    assert [c["test"][0] >= 200 for c in document["clients"]] == [True] * 4
    file = tmp_path / "flwr.json"
    file.write_text(json.dumps(document))
    preset = read_partition_file(file)
    assert preset.num_clients == 4 and preset.dataset_size == 300
    # without a test partitioner each client is split train/test by pflbench's stratified split
    document = flwr_partition_document(FakePartitioner(4), train, "mnist-like", 300, test_frac=0.25)
    for client, part in zip(document["clients"], parts):
        assert sorted(client["train"] + client["test"]) == sorted(part.tolist())
        assert len(client["test"]) > 0


def test_without_flwr_datasets_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flwr_datasets", None)  # import raises ImportError
    with pytest.raises(ConfigError) as error:
        require_flwr()
    assert str(error.value) == FLWR_INSTALL_HINT and "pip install 'pflbench[flwr]'" in str(error.value)


def test_real_flwr_datasets_partitioners() -> None:
    pytest.importorskip("flwr_datasets")
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    import datasets

    labels = np.random.default_rng(0).integers(0, 10, 600)
    train = datasets.Dataset.from_dict({"label": labels.tolist()})
    for make in (
        lambda: IidPartitioner(num_partitions=5),
        lambda: DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.3, seed=42, min_partition_size=5),
        # ShardPartitioner sorts its dataset first: its own indices address the sorted copy
        lambda: ShardPartitioner(num_partitions=5, partition_by="label", num_shards_per_partition=2, seed=1),
    ):
        parts = flwr_partition_indices(make(), train)
        joined = np.concatenate(parts)
        assert len(np.unique(joined)) == len(joined)
        untagged = make()
        untagged.dataset = train
        for k, part in enumerate(parts):
            np.testing.assert_array_equal(labels[part], untagged.load_partition(k)["label"])


def test_flwr_partitioner_spec_on_the_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--partition-file flwr:Name:k=v`` builds flwr_datasets.partitioner.Name (a stand-in here)."""
    import types

    made: list[dict] = []

    class ShardPartitioner(FakePartitioner):
        def __init__(self, num_partitions: int, partition_by: str = "x", seed: int = 0) -> None:
            super().__init__(num_partitions)
            made.append({"num_partitions": num_partitions, "partition_by": partition_by, "seed": seed})

    package = types.ModuleType("flwr_datasets")
    package.partitioner = types.ModuleType("flwr_datasets.partitioner")
    package.partitioner.ShardPartitioner = ShardPartitioner
    monkeypatch.setitem(sys.modules, "flwr_datasets", package)
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", package.partitioner)
    config = RunConfig(dataset="digits", num_clients=4, partition_file="flwr:ShardPartitioner:seed=3")
    split = make_partition(config, load_dataset("digits"))
    assert made == [{"num_partitions": 4, "partition_by": "label", "seed": 3}]
    labels = load_dataset("digits").labels.numpy()
    order = np.argsort(labels, kind="stable")
    for tr, va, te, expected in zip(split.train, split.val, split.test, np.array_split(order, 4)):
        assert sorted(np.concatenate([tr, va, te]).tolist()) == sorted(expected.tolist())
    code, output = invoke(
        "partition", "--dataset", "digits", "--num-clients", "4", "--partition-file", "flwr:NoSuchPartitioner"
    )
    assert code == 2 and "flwr-datasets has no partitioner 'NoSuchPartitioner'" in output


def test_flwr_spec_without_flwr_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flwr_datasets", None)
    code, output = invoke(
        "partition",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--partition-file",
        "flwr:DirichletPartitioner:alpha=0.5",
    )
    assert code == 2 and output.strip() == f"Error: {FLWR_INSTALL_HINT}"
    code, output = invoke("partition", "--dataset", "digits", "--partition-file", "flwr:")
    assert code == 2 and "expected flwr:<Partitioner>" in output


def test_a_poisoned_pfllib_file_does_not_run_code(tmp_path: Path) -> None:
    """PFLlib pickles a dict into each .npz; pflbench rebuilds it without running any code."""
    import os

    from pflbench.data.pfllib import safe_pickled_npz_entry

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    good, bad = tmp_path / "0.npz", tmp_path / "1.npz"
    with open(good, "wb") as handle:
        np.savez_compressed(handle, data={"x": np.arange(6.0).reshape(3, 2), "y": np.array([1, 2, 3])})
    with open(bad, "wb") as handle:
        np.savez(handle, data=np.array(Evil(), dtype=object))
    loaded = safe_pickled_npz_entry(good, "data")
    assert np.array_equal(loaded["y"], [1, 2, 3]) and loaded["x"].shape == (3, 2)
    with pytest.raises(Exception, match="refusing to load"):
        safe_pickled_npz_entry(bad, "data")
    assert not marker.exists()


def test_an_exported_partition_names_no_local_path(tmp_path: Path) -> None:
    """A partition file is made to be shared: the data's absolute path becomes ``<local>/NAME``."""
    from types import SimpleNamespace

    from pflbench.data.presets import export_partition, partition_document

    dataset = SimpleNamespace(
        labels=np.zeros(4), num_classes=2, source="image folder /home/alice/secret/pics (4 images)"
    )
    config = RunConfig(dataset="imagefolder", partition_file="/home/alice/splits/mine.json")
    document = partition_document(config, dataset, [np.array([0, 1])], [np.array([2, 3])], np.zeros(0, dtype=int))
    path = export_partition(tmp_path / "split.json", document)
    text = path.read_text()
    assert "/home/alice" not in text and "<local>/pics" in text and "<local>/mine.json" in text
    assert read_partition_file(path).num_clients == 1
