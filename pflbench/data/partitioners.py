"""Partitioners: pure functions (labels, K, rng, params) → list of K index arrays (SPEC §2).

Every sample goes to at most one client. ``split_train_test`` then splits each client's
samples into train/test, stratified by label inside the client, and ``split_validation`` carves
each client's validation split out of its train split (the test split untouched).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.data.quantity import client_sizes, largest_remainder_counts, split_by_sizes
from pflbench.errors import ConfigError
from pflbench.registry import PARTITIONERS, register_partitioner
from pflbench.util.seeding import rng_stream

if TYPE_CHECKING:
    pass

DIRICHLET_CUTS = ("unbiased", "floor", "flower")


@register_partitioner("dirichlet")
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_size: int = 10,
    balance: bool = True,
    max_tries: int = 100,
    cut: str = "unbiased",
) -> list[np.ndarray]:
    """Label skew: per class c, p_c ~ Dir(α·1_K), class c split over clients by p_c·n_c.

    ``cut`` turns the proportions into per-client counts of class c:

    * ``unbiased`` (default): largest-remainder rounding. Client k gets ⌊p_k·n_c⌋ and the
      n_c − Σ⌊p_k·n_c⌋ leftover samples go one each to the clients with the largest fractional
      parts, ties broken at random. Every count is within 1 of p_k·n_c and no client position
      is favoured (the rule is symmetric in the clients, and so is Dir(α·1_K)).
    * ``floor``: PFLlib's cut at ⌊cumsum(p_c)·n_c⌋. The rounding leftovers of every class land
      on the last client, which therefore holds a sample of almost every class (at α = 0.1,
      K = 20 it holds about twice as many classes as the others). Kept to reproduce PFLlib.
    * ``flower``: flwr-datasets' ``DirichletPartitioner(self_balancing=True)``: the same floor
      cut, with Flower's balancing rule (a client is capped only when it holds *more than*
      round(N/K) samples) instead of pflbench's (at least N/K). ``balance`` is ignored.

    With ``balance`` a client already holding ≥ N/K samples gets proportion 0 for the classes
    still to come (PFLlib's rule). Redraws until every client has ≥ ``min_size`` samples.
    """
    if cut not in DIRICHLET_CUTS:
        raise ConfigError(f"--dirichlet-cut {cut!r} is not one of: {', '.join(DIRICHLET_CUTS)}")
    labels = np.asarray(labels)
    total, classes = len(labels), np.unique(labels)
    _check_enough_samples(total, num_clients, min_size)
    for _ in range(max_tries):
        client_indices: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for c in classes:
            class_indices = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            if balance or cut == "flower":
                if cut == "flower":
                    full = sizes > round(total / num_clients)
                else:
                    full = sizes >= total / num_clients
                capped = proportions * ~full
                if capped.sum() > 0:  # all clients full: keep the raw draw rather than divide by 0
                    proportions = capped / capped.sum()
            if cut == "unbiased":
                counts = largest_remainder_counts(proportions, len(class_indices), rng)
                cuts = np.cumsum(counts)[:-1]
            else:
                cuts = (np.cumsum(proportions) * len(class_indices)).astype(np.int64)[:-1]
            for client, part in enumerate(np.split(class_indices, cuts)):
                client_indices[client].append(part)
                sizes[client] += len(part)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(parts)) for parts in client_indices]
    raise ConfigError(
        f"dirichlet partition failed after {max_tries} tries to give each of {num_clients} clients "
        f"at least min_size={min_size} samples with alpha={alpha}; use fewer clients, a larger "
        "alpha or a smaller --min-size"
    )


@register_partitioner("dirichlet-client")
def dirichlet_client(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_size: int = 10,
    sizes: str = "none",
    size_param: float = 1.0,
) -> list[np.ndarray]:
    """Per-client class mix: q_k ~ Dir(α·1_C); client k gets N/K samples in proportions q_k.

    Sampling is without replacement; when a class runs out, its share goes to the classes
    that still have samples (renormalised q_k). With quantity skew (``sizes`` not ``none``,
    ``data.quantity``) client k gets n_k samples instead, the sizes drawn first.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    _check_enough_samples(len(labels), num_clients, min_size)
    if sizes == "none":
        targets = [len(labels) // num_clients] * num_clients
    else:
        targets = client_sizes(sizes, len(labels), num_clients, size_param, min_size, rng).tolist()
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
    result = []
    for per_client in targets:
        mix = rng.dirichlet(np.full(len(classes), alpha))
        taken: list[int] = []
        while len(taken) < per_client:
            available = np.array([len(pool) > 0 for pool in pools])
            weights = mix * available
            weights = weights / weights.sum() if weights.sum() > 0 else available / available.sum()
            counts = rng.multinomial(per_client - len(taken), weights)
            for c, count in enumerate(counts):
                count = min(count, len(pools[c]))
                taken.extend(pools[c][:count])
                del pools[c][:count]
        result.append(np.sort(np.asarray(taken, dtype=np.int64)))
    return result


@register_partitioner("iid")
def iid(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    min_size: int = 10,
    sizes: str = "none",
    size_param: float = 1.0,
) -> list[np.ndarray]:
    """Uniform random split into K (near-)equal parts; with quantity skew (``sizes`` not
    ``none``, ``data.quantity``) into parts of n_k samples, the sizes drawn first."""
    _check_enough_samples(len(labels), num_clients, min_size)
    if sizes != "none":
        counts = client_sizes(sizes, len(labels), num_clients, size_param, min_size, rng)
        return split_by_sizes(rng.permutation(len(labels)), counts)
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


@register_partitioner("shards")
def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, shards_per_client: int = 2, min_size: int = 10
) -> list[np.ndarray]:
    """Pathological non-IID: sort by label, cut into K·s shards, deal s random shards each."""
    labels = np.asarray(labels)
    num_shards = num_clients * shards_per_client
    if shards_per_client < 1 or num_shards > len(labels):
        raise ConfigError(
            f"shards: {num_clients} clients × {shards_per_client} shards per client "
            f"needs at least {num_shards} samples, the data has {len(labels)}"
        )
    _check_enough_samples(len(labels), num_clients, min_size)
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shard_list = np.array_split(by_label, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([shard_list[s] for s in row])) for row in assignment]


