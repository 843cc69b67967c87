"""Quantity skew (``--sizes``, ``data.quantity``): the size laws by hand, the floor, the
composition with iid and dirichlet-client, determinism, export/import, identity and the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.identity import partition_identity, partition_label
from pflbench.config.run_config import RunConfig, validate, with_base_defaults
from pflbench.data.dataset import load_dataset
from pflbench.data.partition import make_partition
from pflbench.data.partitioners import dirichlet_client, iid
from pflbench.data.presets import export_partition, partition_document
from pflbench.data.quantity import (
    client_sizes,
    lognormal_weights,
    powerlaw_weights,
    size_weights,
    sizes_with_floor,
    split_by_sizes,
)
from pflbench.errors import ConfigError
from pflbench.store.reader import partition_of

LABELS = np.repeat(np.arange(10), 60)  # 600 samples, 60 per class


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


# ---- the size laws, by hand -------------------------------------------------------------------


def test_powerlaw_weights_by_hand() -> None:
    # ranks 1, 2, 4 at β = 1: 1, 1/2, 1/4 over 7/4 → 4/7, 2/7, 1/7
    assert np.allclose(powerlaw_weights(np.array([1, 2, 4]), 1.0), [4 / 7, 2 / 7, 1 / 7])
    # β = 2: 1, 1/4, 1/16 over 21/16
    assert np.allclose(powerlaw_weights(np.array([1, 2, 4]), 2.0), [16 / 21, 4 / 21, 1 / 21])
    assert np.allclose(powerlaw_weights(np.array([3, 1, 2]), 0.0), [1 / 3] * 3)  # β = 0: equal


def test_lognormal_weights_by_hand() -> None:
    # σ = 1, z = (0, ln 3): e^0 = 1 and e^{ln 3} = 3 → 1/4, 3/4
    assert np.allclose(lognormal_weights(np.array([0.0, np.log(3)]), 1.0), [0.25, 0.75])
    # σ = 2 doubles the exponent: 1 and 9 → 1/10, 9/10
    assert np.allclose(lognormal_weights(np.array([0.0, np.log(3)]), 2.0), [0.1, 0.9])
    assert np.allclose(lognormal_weights(np.array([5.0, -2.0, 0.3]), 0.0), [1 / 3] * 3)
    big = lognormal_weights(np.array([800.0, 0.0]), 1.0)  # e^800 overflows a float: no nan
    assert np.allclose(big, [1.0, 0.0])


def test_sizes_with_floor_by_hand() -> None:
    # N = 40, K = 3, m = 10: 10 spare samples over (1/2, 1/4, 1/4) → 5, 2.5, 2.5; the one leftover
    # unit goes to one of the two tied clients at random → 15 and {12, 13}
    for seed in range(5):
        sizes = sizes_with_floor(np.array([0.5, 0.25, 0.25]), 40, 10, np.random.default_rng(seed))
        assert sizes[0] == 15 and sorted(sizes[1:].tolist()) == [12, 13] and sizes.sum() == 40
    assert sizes_with_floor(np.array([1.0, 0.0]), 20, 10, np.random.default_rng(0)).tolist() == [10, 10]


@pytest.mark.parametrize("distribution,param", [("powerlaw", 1.5), ("lognormal", 2.0), ("dirichlet", 0.3)])
def test_client_sizes_sum_to_n_meet_the_floor_and_repeat_with_the_seed(distribution: str, param: float) -> None:
    sizes = client_sizes(distribution, 1000, 20, param, 12, np.random.default_rng(3))
    assert sizes.sum() == 1000 and sizes.min() >= 12 and sizes.dtype == np.int64
    again = client_sizes(distribution, 1000, 20, param, 12, np.random.default_rng(3))
    assert sizes.tolist() == again.tolist()
    assert sizes.max() > 2 * 1000 / 20  # skewed: the largest client holds more than twice the mean


def test_powerlaw_sizes_follow_the_shuffled_ranks() -> None:
    rng = np.random.default_rng(0)
    ranks = np.random.default_rng(0).permutation(4) + 1  # the draw client_sizes makes first
    sizes = client_sizes("powerlaw", 4 * 10 + 750, 4, 1.0, 10, rng)
    # spare 750 split 12:6:4:3 (ranks 1..4 at β = 1, over 25/12): 360, 180, 120, 90 exactly
    expected = {1: 370, 2: 190, 3: 130, 4: 100}
    assert sizes.tolist() == [expected[int(r)] for r in ranks]


def test_more_skew_gives_more_spread() -> None:
    spread = [
        np.std(client_sizes("lognormal", 5000, 50, sigma, 10, np.random.default_rng(1))) for sigma in (0.0, 0.5, 2.0)
    ]
    assert spread[0] < 1 and spread[0] < spread[1] < spread[2]
    equal = client_sizes("powerlaw", 100, 4, 0.0, 10, np.random.default_rng(0))
    assert equal.tolist() == [25, 25, 25, 25]


def test_a_floor_that_cannot_be_met_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"20 clients × --min-size 60 needs 1200 samples, the data has 1000") as error:
        client_sizes("lognormal", 1000, 20, 1.0, 60, np.random.default_rng(0))
    assert "\n" not in str(error.value) and "at most 16 clients" in str(error.value)
    with pytest.raises(ConfigError, match="not one of"):
        size_weights("zipf", 3, 1.0, np.random.default_rng(0))


def test_split_by_sizes() -> None:
    parts = split_by_sizes(np.array([5, 3, 9, 1, 0, 7]), np.array([1, 3, 2]))
    assert [p.tolist() for p in parts] == [[5], [1, 3, 9], [0, 7]]
    with pytest.raises(ValueError):
        split_by_sizes(np.arange(5), np.array([2, 2]))


# ---- composition with the label partitioners ---------------------------------------------------


def _check_disjoint_cover(parts: list[np.ndarray], total: int) -> None:
    everything = np.concatenate(parts)
    assert len(everything) == total and len(np.unique(everything)) == total


def test_iid_with_sizes_uses_the_drawn_sizes() -> None:
    parts = iid(LABELS, 8, np.random.default_rng(5), min_size=10, sizes="lognormal", size_param=1.5)
    expected = client_sizes("lognormal", 600, 8, 1.5, 10, np.random.default_rng(5))
    assert [len(p) for p in parts] == expected.tolist()
    _check_disjoint_cover(parts, 600)


def test_iid_without_sizes_is_the_equal_split_it_always_was() -> None:
    parts = iid(LABELS, 7, np.random.default_rng(2))
    old = np.array_split(np.random.default_rng(2).permutation(600), 7)
    assert [p.tolist() for p in parts] == [np.sort(o).tolist() for o in old]


def test_dirichlet_client_with_sizes_has_label_skew_and_the_drawn_sizes() -> None:
    parts = dirichlet_client(LABELS, 10, np.random.default_rng(4), alpha=0.2, sizes="powerlaw", size_param=1.0)
    expected = client_sizes("powerlaw", 600, 10, 1.0, 10, np.random.default_rng(4))
    assert [len(p) for p in parts] == expected.tolist()
    _check_disjoint_cover(parts, 600)
    classes = [len(np.unique(LABELS[p])) for p in parts]
    assert np.mean(classes) < 8  # α = 0.2: most clients miss several classes
    unchanged = dirichlet_client(LABELS, 10, np.random.default_rng(4), alpha=0.2)
    assert all(len(p) == 60 for p in unchanged)  # no --sizes: N/K each, as before


def test_partitions_are_deterministic_and_exported_and_reimported_identically(tmp_path: Path) -> None:
    dataset = load_dataset("digits")
    config = with_base_defaults(
        RunConfig(partition="dirichlet-client", alpha=0.5, sizes="dirichlet", size_param=0.5, num_clients=12, seed=3)
    )
    first, second = make_partition(config, dataset), make_partition(config, dataset)
    assert first.to_json() == second.to_json()
    other = make_partition(dataclasses.replace(config, seed=4), dataset)
    assert other.train[0].tolist() != first.train[0].tolist()
    file = export_partition(
        tmp_path / "split.json",
        partition_document(config, dataset, first.train, first.test, first.public, first.val),
    )
    assert json.loads(file.read_text())["settings"]["sizes"] == "dirichlet"
    again = make_partition(with_base_defaults(RunConfig(partition_file=str(file), seed=3)), dataset)
    for name in ("train", "val", "test"):
        assert [a.tolist() for a in getattr(again, name)] == [a.tolist() for a in getattr(first, name)]


# ---- identity, leaderboard column, validation, CLI -----------------------------------------------


def test_sizes_join_the_identity_only_when_on() -> None:
    off = with_base_defaults(RunConfig(partition="iid", num_clients=5)).partition_spec
    assert "sizes" not in partition_identity(off) and "size_param" not in partition_identity(off)
    assert partition_label(off) == "iid"
    on = with_base_defaults(RunConfig(partition="iid", num_clients=5, sizes="powerlaw", size_param=1.5)).partition_spec
    identity = partition_identity(on)
    assert identity["sizes"] == "powerlaw" and identity["size_param"] == 1.5
    assert partition_label(on) == "iid-powerlaw1.5"
    assert partition_of({"identity": identity}) == "iid sizes=powerlaw(β=1.5)"
    lognormal = with_base_defaults(RunConfig(partition="dirichlet-client", sizes="lognormal", size_param=2.0))
    assert partition_of({"identity": partition_identity(lognormal.partition_spec)}) == (
        "dirichlet-client α=0.5 sizes=lognormal(σ=2)"
    )


@pytest.mark.parametrize(
    "values,message",
    [
        ({"sizes": "zipf"}, "--sizes 'zipf' is not one of: none, powerlaw, lognormal, dirichlet"),
        ({"sizes": "dirichlet", "size_param": 0.0}, "--size-param for --sizes dirichlet must be a finite number > 0"),
        ({"sizes": "lognormal", "size_param": -1.0}, "--size-param for --sizes lognormal must be a finite number ≥ 0"),
    ],
)
def test_bad_size_settings_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(with_base_defaults(RunConfig(partition="iid", **values)))


def test_cli_prints_the_sizes_and_refuses_bad_input_writing_nothing(tmp_path: Path) -> None:
    code, output = invoke(
        "partition", "--dataset", "digits", "--partition", "iid", "--sizes", "lognormal", "--size-param", "1.5",
        "--num-clients", "6",
    )  # fmt: skip
    assert code == 0, output
    assert "iid sizes=lognormal(σ=1.5)" in output
    file = tmp_path / "x.json"
    bad = [
        (
            ["--partition", "iid", "--sizes", "powerlaw", "--num-clients", "20", "--min-size", "95"],
            "needs 1900 samples",
        ),
        (["--partition", "dirichlet", "--sizes", "powerlaw"], "--partition dirichlet draws no client sizes"),
        (["--partition", "iid", "--size-param", "2"], "--sizes none draws no client sizes"),
    ]
    for args, message in bad:
        code, output = invoke("partition", "--dataset", "digits", *args, "--export", str(file))
        assert code == 2 and message in output and output.count("\n") == 1, output
        assert not file.exists()
    code, output = invoke(
        "run", "--dataset", "digits", "--partition", "iid", "--sizes", "powerlaw", "--num-clients", "20",
        "--min-size", "95", "--model", "mlp", "--rounds", "1", "--quiet", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 2 and "needs 1900 samples" in output
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())
