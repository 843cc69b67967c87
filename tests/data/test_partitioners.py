"""Tests for pflbench.data.partition (SPEC §2) and pflbench.report.plots.plot_label_distribution."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pflbench.data.partitioners import (
    dirichlet,
    dirichlet_client,
    iid,
    natural,
    partition,
    partition_stats,
    shards,
    split_train_test,
)
from pflbench.errors import ConfigError

NUM_CLASSES = 10
# Imbalanced classes: class c has 40 + 15c samples (1075 in all).
LABELS = np.repeat(np.arange(NUM_CLASSES), 40 + 15 * np.arange(NUM_CLASSES))
GROUPS = np.arange(len(LABELS)) % 37  # 37 "writers" of 29 or 30 samples each
BALANCED = np.repeat(np.arange(NUM_CLASSES), 100)  # 10 classes × 100


class ScriptedRng:
    """A Generator whose ``dirichlet`` draws are given in advance; everything else is real."""

    def __init__(self, draws: Sequence[Sequence[float]], seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self._draws = [np.asarray(d, dtype=float) for d in draws]
        self.dirichlet_calls = 0

    def dirichlet(self, alpha: Any) -> np.ndarray:
        self.dirichlet_calls += 1
        draw = self._draws.pop(0)
        assert draw.shape == np.shape(alpha)
        return draw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rng, name)


class UntouchableRng:
    """Fails the test if any random number is drawn."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"rng.{name} used before the input was validated")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def histogram(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def assert_valid(parts: list[np.ndarray], total: int, num_clients: int, min_size: int) -> None:
    """K index arrays, integer, in range, no index twice, each client ≥ min_size."""
    assert isinstance(parts, list) and len(parts) == num_clients
    for p in parts:
        assert np.issubdtype(p.dtype, np.integer)
        assert len(p) >= min_size
    joined = np.concatenate(parts)
    assert joined.min() >= 0 and joined.max() < total
    assert len(np.unique(joined)) == len(joined), "an index was given to two clients"


# ---------------------------------------------------------------------------------------------
# Properties shared by every partitioner
# ---------------------------------------------------------------------------------------------

PARTITIONERS: dict[str, tuple[Callable[..., list[np.ndarray]], dict[str, Any]]] = {
    "dirichlet-0.1": (dirichlet, {"alpha": 0.1}),
    "dirichlet-1-unbalanced": (dirichlet, {"alpha": 1.0, "balance": False}),
    "dirichlet-client": (dirichlet_client, {"alpha": 0.3}),
    "iid": (iid, {}),
    "shards": (shards, {"shards_per_client": 3}),
    "natural": (natural, {"groups": GROUPS}),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_clients", [5, 20])
@pytest.mark.parametrize("name", list(PARTITIONERS))
def test_every_partitioner_is_a_valid_partition(name: str, num_clients: int, seed: int) -> None:
    function, params = PARTITIONERS[name]
    parts = function(LABELS, num_clients, rng(seed), min_size=12, **params)
    assert_valid(parts, len(LABELS), num_clients, min_size=12)


@pytest.mark.parametrize("name", list(PARTITIONERS))
def test_every_partitioner_is_deterministic_in_the_rng(name: str) -> None:
    function, params = PARTITIONERS[name]
    first = function(LABELS, 10, rng(7), **params)
    again = function(LABELS, 10, rng(7), **params)
    other = function(LABELS, 10, rng(8), **params)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("function", [dirichlet, dirichlet_client, iid, shards])
def test_too_many_clients_for_the_data_fails_before_drawing(function: Callable) -> None:
    labels = np.repeat(np.arange(5), 10)  # N = 50 < K·min_size = 60
    with pytest.raises(ConfigError, match=r"6 clients × min_size=10 needs 60 samples.*has 50"):
        function(labels, 6, UntouchableRng(), min_size=10)


@pytest.mark.parametrize("function", [dirichlet, dirichlet_client, iid, shards, natural])
@pytest.mark.parametrize("num_clients", [0, -3])
def test_non_positive_client_count_is_a_config_error(function: Callable, num_clients: int) -> None:
    extra = {"groups": GROUPS} if function is natural else {}
    with pytest.raises(ConfigError, match="num-clients"):
        function(LABELS, num_clients, rng(), **extra)


# ---------------------------------------------------------------------------------------------
# dirichlet
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("balance", [True, False])
@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
def test_dirichlet_assigns_every_sample(alpha: float, balance: bool) -> None:
    for seed in range(5):
        parts = dirichlet(LABELS, 10, rng(seed), alpha=alpha, balance=balance)
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


def test_dirichlet_cuts_at_floor_of_cumsum_and_last_client_takes_the_rest() -> None:
    labels = np.array([0] * 10 + [1] * 7)
    # class 0: cumsum·10 = [3.33, 6.67] → cuts [3, 6] → 3, 3, 4
    # class 1: cumsum·7 = [3.5, 5.25] → cuts [3, 5] → 3, 2, 2
    scripted = ScriptedRng([[1 / 3, 1 / 3, 1 / 3], [0.5, 0.25, 0.25]])
    parts = dirichlet(labels, 3, scripted, alpha=1.0, min_size=1, balance=False, max_tries=1)
    assert histogram(labels, parts, 2).tolist() == [[3, 3], [3, 2], [4, 2]]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(17))


