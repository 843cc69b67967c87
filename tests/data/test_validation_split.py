"""Train / validation / test per client (``--val-frac``) and the choice of new clients
(``--new-clients``): the validation split is carved out of each client's train split, stratified
by label, disjoint from train and test, and the test split is exactly the one without it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig, new_client_count
from pflbench.data.dataset import load_dataset
from pflbench.data.partition import choose_new_clients, make_partition
from pflbench.data.partitioners import split_validation
from pflbench.data.presets import PresetPartition, read_partition_file, validate_partition
from pflbench.errors import ConfigError


def test_a_hand_checked_client() -> None:
    """One client: class 0 has 12 samples (3 test, 9 train), class 1 has 5 (1 test, 4 train).
    val_frac 0.1 of the class's samples: class 0 floor(1.2 + 0.5) = 1, class 1 floor(0.5 + 0.5) = 1."""
    labels = np.array([0] * 12 + [1] * 5)
    test = np.array([0, 1, 2, 12])
    train = np.array([i for i in range(17) if i not in set(test)])
    (new_train,), (val,) = split_validation(labels, [train], [test], 0.1, np.random.default_rng(0))
    assert sorted(labels[val].tolist()) == [0, 1]
    assert len(new_train) == 11 and sorted(labels[new_train].tolist()) == [0] * 8 + [1] * 3
    assert set(val).isdisjoint(new_train) and set(val).isdisjoint(test)
    assert sorted([*new_train, *val]) == sorted(train)  # carved out of train, nothing else
    # 0.3: class 0 floor(3.6 + 0.5) = 4 of its 9 train samples, class 1 floor(1.5 + 0.5) = 2 of 4
    (new_train,), (val,) = split_validation(labels, [train], [test], 0.3, np.random.default_rng(0))
    assert sorted(labels[val].tolist()) == [0] * 4 + [1] * 2 and len(new_train) == 13 - 6


def test_rounding_to_nothing_moves_one_sample_and_too_small_clients_are_refused() -> None:
    labels = np.array([0, 0, 0, 1])
    # class 0: 3 samples, 1 test → floor(0.3 + 0.5) = 0; class 1: 1 sample → 0: one train sample moves
    (train,), (val,) = split_validation(labels, [np.array([1, 2, 3])], [np.array([0])], 0.1, np.random.default_rng(1))
    assert len(val) == 1 and labels[val[0]] == 0 and sorted([*train, *val]) == [1, 2, 3]
    with pytest.raises(ConfigError, match=r"--val-frac 0.1: client 1 has 1 train samples"):
        rng = np.random.default_rng(0)
        split_validation(labels, [np.array([1, 2]), np.array([3])], [np.array([0]), np.array([], int)], 0.1, rng)
    with pytest.raises(ConfigError, match="client 0 has 2 train samples, too few"):  # rounding takes both
        split_validation(np.array([0, 0, 0, 0]), [np.array([0, 1])], [np.array([2, 3])], 0.45, np.random.default_rng(0))


def test_without_validation_nothing_changes() -> None:
    labels = np.array([0, 1, 0, 1])
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    train, val = split_validation(labels, [np.array([0, 1, 2])], [np.array([3])], 0.0, rng)
    assert train[0].tolist() == [0, 1, 2] and len(val[0]) == 0 and rng.bit_generator.state == before


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def config(**kwargs) -> RunConfig:
    return RunConfig(**{"dataset": "digits", "num_clients": 8, "alpha": 0.3, "seed": 5, "public_frac": 0.0, **kwargs})


def test_the_test_split_is_the_one_without_validation(digits) -> None:
    without, with_val = make_partition(config(val_frac=0), digits), make_partition(config(), digits)
    labels = digits.labels.numpy()
    assert not without.has_val and with_val.has_val
    for k in range(8):
        assert np.array_equal(without.test[k], with_val.test[k])  # the same test indices
        assert np.array_equal(np.sort(np.concatenate([with_val.train[k], with_val.val[k]])), without.train[k])
        assert set(with_val.val[k]).isdisjoint(with_val.train[k]) and set(with_val.val[k]).isdisjoint(with_val.test[k])
        # stratified: each class of the client gets floor(0.1·n_c + 0.5) (capped by its train samples)
        everything = np.concatenate([without.train[k], without.test[k]])
        for c in np.unique(labels[everything]):
            n_c = int((labels[everything] == c).sum())
            expected = min(int(np.floor(0.1 * n_c + 0.5)), int((labels[without.train[k]] == c).sum()))
            got = int((labels[with_val.val[k]] == c).sum())
            assert got == expected or (expected == 0 and got <= 1), (k, c)
    assert with_val.stats["val_samples"] == [len(v) for v in with_val.val]
    assert with_val.stats["samples_per_client"] == without.stats["samples_per_client"]
    assert "val_indices" in with_val.to_json() and "val_indices" not in without.to_json()
    again = make_partition(config(), digits)  # seeded: the same split again
    assert all(np.array_equal(a, b) for a, b in zip(again.val, with_val.val))


