"""The Dirichlet cut: the default (largest remainder) favours no client position; ``floor``
reproduces PFLlib's cut and its bias (the last client collects every class's leftovers)."""

from __future__ import annotations

import numpy as np
import pytest

from pflbench.data.partitioners import DIRICHLET_CUTS, dirichlet, largest_remainder_counts
from pflbench.errors import ConfigError

NUM_CLASSES, PER_CLASS, K, SEEDS = 10, 100, 10, 200
LABELS = np.repeat(np.arange(NUM_CLASSES), PER_CLASS)


def _stats_over_seeds(cut: str, alpha: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """classes per client and samples per client, [SEEDS, K], one partition per seed."""
    classes, sizes = np.zeros((SEEDS, K)), np.zeros((SEEDS, K))
    for seed in range(SEEDS):
        parts = dirichlet(LABELS, K, np.random.default_rng(seed), alpha=alpha, min_size=10, cut=cut)
        classes[seed] = [len(np.unique(LABELS[p])) for p in parts]
        sizes[seed] = [len(p) for p in parts]
    return classes, sizes


def _position_z_scores(values: np.ndarray) -> np.ndarray:
    """Per position: (mean at this position − mean elsewhere) in standard errors (paired by seed)."""
    others = (values.sum(axis=1, keepdims=True) - values) / (values.shape[1] - 1)
    difference = values - others
    return difference.mean(axis=0) / (difference.std(axis=0, ddof=1) / np.sqrt(len(values)))


@pytest.fixture(scope="module")
def unbiased_stats() -> tuple[np.ndarray, np.ndarray]:
    return _stats_over_seeds("unbiased")


@pytest.fixture(scope="module")
def floor_stats() -> tuple[np.ndarray, np.ndarray]:
    return _stats_over_seeds("floor")


def test_unbiased_classes_and_sizes_do_not_depend_on_position(unbiased_stats) -> None:
    classes, sizes = unbiased_stats
    # 10 positions × 2 statistics: |z| < 3.5 everywhere (a fair split fails this with p < 1%)
    assert np.abs(_position_z_scores(classes)).max() < 3.5, classes.mean(axis=0)
    assert np.abs(_position_z_scores(sizes)).max() < 3.5, sizes.mean(axis=0)
    # the last client is an ordinary client
    assert abs(classes[:, -1].mean() - classes[:, :-1].mean()) < 0.3


def test_unbiased_distribution_of_classes_is_the_same_at_every_position(unbiased_stats) -> None:
    classes, _ = unbiased_stats
    # the histogram of classes-per-client at the last position vs at all the others
    bins = np.arange(1, NUM_CLASSES + 2)
    last = np.histogram(classes[:, -1], bins)[0] / SEEDS
    rest = np.histogram(classes[:, :-1], bins)[0] / classes[:, :-1].size
    assert np.abs(last - rest).sum() / 2 < 0.15  # total variation distance


def test_floor_reproduces_the_last_client_bias(floor_stats, unbiased_stats) -> None:
    classes, sizes = floor_stats
    z = _position_z_scores(classes)
    assert z[-1] > 10 and np.abs(z[:-1]).max() < z[-1] / 2
    assert classes[:, -1].mean() > 1.5 * classes[:, :-1].mean()
    assert classes[:, -1].mean() > unbiased_stats[0][:, -1].mean() + 1
    assert _position_z_scores(sizes)[-1] > 0  # and it also collects the most samples


def _pfllib_floor_reference(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """PFLlib's rule written out independently: cap clients at ≥ N/K, cut at floor(cumsum·n_c)."""
    while True:
        batches: list[list[int]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet([alpha] * num_clients)
            p = np.array([q * (len(b) < len(labels) / num_clients) for q, b in zip(p, batches)])
            p = p / p.sum()
            edges = (np.cumsum(p) * len(members)).astype(int)[:-1]
            for b, piece in zip(batches, np.split(members, edges)):
                b.extend(piece.tolist())
        if min(len(b) for b in batches) >= min_size:
            return [np.sort(np.asarray(b)) for b in batches]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_floor_cut_is_pfllibs_cut(seed: int) -> None:
    ours = dirichlet(LABELS, K, np.random.default_rng(seed), alpha=0.3, min_size=10, cut="floor")
    reference = _pfllib_floor_reference(LABELS, K, 0.3, 10, np.random.default_rng(seed))
    for mine, theirs in zip(ours, reference):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("cut", DIRICHLET_CUTS)
def test_every_cut_assigns_each_sample_once(cut: str) -> None:
    parts = dirichlet(LABELS, K, np.random.default_rng(3), alpha=0.5, min_size=10, cut=cut)
    joined = np.concatenate(parts)
    assert len(joined) == len(LABELS) and len(np.unique(joined)) == len(LABELS)
    assert min(len(p) for p in parts) >= 10


def test_unbiased_large_alpha_is_near_uniform() -> None:
    parts = dirichlet(LABELS, 5, np.random.default_rng(0), alpha=1000.0, cut="unbiased")
    histogram = np.stack([np.bincount(LABELS[p], minlength=NUM_CLASSES) for p in parts])
    assert np.abs(histogram - PER_CLASS / 5).max() <= 3


def test_unknown_cut_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--dirichlet-cut 'ceil' is not one of: unbiased, floor, flower"):
        dirichlet(LABELS, K, np.random.default_rng(0), cut="ceil")


def test_largest_remainder_counts_are_within_one_and_sum_up() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.dirichlet(np.full(7, 0.3))
        total = int(rng.integers(0, 500))
        counts = largest_remainder_counts(p, total, rng)
        assert counts.sum() == total
        assert np.all(np.abs(counts - p * total) < 1)


def test_largest_remainder_breaks_ties_at_random() -> None:
    # 4 samples over 3 equal shares: one client gets 2, each position equally often
    rng = np.random.default_rng(0)
    winners = [int(np.argmax(largest_remainder_counts(np.full(3, 1 / 3), 4, rng))) for _ in range(3000)]
    shares = np.bincount(winners, minlength=3) / 3000
    assert np.all(np.abs(shares - 1 / 3) < 0.04), shares
    # a zero share never gets a leftover
    assert largest_remainder_counts(np.array([0.5, 0.0, 0.5]), 3, rng)[1] == 0


class _ScriptedDirichlet:
    """A Generator whose Dirichlet draws are given; everything else is a real Generator."""

    def __init__(self, draws: list[list[float]]) -> None:
        self._real, self._draws = np.random.default_rng(0), iter(draws)

    def dirichlet(self, alpha: np.ndarray) -> np.ndarray:
        return np.asarray(next(self._draws))

    def __getattr__(self, name: str):
        return getattr(self._real, name)


@pytest.mark.parametrize("cut, sizes", [("floor", [10, 10]), ("unbiased", [10, 10]), ("flower", [15, 5])])
def test_balance_rules(cut: str, sizes: list[int]) -> None:
    # Class 0 goes entirely to client 0, which then holds exactly N/K = 10 samples. pflbench's
    # (PFLlib's) rule caps it for class 1 (≥ N/K); Flower's caps only above round(N/K).
    labels = np.repeat([0, 1], [10, 10])
    rng = _ScriptedDirichlet([[1.0, 0.0], [0.5, 0.5]])
    parts = dirichlet(labels, 2, rng, alpha=1.0, min_size=1, cut=cut)  # type: ignore[arg-type]
    assert [len(p) for p in parts] == sizes
