"""Quantity skew: how many samples each client holds, drawn from a size distribution (``--sizes``).

A size distribution gives K weights w (Σ w_k = 1); client k then holds

    n_k = m + round(w_k · (N − K·m))        (m = ``--min-size``, rounding by largest remainder)

so every client holds at least m samples, the sizes sum to N exactly (every sample of the pool
is used), and the part above the floor follows the distribution. The floor is the choice the
size distributions leave open (FedLab's size splits have none, so a strongly skewed draw can
leave a client with no sample): a floor keeps every client trainable and testable
(``split_train_test`` needs 2 samples) without a redraw loop whose success depends on the seed.
N < K·m is one ConfigError, raised before any draw.

The distributions (parameter ``--size-param``, β or σ):

* ``powerlaw`` (β ≥ 0): w_k ∝ r_k^(−β), r a random permutation of 1..K (the client of rank r
  holds r^(−β) as much as the largest; β = 1 is Zipf's law, β = 0 equal sizes). The ranks are
  shuffled so that the largest client is not always client 0.
* ``lognormal`` (σ ≥ 0): w_k ∝ exp(σ·z_k), z_k ~ N(0, 1), the shape of FedLab's
  ``lognormal_unbalance_split`` (σ = its ``unbalance_sgm``; the log-mean cancels when the
  draws are normalised). σ = 0 equal sizes.
* ``dirichlet`` (β > 0): w ~ Dir(β·1_K), a Dirichlet over client sizes. Small β: a few clients
  hold most samples; β → ∞: equal sizes.

Composition with label skew: the partitioners that take ``sizes`` (``iid``: quantity skew only;
``dirichlet-client``: client k draws its class mix q_k ~ Dir(α·1_C) for n_k samples) call
``client_sizes`` with their own random generator, before any other draw, and only when
``--sizes`` is not ``none`` (so a run without it draws exactly what it drew before).
"""

from __future__ import annotations

import numpy as np

from pflbench.config.run_config import QUANTITY_SKEWS
from pflbench.errors import ConfigError

SIZE_DISTRIBUTIONS = tuple(name for name in QUANTITY_SKEWS if name != "none")


def largest_remainder_counts(proportions: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Integer counts summing to ``total``, each ⌊p_k·total⌋ or ⌈p_k·total⌉ (Hamilton's method).

    The leftover units go to the largest fractional parts; equal fractional parts are ordered
    at random, so the rounding never depends on a client's position.
    """
    exact = np.asarray(proportions, dtype=np.float64) * total
    counts = np.floor(exact).astype(np.int64)
    leftover = total - int(counts.sum())
    if leftover > 0:
        remainders = exact - counts
        order = np.lexsort((rng.random(len(exact)), -remainders))  # by remainder, ties at random
        counts[order[:leftover]] += 1
    return counts


def powerlaw_weights(ranks: np.ndarray, beta: float) -> np.ndarray:
    """w_k = r_k^(−β) / Σ_j r_j^(−β) for ranks r ≥ 1."""
    raw = np.asarray(ranks, dtype=np.float64) ** (-beta)
    return raw / raw.sum()


def lognormal_weights(normals: np.ndarray, sigma: float) -> np.ndarray:
    """w_k = exp(σ·z_k) / Σ_j exp(σ·z_j) (a softmax of σ·z, computed without overflow)."""
    scaled = sigma * np.asarray(normals, dtype=np.float64)
    raw = np.exp(scaled - scaled.max())
    return raw / raw.sum()


def size_weights(distribution: str, num_clients: int, param: float, rng: np.random.Generator) -> np.ndarray:
    """The K weights of ``distribution`` (see the module docstring), drawn from ``rng``."""
    if distribution == "powerlaw":
        return powerlaw_weights(rng.permutation(num_clients) + 1, param)
    if distribution == "lognormal":
        return lognormal_weights(rng.standard_normal(num_clients), param)
    if distribution == "dirichlet":
        weights = rng.dirichlet(np.full(num_clients, param))
        if not np.isfinite(weights).all() or weights.sum() <= 0:  # β so small that every draw underflows to 0
            raise ConfigError(f"--sizes dirichlet --size-param {param:g} is too small to draw sizes; use β ≥ 0.01")
        return weights / weights.sum()
    raise ConfigError(f"--sizes {distribution!r} is not one of: {', '.join(SIZE_DISTRIBUTIONS)}")


def check_floor(total: int, num_clients: int, min_size: int) -> None:
    """ConfigError unless N ≥ K·m (the floor of every client can be met)."""
    if num_clients < 1:
        raise ConfigError(f"--num-clients must be ≥ 1, got {num_clients}")
    if total < num_clients * min_size:
        raise ConfigError(
            f"--sizes: {num_clients} clients × --min-size {min_size} needs {num_clients * min_size} samples, "
            f"the data has {total}; use at most {total // max(min_size, 1)} clients or a smaller --min-size"
        )


def sizes_with_floor(weights: np.ndarray, total: int, min_size: int, rng: np.random.Generator) -> np.ndarray:
    """n_k = m + largest-remainder share of the N − K·m samples above the floor (sums to N)."""
    check_floor(total, len(weights), min_size)
    return min_size + largest_remainder_counts(weights, total - len(weights) * min_size, rng)


def client_sizes(
    distribution: str, total: int, num_clients: int, param: float, min_size: int, rng: np.random.Generator
) -> np.ndarray:
    """Samples per client under quantity skew ``distribution`` (int64 [K], Σ = ``total``, each ≥ ``min_size``)."""
    check_floor(total, num_clients, min_size)  # before any draw: the error does not depend on the seed
    return sizes_with_floor(size_weights(distribution, num_clients, param, rng), total, min_size, rng)


def split_by_sizes(order: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``order`` cut into consecutive pieces of ``sizes`` (Σ sizes = len(order)), each sorted."""
    if int(np.sum(sizes)) != len(order):
        raise ValueError(f"sizes sum to {int(np.sum(sizes))}, not to the {len(order)} samples to split")
    return [np.sort(part) for part in np.split(np.asarray(order), np.cumsum(sizes)[:-1])]