def test_export_and_import_keep_the_validation_split(digits, tmp_path: Path) -> None:
    file = tmp_path / "split.json"
    args = ["partition", "--dataset", "digits", "--num-clients", "6", "--seed", "2", "--val-frac", "0.2"]
    result = CliRunner().invoke(cli, [*args, "--export", str(file)])
    assert result.exit_code == 0, result.output
    assert " val " in result.output.splitlines()[2]  # the table has a validation column
    document = json.loads(file.read_text())
    assert all(set(c) == {"train", "val", "test"} for c in document["clients"])
    assert document["settings"]["val_frac"] == 0.2
    preset = read_partition_file(file)
    assert preset.val is not None and [v.tolist() for v in preset.val] == [c["val"] for c in document["clients"]]
    # a run on the file uses exactly its validation split, whatever --val-frac says
    imported = make_partition(config(partition_file=str(file), num_clients=6, val_frac=0.1), digits)
    assert [v.tolist() for v in imported.val] == [c["val"] for c in document["clients"]]
    assert [t.tolist() for t in imported.train] == [c["train"] for c in document["clients"]]
    # a run's partition.json round-trips too
    saved = tmp_path / "partition.json"
    saved.write_text(json.dumps(imported.to_json()))
    assert [v.tolist() for v in read_partition_file(saved).val] == [c["val"] for c in document["clients"]]


def test_an_older_file_without_validation_gets_one_carved_from_its_train_split(digits, tmp_path: Path) -> None:
    file = tmp_path / "old.json"
    result = CliRunner().invoke(
        cli, ["partition", "--dataset", "digits", "--num-clients", "6", "--val-frac", "0", "--export", str(file)]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(file.read_text())
    assert all(set(c) == {"train", "test"} for c in document["clients"])
    split = make_partition(config(partition_file=str(file), num_clients=6), digits)
    again = make_partition(config(partition_file=str(file), num_clients=6), digits)
    for k, client in enumerate(document["clients"]):
        assert split.test[k].tolist() == client["test"]
        assert sorted([*split.train[k].tolist(), *split.val[k].tolist()]) == client["train"]
        assert len(split.val[k]) > 0 and np.array_equal(split.val[k], again.val[k])
    assert not make_partition(config(partition_file=str(file), num_clients=6, val_frac=0), digits).has_val


def test_recorded_validation_indices_are_validated() -> None:
    one = [np.array([0, 1]), np.array([4, 5])]
    tests = [np.array([2]), np.array([6])]
    twice = PresetPartition(one, tests, np.zeros(0, int), "f", val=[np.array([1]), np.array([7])])
    with pytest.raises(ConfigError, match="sample 1 is assigned 2 times"):
        validate_partition(twice, 10)
    missing = PresetPartition(one, tests, np.zeros(0, int), "f", val=[np.array([3]), np.array([], int)])
    with pytest.raises(ConfigError, match="client 1 has no validation samples"):
        validate_partition(missing, 10)
    short = PresetPartition(one, tests, np.zeros(0, int), "f", val=[np.array([3])])
    with pytest.raises(ConfigError, match="2 train lists but 1 validation lists"):
        validate_partition(short, 10)


@pytest.mark.parametrize(
    ("clients", "fraction", "count"),
    [(10, 0.0, 0), (10, 0.25, 3), (10, 0.2, 2), (10, 0.01, 1), (20, 0.1, 2), (3, 0.5, 2)],
)
def test_new_client_count(clients: int, fraction: float, count: int) -> None:
    """floor(F·K + 0.5), at least one when F > 0."""
    assert new_client_count(clients, fraction) == count


@pytest.mark.parametrize(
    ("clients", "fraction", "message"),
    [
        (10, 0.95, "holds out 10 of 10 clients, leaving none to train"),
        (1, 0.1, "it needs at least 2 clients"),
        (10, 1.0, "must be a fraction in \\[0, 1\\)"),
        (10, -0.1, "must be a fraction in \\[0, 1\\)"),
    ],
)
def test_new_clients_that_leave_nobody_to_train_are_refused(clients: int, fraction: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        new_client_count(clients, fraction)


def test_new_clients_are_a_seeded_choice_recorded_in_the_partition(digits) -> None:
    chosen = choose_new_clients(10, 0.3, 4)
    assert len(chosen) == 3 and chosen == sorted(set(chosen)) and choose_new_clients(10, 0.3, 4) == chosen
    assert chosen != choose_new_clients(10, 0.3, 5) or chosen != choose_new_clients(10, 0.3, 6)
    split = make_partition(config(new_clients=0.25), digits)
    assert split.new_clients == choose_new_clients(8, 0.25, 5) and len(split.new_clients) == 2
    assert split.to_json()["new_clients"] == split.new_clients
    assert "new_clients" not in make_partition(config(), digits).to_json()