def test_dirichlet_balance_gives_full_clients_nothing_more() -> None:
    labels = np.array([0] * 10 + [1] * 10)  # N/K = 10
    draws = [[1.0, 0.0], [0.5, 0.5]]
    balanced = dirichlet(labels, 2, ScriptedRng(draws), min_size=1, balance=True, max_tries=1)
    # client 0 holds 10 ≥ N/K after class 0, so class 1 goes entirely to client 1
    assert histogram(labels, balanced, 2).tolist() == [[10, 0], [0, 10]]
    raw = dirichlet(labels, 2, ScriptedRng(draws), min_size=1, balance=False, max_tries=1)
    assert histogram(labels, raw, 2).tolist() == [[10, 5], [0, 5]]


def test_dirichlet_redraws_until_min_size_is_met() -> None:
    labels = np.array([0] * 10 + [1] * 10)
    # first try leaves client 1 with 2 samples (< 5): redraw; second try gives 10 / 10
    scripted = ScriptedRng([[0.9, 0.1], [0.9, 0.1], [0.5, 0.5], [0.5, 0.5]])
    parts = dirichlet(labels, 2, scripted, min_size=5, balance=False)
    assert scripted.dirichlet_calls == 4
    assert [len(p) for p in parts] == [10, 10]


def test_dirichlet_large_alpha_is_near_iid() -> None:
    global_mix = np.bincount(BALANCED) / len(BALANCED)
    for balance in (True, False):
        for seed in range(3):
            h = histogram(BALANCED, dirichlet(BALANCED, 10, rng(seed), alpha=1e4, balance=balance), NUM_CLASSES)
            mix = h / h.sum(axis=1, keepdims=True)
            total_variation = 0.5 * np.abs(mix - global_mix).sum(axis=1)
            assert total_variation.max() < 0.08
            assert (h > 0).all()


def _skew(alpha: float, function: Callable = dirichlet) -> tuple[float, float]:
    """Mean dominant-class share and mean classes per client over 5 seeds."""
    dominant, classes = [], []
    for seed in range(5):
        h = histogram(BALANCED, function(BALANCED, 10, rng(seed), alpha=alpha), NUM_CLASSES)
        dominant.append((h.max(axis=1) / h.sum(axis=1)).mean())
        classes.append((h > 0).sum(axis=1).mean())
    return float(np.mean(dominant)), float(np.mean(classes))


