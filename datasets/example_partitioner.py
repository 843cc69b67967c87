"""Example plugin: a partitioner with a parameter (quantity skew, client sizes ~ Dir(α)).

What it shows: a partitioner is a pure function ``(labels, num_clients, rng, **params)`` →
``num_clients`` arrays of indices into ``labels`` (every sample to at most one client),
registered with ``@register_partitioner(name)``. All randomness comes from ``rng`` (the run's
seeded partition stream), so a seed gives one partition. ``labels`` are those of the samples
left to clients (after any ``--public-frac`` hold-out); the run maps the indices back and splits
each client's samples into train/test itself (``--test-frac``, stratified by label).

Parameters: the keyword arguments a partitioner declares are filled from the run's partition
settings of the same name — ``alpha`` (``--alpha``), ``min_size`` (``--min-size``),
``shards_per_client`` (``--shards-per-client``), ``cut`` (``--dirichlet-cut``) and ``groups``
(the dataset's client-id column, or None). The signature is the contract: a setting the
function takes is read by the run (part of its identity: folder name and hash, sweep and
leaderboard keys); one it does not take is refused when given (``--shards-per-client 3 would
be ignored``). This one takes ``alpha`` and ``min_size``.

The partition: quantity skew with IID labels (Li et al., "Federated Learning on Non-IID Data
Silos", ICDE 2022, arXiv:2102.02079): proportions q ~ Dir(α·1_K), client k gets about q_k·N
samples drawn uniformly at random, whatever their labels. Small α: a few large clients and many
small ones; large α: near-equal sizes. The draw is repeated until every client has at least
``min_size`` samples.

Run it (``--alpha`` sets α; built-in datasets and algorithms are used as they are):

    pflbench run --plugin datasets/example_partitioner.py --partition quantity-skew-example \\
        --alpha 0.5 --dataset digits --model mlp --algo fedavg --num-clients 10 --rounds 20
"""

from __future__ import annotations

import numpy as np

from pflbench import ConfigError, register_partitioner


@register_partitioner("quantity-skew-example")
def dirichlet_quantity(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float = 0.5, min_size: int = 10
) -> list[np.ndarray]:
    """Quantity skew: client sizes ∝ q ~ Dir(α·1_K), samples drawn uniformly (labels IID)."""
    total = len(labels)
    if num_clients < 1 or total < num_clients * min_size:
        raise ConfigError(  # a usage error: one line, exit code 2
            f"quantity-skew-example: {num_clients} clients × min_size={min_size} needs "
            f"{max(num_clients, 1) * min_size} samples, the data has {total}"
        )
    for _ in range(1000):
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(proportions)[:-1] * total).astype(np.int64)  # client k: [cuts[k-1], cuts[k])
        sizes = np.diff(np.concatenate(([0], cuts, [total])))
        if sizes.min() >= min_size:
            order = rng.permutation(total)  # uniformly random samples: the labels stay IID
            return [np.sort(part) for part in np.split(order, cuts)]
    raise ConfigError(
        f"quantity-skew-example: no draw in 1000 gave each of {num_clients} clients at least "
        f"min_size={min_size} samples with alpha={alpha}; use a larger --alpha, fewer clients or a smaller --min-size"
    )