@register_partitioner("natural")
def natural(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None = None, min_size: int = 10
) -> list[np.ndarray]:
    """Use the dataset's own client column (e.g. FEMNIST ``writer_id``); K groups at random.

    The K clients are drawn without replacement among the groups with ≥ ``min_size`` samples
    (uniformly, so prolific writers are not preferred); each gets all of its group's samples
    and the other groups' samples are unused. Asking for more clients than eligible groups is
    an error. (A dataset that carries its own per-client train/test split, a PFLlib folder,
    is used as it is, see ``pflbench.data.presets.preset_partition``.)
    """
    if groups is None:
        raise ConfigError(
            "partition 'natural' needs a dataset with a client-id column; "
            "this dataset has none (use dirichlet, dirichlet-client, iid or shards)"
        )
    if num_clients < 1:
        raise ConfigError(f"--num-clients must be ≥ 1, got {num_clients}")
    groups = np.asarray(groups)
    ids, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    eligible = ids[counts >= min_size]
    if len(eligible) < num_clients:
        raise ConfigError(
            f"partition 'natural': only {len(eligible)} groups have at least "
            f"min_size={min_size} samples, {num_clients} clients were asked for"
        )
    chosen = np.sort(rng.choice(eligible, size=num_clients, replace=False))
    # members of each group in index order, without a K × N comparison (FEMNIST: 3,597 writers)
    by_group = np.argsort(inverse.reshape(-1), kind="stable")
    ends = np.cumsum(counts)
    positions = np.searchsorted(ids, chosen)
    return [by_group[ends[p] - counts[p] : ends[p]] for p in positions]


def _check_enough_samples(total: int, num_clients: int, min_size: int) -> None:
    if num_clients < 1:
        raise ConfigError(f"--num-clients must be ≥ 1, got {num_clients}")
    if total < num_clients * min_size:
        raise ConfigError(
            f"{num_clients} clients × min_size={min_size} needs {num_clients * min_size} samples, "
            f"the data has {total}; use at most {total // max(min_size, 1)} clients"
        )


def partition(
    name: str, labels: np.ndarray, num_clients: int, rng: np.random.Generator, **params: Any
) -> list[np.ndarray]:
    """Run partitioner ``name`` with the subset of ``params`` it accepts."""
    function = PARTITIONERS.get(name)
    accepted = inspect.signature(function).parameters
    return function(labels, num_clients, rng, **{k: v for k, v in params.items() if k in accepted})