def test_dirichlet_small_alpha_gives_few_classes_per_client() -> None:
    dominant_small, classes_small = _skew(0.1)
    dominant_large, classes_large = _skew(100.0)
    assert dominant_small > 0.45 and dominant_large < 0.2
    assert classes_small < 6.5 and classes_large > 9.5


def test_dirichlet_balance_caps_client_sizes() -> None:
    def mean_largest(balance: bool) -> float:
        return float(
            np.mean(
                [
                    max(len(p) for p in dirichlet(BALANCED, 10, rng(seed), alpha=0.1, balance=balance))
                    for seed in range(10)
                ]
            )
        )

    assert mean_largest(True) < 0.9 * mean_largest(False)


def test_dirichlet_unreachable_min_size_names_alpha_k_and_min_size() -> None:
    # N = 1000 ≥ 50 × 15, but α = 0.01 puts each class on about one client
    labels = np.repeat([0, 1], 500)
    with pytest.raises(ConfigError) as error:
        dirichlet(labels, 50, rng(), alpha=0.01, min_size=15, max_tries=5)
    message = str(error.value)
    assert "alpha=0.01" in message
    assert re.search(r"\b50 clients\b", message)
    assert "min_size=15" in message
    assert "5 tries" in message


# ---------------------------------------------------------------------------------------------
# dirichlet-client
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_dirichlet_client_gives_each_client_n_over_k(seed: int) -> None:
    parts = dirichlet_client(LABELS, 10, rng(seed), alpha=0.2)  # 1075 // 10 = 107
    assert [len(p) for p in parts] == [107] * 10
    assert_valid(parts, len(LABELS), 10, min_size=107)


def test_dirichlet_client_falls_back_when_a_class_runs_out() -> None:
    labels = np.array([0] * 3 + [1] * 297)  # class 0 is tiny
    parts = dirichlet_client(labels, 3, rng(1), alpha=1e4, min_size=1)  # mix ≈ (½, ½)
    assert [len(p) for p in parts] == [100, 100, 100]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    # the first client wants ~50 of class 0, gets all 3 and fills up from class 1
    assert histogram(labels, parts, 2).tolist() == [[3, 97], [0, 100], [0, 100]]


def test_dirichlet_client_falls_back_when_its_whole_mix_is_exhausted() -> None:
    labels = np.array([0] * 10 + [1] * 10 + [2] * 20)
    # every client wants class 0 only; the 2nd and 3rd find it empty (weights all zero)
    draws = [[1.0, 0.0, 0.0]] * 3
    parts = dirichlet_client(labels, 3, ScriptedRng(draws), min_size=1)  # 40 // 3 = 13
    assert [len(p) for p in parts] == [13, 13, 13]
    h = histogram(labels, parts, 3)
    assert h[:, 0].tolist() == [10, 0, 0]  # client 0 took class 0, then 3 from classes 1–2
    assert len(np.unique(np.concatenate(parts))) == 39


def test_dirichlet_client_small_alpha_gives_few_classes_per_client() -> None:
    dominant_small, classes_small = _skew(0.05, dirichlet_client)
    dominant_large, classes_large = _skew(100.0, dirichlet_client)
    assert dominant_small > 0.5 and dominant_large < 0.25
    assert classes_small < classes_large - 4


# ---------------------------------------------------------------------------------------------
# iid, shards, natural
# ---------------------------------------------------------------------------------------------


def test_iid_sizes_differ_by_at_most_one_and_cover_everything() -> None:
    labels = np.zeros(103, dtype=np.int64)
    parts = iid(labels, 10, rng(3))
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(103))


def test_shards_each_client_gets_s_single_class_shards() -> None:
    labels = np.repeat(np.arange(10), 20)  # 200 samples → 20 shards of 10, two per class
    mixed_clients = 0
    for seed in range(5):
        parts = shards(labels, 10, rng(seed), shards_per_client=2)
        assert_valid(parts, 200, 10, min_size=20)
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(200))
        for h in histogram(labels, parts, 10):
            # two whole shards: one class ×20 or two classes ×10
            assert sorted(h[h > 0].tolist()) in ([20], [10, 10])
            mixed_clients += int((h > 0).sum() == 2)
    assert mixed_clients > 0, "shards are dealt in label order, not at random"


