"""Domain partitioners: clients drawn inside the domains of a multi-domain dataset (feature shift).

A multi-domain dataset (``pflbench.datasets.multidomain``: PACS, MNIST+USPS, a
``<domain>/<class>/`` image folder) gives every sample its domain name in ``groups``. With D
training domains and K clients (``--num-clients``), each domain gets K/D clients (K must be a
multiple of D: "K per domain" is the setting of FedBN's and FL-bench's domain experiments), in
the sorted order of the domain names: clients 0 … K/D−1 hold the first domain, and so on.
Inside a domain its samples are split

* ``domain``: uniformly at random into K/D (near-)equal parts (feature shift only), or
* ``domain-dirichlet``: by ``dirichlet`` (``--alpha``, ``--dirichlet-cut``, ``--min-size``) over
  the domain's samples (feature shift and label skew).

``--holdout-domain NAME`` keeps domain NAME out of training: no client holds its samples, and
``data.partition.make_partition`` gives all of them (``held_out_indices``) to the out-of-domain
evaluation (``ood_acc``). A name that is not a domain of the dataset is one ConfigError line
listing the domains. Each client's domain is recorded in partition.json as ``client_domains``
(``client_domain_names``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from pflbench.data.partitioners import DIRICHLET_CUTS, dirichlet, iid
from pflbench.errors import ConfigError
from pflbench.registry import register_partitioner

DOMAIN_PARTITIONERS = ("domain", "domain-dirichlet")
LISTED_DOMAINS = 12  # domain names an error line shows before "…"
# how one domain's samples are split over its clients: (labels, clients, rng) → index arrays
SplitDomain = Callable[[np.ndarray, int, np.random.Generator], list[np.ndarray]]


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED_DOMAINS])
    return shown + (f", … ({len(names)} in all)" if len(names) > LISTED_DOMAINS else "")


def dataset_domains(groups: np.ndarray | None, partition: str) -> np.ndarray:
    """The samples' domain names as strings; ConfigError when the dataset has no domains."""
    if groups is None:
        raise ConfigError(
            f"partition {partition!r} needs a dataset with domains (pacs, mnist_usps, "
            "imagefolder_domains, or one whose samples carry a group column); this dataset has none"
        )
    return np.asarray(groups).astype(str)


def check_holdout_domain(domains: np.ndarray, holdout_domain: str | None) -> list[str]:
    """The sorted training domains: every domain but ``holdout_domain`` (which must exist, and
    must leave at least one domain to train on)."""
    names = sorted(set(domains.tolist()))
    if holdout_domain is None:
        return names
    if holdout_domain not in names:
        raise ConfigError(
            f"--holdout-domain {holdout_domain!r} is not a domain of this dataset; its domains: {_listing(names)}"
        )
    if len(names) == 1:
        raise ConfigError(f"--holdout-domain {holdout_domain!r} is the dataset's only domain: none is left to train on")
    return [name for name in names if name != holdout_domain]


def clients_per_domain(num_clients: int, training_domains: list[str]) -> int:
    """K / D; ConfigError unless K is a positive multiple of the number of training domains D."""
    count = len(training_domains)
    if num_clients < 1 or num_clients % count:
        multiples = ", ".join(str(count * m) for m in (1, 2, 3))
        raise ConfigError(
            f"--num-clients {num_clients} is not a multiple of the {count} training domains "
            f"({_listing(training_domains)}): each domain gets the same number of clients; use {multiples}, …"
        )
    return num_clients // count


def split_by_domain(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    groups: np.ndarray | None,
    holdout_domain: str | None,
    partition: str,
    split_domain: SplitDomain,
) -> list[np.ndarray]:
    """K/D clients per training domain (sorted by name), each domain's samples split by
    ``split_domain(labels of the domain, K/D, rng)`` (indices into the domain's samples)."""
    labels = np.asarray(labels)
    domains = dataset_domains(groups, partition)
    training = check_holdout_domain(domains, holdout_domain)
    per_domain = clients_per_domain(num_clients, training)
    clients: list[np.ndarray] = []
    for name in training:
        members = np.flatnonzero(domains == name)
        try:
            parts = split_domain(labels[members], per_domain, rng)
        except ConfigError as error:
            raise ConfigError(f"domain {name!r} ({len(members)} samples): {error}") from error
        clients.extend(np.sort(members[part]) for part in parts)
    return clients


@register_partitioner("domain")
def domain(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
    min_size: int = 10,
    holdout_domain: str | None = None,
) -> list[np.ndarray]:
    """Feature shift: K/D clients per domain, each domain's samples split IID among them.

    ``holdout_domain`` is given to no client."""
    return split_by_domain(labels, num_clients, rng, groups, holdout_domain, "domain", partial(iid, min_size=min_size))


@register_partitioner("domain-dirichlet")
def domain_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
    alpha: float = 0.5,
    min_size: int = 10,
    cut: str = "unbiased",
    holdout_domain: str | None = None,
) -> list[np.ndarray]:
    """Feature shift + label skew: K/D clients per domain, Dirichlet(α) label skew inside each.

    Each domain's samples are split by ``dirichlet`` (α, cut, min_size); ``holdout_domain`` is
    given to no client."""
    if cut not in DIRICHLET_CUTS:
        raise ConfigError(f"--dirichlet-cut {cut!r} is not one of: {', '.join(DIRICHLET_CUTS)}")
    split = partial(dirichlet, alpha=alpha, min_size=min_size, cut=cut)
    return split_by_domain(labels, num_clients, rng, groups, holdout_domain, "domain-dirichlet", split)


def held_out_indices(groups: np.ndarray | None, holdout_domain: str) -> np.ndarray:
    """Indices (sorted) of every sample of domain ``holdout_domain`` (validated)."""
    domains = dataset_domains(groups, "domain")
    check_holdout_domain(domains, holdout_domain)
    return np.flatnonzero(domains == holdout_domain).astype(np.int64)


def client_domain_names(groups: np.ndarray | None, clients: list[np.ndarray]) -> list[str] | None:
    """Each client's domain (the one domain all its samples share); None when the dataset has no
    domains or a client's samples span several (then no client has one domain)."""
    if groups is None:
        return None
    domains = np.asarray(groups).astype(str)
    names = []
    for indices in clients:
        found = np.unique(domains[indices])
        if len(found) != 1:
            return None
        names.append(str(found[0]))
    return names