def split_train_test(
    labels: np.ndarray, client_indices: list[np.ndarray], test_frac: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's samples into train/test, stratified by label inside the client.

    Class c of a client with n_c samples puts floor(test_frac · n_c + 0.5) into test. A client
    whose rounding leaves its test (train) split empty moves one sample there, so both splits
    are non-empty for every client with at least two samples.
    """
    labels = np.asarray(labels)
    train_splits, test_splits = [], []
    for indices in client_indices:
        train, test = [], []
        client_labels = labels[indices]
        for c in np.unique(client_labels):
            members = rng.permutation(indices[client_labels == c])
            n_test = int(np.floor(test_frac * len(members) + 0.5))
            test.append(members[:n_test])
            train.append(members[n_test:])
        test_idx, train_idx = np.concatenate(test), np.concatenate(train)
        if len(test_idx) == 0 and test_frac > 0 and len(train_idx) > 1:
            largest = np.argmax([len(part) for part in train])
            test_idx, train_idx = (
                train[largest][:1],
                np.concatenate([part[1:] if i == largest else part for i, part in enumerate(train)]),
            )
        if len(train_idx) == 0 and len(test_idx) > 1:
            train_idx, test_idx = test_idx[:1], test_idx[1:]
        train_splits.append(np.sort(train_idx).astype(np.int64))
        test_splits.append(np.sort(test_idx).astype(np.int64))
    return train_splits, test_splits


def split_validation(
    labels: np.ndarray,
    train_splits: list[np.ndarray],
    test_splits: list[np.ndarray],
    val_frac: float,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train, validation) per client: the validation split carved out of each client's train
    split, stratified by label inside the client; the test split is not touched.

    Class c of a client with n_c samples in train + test, m_c of them in train, puts
    min(floor(val_frac · n_c + 0.5), m_c) of its train samples (a random choice) into validation,
    so validation is a ``val_frac`` fraction of the client's samples, like the test split's
    ``test_frac``. A client whose rounding leaves validation empty moves one train sample of its
    largest train class there. ConfigError when a client's train split would be left empty (or
    is too small to give up a validation sample). ``val_frac`` 0: no validation, train unchanged.
    """
    labels = np.asarray(labels)
    empty = np.zeros(0, dtype=np.int64)
    if val_frac <= 0:
        return list(train_splits), [empty] * len(train_splits)
    new_train, val_splits = [], []
    for k, (train, test) in enumerate(zip(train_splits, test_splits)):
        train_labels, test_labels = labels[train], labels[test]
        kept, held = [], []
        for c in np.unique(train_labels):
            members = rng.permutation(train[train_labels == c])
            total = len(members) + int((test_labels == c).sum())
            n_val = min(int(np.floor(val_frac * total + 0.5)), len(members))
            held.append(members[:n_val])
            kept.append(members[n_val:])
        val_idx = np.concatenate(held) if held else empty
        train_idx = np.concatenate(kept) if kept else empty
        if len(val_idx) == 0 and len(train_idx) > 1:
            largest = int(np.argmax([len(part) for part in kept]))
            val_idx = kept[largest][:1]
            train_idx = np.concatenate([part[1:] if i == largest else part for i, part in enumerate(kept)])
        if len(train_idx) == 0 or len(val_idx) == 0:
            raise ConfigError(
                f"--val-frac {val_frac:g}: client {k} has {len(train)} train samples, too few to keep a "
                "train and a validation sample; lower --val-frac (0 = no validation split) or --test-frac"
            )
        new_train.append(np.sort(train_idx).astype(np.int64))
        val_splits.append(np.sort(val_idx).astype(np.int64))
    return new_train, val_splits


def partition_stats(
    labels: np.ndarray,
    train_splits: list[np.ndarray],
    test_splits: list[np.ndarray],
    num_classes: int,
    val_splits: list[np.ndarray] | None = None,
) -> dict[str, Any]:
    """Samples per client, classes per client and the K × C label histogram (train+val+test)."""
    labels = np.asarray(labels)
    val_splits = val_splits or [np.zeros(0, dtype=np.int64)] * len(train_splits)
    histogram = np.stack(
        [
            np.bincount(labels[np.concatenate([tr, va, te])], minlength=num_classes)
            for tr, va, te in zip(train_splits, val_splits, test_splits)
        ]
    )
    sizes = histogram.sum(axis=1)
    classes_per_client = (histogram > 0).sum(axis=1)
    return {
        "num_clients": len(train_splits),
        "train_samples": [len(s) for s in train_splits],
        "val_samples": [len(s) for s in val_splits],
        "test_samples": [len(s) for s in test_splits],
        "samples_per_client": sizes.tolist(),
        "classes_per_client": classes_per_client.tolist(),
        "label_histogram": histogram.tolist(),
        "samples_mean": float(sizes.mean()),
        "samples_std": float(sizes.std()),
        "samples_min": int(sizes.min()),
        "samples_max": int(sizes.max()),
        "classes_per_client_mean": float(classes_per_client.mean()),
    }


# ---- a run's partition: public hold-out, clients, per-client train/test ---------------------


def public_split(labels: np.ndarray, public_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(client pool, public) indices: a label-stratified ``public_frac`` (``public`` stream) is public."""
    everything = np.arange(len(labels))
    if public_frac <= 0:
        return everything, np.zeros(0, dtype=np.int64)
    (pool,), (public,) = split_train_test(labels, [everything], public_frac, rng_stream(seed, "public"))
    return pool, public