def test_shards_one_shard_per_client_is_one_class_each() -> None:
    labels = np.repeat(np.arange(4), 15)
    parts = shards(labels, 4, rng(2), shards_per_client=1)
    h = histogram(labels, parts, 4)
    assert sorted(h.max(axis=1).tolist()) == [15] * 4 and ((h > 0).sum(axis=1) == 1).all()


def test_shards_rejects_more_shards_than_samples() -> None:
    with pytest.raises(ConfigError, match="needs at least 30 samples"):
        shards(np.zeros(20, dtype=np.int64), 10, rng(), shards_per_client=3, min_size=1)
    with pytest.raises(ConfigError):
        shards(LABELS, 10, rng(), shards_per_client=0)


def test_natural_respects_the_group_column() -> None:
    groups = np.array(["a"] * 12 + ["b"] * 3 + ["c"] * 11 + ["d"] * 10)
    labels = np.zeros(len(groups), dtype=np.int64)
    for seed in range(5):
        parts = natural(labels, 3, rng(seed), groups=groups, min_size=10)
        # "b" has 3 < min_size samples, so the three eligible groups are all used, whole
        assert sorted(tuple(np.unique(groups[p])) for p in parts) == [("a",), ("c",), ("d",)]
        for p in parts:
            assert np.array_equal(p, np.flatnonzero(groups == groups[p[0]]))


def test_natural_needs_groups() -> None:
    with pytest.raises(ConfigError, match="client-id column"):
        natural(LABELS, 5, rng(), groups=None)
    groups = np.repeat(np.arange(4), 10)
    with pytest.raises(ConfigError, match=r"only 4 groups .* 5 clients"):
        natural(np.zeros(40, dtype=np.int64), 5, rng(), groups=groups, min_size=10)


# ---------------------------------------------------------------------------------------------
# partition() dispatch
# ---------------------------------------------------------------------------------------------


def test_partition_passes_only_accepted_params() -> None:
    everything = {
        "alpha": 0.3,
        "balance": False,
        "shards_per_client": 1,
        "min_size": 5,
        "groups": GROUPS,
        "max_tries": 7,
    }
    parts = partition("iid", LABELS, 10, rng(4), **everything)  # iid takes only min_size
    expected = iid(LABELS, 10, rng(4), min_size=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, expected))
    parts = partition("shards", BALANCED, 10, rng(4), **everything)
    assert ((histogram(BALANCED, parts, 10) > 0).sum(axis=1) == 1).all()  # s = 1 was used
    parts = partition("dirichlet", LABELS, 10, rng(4), **everything)
    expected = dirichlet(LABELS, 10, rng(4), alpha=0.3, balance=False, min_size=5, max_tries=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, expected))
    parts = partition("natural", LABELS, 10, rng(4), **everything)
    assert all(len(np.unique(GROUPS[p])) == 1 for p in parts)


def test_partition_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as error:
        partition("dirichlett", LABELS, 10, rng())
    message = str(error.value)
    for name in ("dirichlet", "dirichlet-client", "iid", "shards", "natural"):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message.split("choices")[-1])


# ---------------------------------------------------------------------------------------------
# split_train_test and partition_stats
# ---------------------------------------------------------------------------------------------


def test_split_is_disjoint_and_complete_per_client() -> None:
    parts = dirichlet(LABELS, 10, rng(0), alpha=0.3)
    train, test = split_train_test(LABELS, parts, 0.25, rng(1))
    assert len(train) == len(test) == 10
    for p, tr, te in zip(parts, train, test):
        assert len(np.intersect1d(tr, te)) == 0
        assert np.array_equal(np.sort(np.concatenate([tr, te])), np.sort(p))
        assert len(te) > 0 and tr.dtype == te.dtype == np.int64


def test_split_is_stratified_inside_the_client() -> None:
    labels = np.array([0] * 40 + [1] * 20 + [2] * 8 + [3] * 7)
    client = np.arange(60)  # classes 0 and 1 only
    train, test = split_train_test(labels, [client], 0.25, rng(5))
    assert np.bincount(labels[test[0]], minlength=4).tolist() == [10, 5, 0, 0]
    assert np.bincount(labels[train[0]], minlength=4).tolist() == [30, 15, 0, 0]
    # class 3 alone: 0.25 · 7 = 1.75 rounds to 2 test samples
    train, test = split_train_test(labels, [np.arange(68, 75)], 0.25, rng(5))
    assert (len(train[0]), len(test[0])) == (5, 2)


def test_split_never_leaves_test_empty() -> None:
    labels = np.array([0, 1, 1, 2, 3, 4])
    # every class of client 0 rounds to 0 test samples (0.1 · 2 = 0.2): one of class 1 moves
    train, test = split_train_test(labels, [np.array([0, 1, 2, 3])], 0.1, rng())
    assert labels[test[0]].tolist() == [1] and len(train[0]) == 3
    train, test = split_train_test(labels, [np.array([4, 5])], 0.1, rng())
    assert len(test[0]) == 1 and len(train[0]) == 1


def test_split_is_deterministic_in_the_rng() -> None:
    parts = iid(LABELS, 10, rng())
    a = split_train_test(LABELS, parts, 0.3, rng(9))
    b = split_train_test(LABELS, parts, 0.3, rng(9))
    c = split_train_test(LABELS, parts, 0.3, rng(10))
    assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    assert not all(np.array_equal(x, y) for x, y in zip(a[1], c[1]))


def test_partition_stats_by_hand() -> None:
    labels = np.array([0, 0, 1, 2, 2, 2])
    stats = partition_stats(labels, [np.array([0, 2]), np.array([3, 4])], [np.array([1]), np.array([5])], num_classes=4)
    assert stats["label_histogram"] == [[2, 1, 0, 0], [0, 0, 3, 0]]
    assert stats["classes_per_client"] == [2, 1]
    assert stats["samples_per_client"] == [3, 3]
    assert stats["train_samples"] == [2, 2] and stats["test_samples"] == [1, 1]
    assert stats["num_clients"] == 2
    assert (stats["samples_mean"], stats["samples_std"]) == (3.0, 0.0)
    assert (stats["samples_min"], stats["samples_max"]) == (3, 3)
    assert stats["classes_per_client_mean"] == 1.5


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def test_plot_label_distribution_writes_a_png(tmp_path: Path) -> None:
    from pflbench.report.plots import plot_label_distribution

    labels = np.repeat(np.arange(10), 50)
    parts = dirichlet(labels, 10, rng(0), alpha=0.1)
    train, test = split_train_test(labels, parts, 0.25, rng(0))
    stats = partition_stats(labels, train, test, num_classes=10)
    written = plot_label_distribution(stats["label_histogram"], tmp_path / "sub" / "dist.png", title="dirichlet α=0.1")
    assert written == tmp_path / "sub" / "dist.png"
    data = written.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    with pytest.raises(ConfigError):
        plot_label_distribution([[1, 2], [3, -1]], tmp_path / "bad.png")


def test_split_keeps_a_train_sample_when_test_frac_is_high() -> None:
    """Ten singleton classes with test_frac 0.9 would put every sample in test."""
    labels = np.arange(10)
    train, test = split_train_test(labels, [np.arange(10)], 0.9, np.random.default_rng(0))
    assert len(train[0]) == 1 and len(test[0]) == 9
    assert sorted(np.concatenate([train[0], test[0]]).tolist()) == list(range(10))
