"""The partition: how the pooled data is split into clients (label skew by a partitioner,
quantity skew, feature shift, held-out domain, a preset file) and each client's test and
validation splits.

What a partitioner reads is decided from its own signature (``partition_settings``): a plugin
partitioner whose function takes ``alpha`` reads ``--alpha``, whatever its name.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, finite, option, refuse_first
from pflbench.errors import ConfigError
from pflbench.registry import PARTITIONERS

QUANTITY_SKEWS = ("none", "powerlaw", "lognormal", "dirichlet")  # --sizes (data.quantity)
FEATURE_SHIFTS = ("rotate", "contrast", "color", "noise", "blur", "invert")  # --feature-shift (data.feature_shift)
# RunConfig field → the keyword a partitioner function takes for it. A partitioner reads a
# setting iff its signature has that keyword (``data.partitioners.partition`` passes exactly these).
PARTITIONER_KEYWORDS: dict[str, str] = {
    "alpha": "alpha",
    "min_size": "min_size",
    "shards_per_client": "shards_per_client",
    "dirichlet_cut": "cut",
    "holdout_domain": "holdout_domain",  # the domain partitioners (data.domains)
    "sizes": "sizes",  # quantity skew (data.quantity): read only when not "none" (see partition_settings)
    "size_param": "size_param",
}
# How a partition setting is shown in a run's name, a leaderboard column and a plot title.
PARTITION_SETTING_LABELS: dict[str, str] = {"alpha": "α", "shards_per_client": "shards", "dirichlet_cut": "cut"}
QUANTITY_SETTINGS = ("sizes", "size_param")  # left out of every identity at --sizes none (runs before them)
# What has the partition's fields as attributes: a PartitionSpec, PartitionSettings or a RunConfig.
Partitioned = Any


@dataclass(frozen=True)
class PartitionSettings(SettingGroup):
    title = "Partition"
    section = "Data and partition"

    partition: str = option("dirichlet", "Partitioner (see `pflbench list partitioners`).")
    alpha: float = option(0.5, "Dirichlet concentration: 0.1 strong skew, 1 mild, 100 ≈ IID.")
    shards_per_client: int = option(2, "Shards per client for --partition shards.")
    min_size: int = option(10, "Minimum samples per client (dirichlet redraws until met).")
    dirichlet_cut: str = option(
        "unbiased",
        "How dirichlet turns class proportions into counts: unbiased = largest-remainder "
        "rounding, no client favoured; floor = PFLlib's cumsum cut (the last client gets every "
        "class's rounding leftovers); flower = the floor cut with flwr-datasets' self-balancing "
        "rule.",
        choices=("unbiased", "floor", "flower"),
    )
    sizes: str = option(
        "none",
        "Quantity skew: client sizes drawn from a size distribution (data.quantity) instead of "
        "as the partitioner makes them: powerlaw (n_k ∝ rank^-β, ranks shuffled), lognormal "
        "(weights e^{σ·z}), dirichlet (weights ~ Dir(β·1_K)), with the parameter --size-param; "
        "each client gets at least --min-size. Read by iid (quantity skew only) and "
        "dirichlet-client (with label skew). none = off.",
        choices=QUANTITY_SKEWS,
    )
    size_param: float = option(
        1.0,
        "Parameter of --sizes: β of powerlaw (≥ 0, larger: more skew), σ of lognormal (≥ 0, larger: "
        "more skew), β of dirichlet (> 0, smaller: more skew).",
    )
    feature_shift: str = option(
        "",
        "Feature shift: comma-separated transforms (rotate, contrast, color, noise, blur, invert) "
        "applied once at load to each client's samples, at its domain's strength "
        "(data.feature_shift; seeded, recorded in partition.json as client_domains). Image "
        "datasets only; empty = off.",
    )
    shift_groups: int = option(
        0, "Domains of --feature-shift: client k is in domain k mod G; 0 = one domain per client."
    )
    holdout_domain: str | None = option(
        None,
        "Domain kept out of training by --partition domain / domain-dirichlet (e.g. sketch for "
        "pacs): no client holds it, and its samples give the out-of-domain accuracy ood_acc.",
    )
    partition_file: str | None = option(
        None,
        "Use exactly this partition (a `pflbench partition --export` JSON or a run's "
        "partition.json); it sets --num-clients. flwr:<Partitioner>[:key=value,...] runs a "
        "flwr-datasets partitioner instead (pip install 'pflbench[flwr]').",
    )
    test_frac: float = option(0.25, "Fraction of each client's samples held out for its test split.")
    val_frac: float = option(
        0.1,
        "Fraction of each client's samples carved out of its training part as its validation split "
        "(stratified by label; the test split is unchanged): val_* metrics, for tuning on validation, "
        "never on test. 0 = none.",
    )
    num_clients: int | None = option(
        None,
        "Number of clients K [default: a partition file's K, else 20; given with a partition file, it must agree].",
    )
    public_frac: float | None = option(
        None,
        "Fraction of the pooled data held out as public, given "
        "to no client (pretrains the backbone; keep it equal across "
        "compared runs) [default: 0; LoRA runs 0.2].",
    )

    def spec(self, dataset: str, seed: int, new_clients: float, public_frac: float) -> PartitionSpec:
        """What the partition stage reads: these settings (``public_frac`` resolved) and the
        dataset, seed and new-client fraction of their own groups."""
        mine = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return PartitionSpec(
            **{**mine, "public_frac": public_frac}, dataset=dataset, seed=seed, new_clients=new_clients
        )

    def validate(self, config: Any) -> None:
        public_frac = float(self.public_frac or 0)
        refuse_first(
            [
                (finite(self.alpha) and self.alpha > 0, f"--alpha must be a finite number > 0, got {self.alpha}"),
                (
                    self.num_clients is None or self.num_clients >= 1,
                    f"--num-clients must be ≥ 1, got {self.num_clients}",
                ),
                (0 < self.test_frac < 1, f"--test-frac must be in (0, 1), got {self.test_frac}"),
                (
                    math.isfinite(self.val_frac) and 0 <= self.val_frac < 1,
                    f"--val-frac must be in [0, 1) (0 = no validation split), got {self.val_frac}",
                ),
                (
                    self.val_frac + self.test_frac < 1,
                    f"--val-frac {self.val_frac:g} + --test-frac {self.test_frac:g} = "
                    f"{self.val_frac + self.test_frac:g} leaves no training samples; their sum must be < 1",
                ),
                (self.shards_per_client >= 1, f"--shards-per-client must be ≥ 1, got {self.shards_per_client}"),
                (self.min_size >= 2, f"--min-size must be ≥ 2 (a train and a test sample), got {self.min_size}"),
                (0 <= public_frac < 1, f"--public-frac must be in [0, 1), got {self.public_frac}"),
            ]
        )
        check_quantity_and_shift(self)

    def identity(self, run: RunReads) -> dict[str, Any]:
        return partition_identity(run.config.partition_spec)

    def inert(self, run: RunReads) -> dict[str, str]:
        return partition_inert(self)


@dataclass(frozen=True)
class PartitionSpec:
    """What the partition stage reads (field names as in ``RunConfig``; built from the groups by
    ``RunConfig.partition_spec``, defaults in ``PartitionSettings``)."""

    dataset: str
    partition: str
    num_clients: int | None  # None until fitted (data.partition.fit_num_clients)
    alpha: float
    shards_per_client: int
    min_size: int
    test_frac: float
    public_frac: float
    seed: int
    dirichlet_cut: str
    partition_file: str | None
    val_frac: float  # each client's validation split, carved out of its train split
    new_clients: float  # fraction of clients held out of training (data.partition.choose_new_clients)
    sizes: str  # quantity skew: the size distribution (data.quantity); "none" = off
    size_param: float  # its parameter (β or σ)
    feature_shift: str  # comma-separated transforms (data.feature_shift); "" = off
    shift_groups: int  # domains of the feature shift; 0 = one per client
    holdout_domain: str | None  # domain kept out of training for ood_acc (data.domains); None = off


def feature_shift_names(text: str) -> tuple[str, ...]:
    """The transforms of ``--feature-shift`` (comma-separated), checked: ConfigError on an unknown one."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if text.strip() and not names:  # ",," is not the off value "": refuse it rather than run unshifted
        raise ConfigError(f"--feature-shift {text!r} names no transform; valid: {', '.join(FEATURE_SHIFTS)}")
    for name in names:
        if name not in FEATURE_SHIFTS:
            raise ConfigError(f"--feature-shift {name!r} is not a transform; valid: {', '.join(FEATURE_SHIFTS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--feature-shift {text!r} names a transform twice")
    return names


def check_quantity_and_shift(spec: Partitioned) -> None:
    """--sizes, --size-param, --feature-shift and --shift-groups: one ConfigError line on a bad value."""
    if spec.sizes not in QUANTITY_SKEWS:
        raise ConfigError(f"--sizes {spec.sizes!r} is not one of: {', '.join(QUANTITY_SKEWS)}")
    zero_allowed = spec.sizes in ("powerlaw", "lognormal")  # 0: equal sizes; Dir(0) is undefined
    param = spec.size_param
    if spec.sizes != "none" and not (math.isfinite(param) and (param >= 0 if zero_allowed else param > 0)):
        wanted = "≥ 0" if zero_allowed else "> 0"
        raise ConfigError(f"--size-param for --sizes {spec.sizes} must be a finite number {wanted}, got {param}")
    feature_shift_names(spec.feature_shift)
    if spec.shift_groups < 0 or spec.shift_groups == 1:
        raise ConfigError(f"--shift-groups must be 0 (one domain per client) or ≥ 2 domains, got {spec.shift_groups}")


def partition_settings(spec: Partitioned) -> dict[str, Any]:
    """The partitioner's own settings that this run reads, by the partitioner's signature
    (none for a preset partition file: the file is the partition)."""
    if spec.partition_file is not None:
        return {}
    accepted = inspect.signature(PARTITIONERS.get(spec.partition)).parameters
    return {
        field: getattr(spec, field)
        for field, keyword in PARTITIONER_KEYWORDS.items()
        if keyword in accepted and not (field in QUANTITY_SETTINGS and spec.sizes == "none")
    }


def feature_shift_settings(spec: Partitioned) -> dict[str, Any]:
    """The feature shift a run reads (data.feature_shift): none without --feature-shift, so the
    runs made before it keep their identities."""
    if not spec.feature_shift:
        return {}
    named = feature_shift_names(spec.feature_shift)  # in a fixed order: "noise, rotate" is "rotate,noise"
    canonical = ",".join(name for name in FEATURE_SHIFTS if name in named)
    return {"feature_shift": canonical, "shift_groups": spec.shift_groups}


def partitioner_arguments(spec: Partitioned) -> dict[str, Any]:
    """``partition_settings`` under the partitioner's keyword names: what the partitioner is called with."""
    return {PARTITIONER_KEYWORDS[field]: value for field, value in partition_settings(spec).items()}


def partition_identity(spec: PartitionSpec) -> dict[str, Any]:
    """The partition stage's share of a run's identity."""
    read: dict[str, Any] = {
        "partition": spec.partition,
        "num_clients": spec.num_clients,
        "test_frac": spec.test_frac,
        "val_frac": spec.val_frac,
        "public_frac": spec.public_frac,
    }
    if spec.partition_file is not None:
        return {**read, "partition_file": spec.partition_file, **feature_shift_settings(spec)}
    return {**read, **partition_settings(spec), **feature_shift_settings(spec)}


def partition_label(spec: Partitioned) -> str:
    """The partition's part of a run-folder name: ``a<α>`` when the partitioner reads α (the
    historical spelling of Dirichlet runs), else the partitioner's name; the folder's hash tells
    apart everything else the partition reads."""
    settings = partition_settings(spec)
    label = f"a{settings['alpha']:g}" if "alpha" in settings else spec.partition
    if "sizes" in settings:
        label += f"-{spec.sizes}{spec.size_param:g}"
    return label + ("-shift" if spec.feature_shift else "")


def partition_inert(spec: Partitioned) -> dict[str, str]:
    """The partitioner settings this partition does not read (by the partitioner's signature),
    each with why. A preset partition file reads none of them, but refuses none either: they
    are simply not part of such a run's identity."""
    shift = {} if spec.feature_shift else {"shift_groups": "without --feature-shift there are no domains"}
    if spec.partition_file is not None:
        return shift
    read = partition_settings(spec)
    takes = ", ".join(f"--{field.replace('_', '-')}" for field in read) or "none of them"
    inert = {
        field: f"--partition {spec.partition} does not read it (its partitioner takes: {takes})"
        for field in PARTITIONER_KEYWORDS
        if field not in read
    }
    if "sizes" in inert:
        takers = [n for n in PARTITIONERS.names() if "sizes" in inspect.signature(PARTITIONERS.get(n)).parameters]
        inert["sizes"] = f"--partition {spec.partition} draws no client sizes (--sizes works with: {', '.join(takers)})"
    if spec.sizes == "none":  # the off value is never refused; its parameter is read by no one
        inert.pop("sizes", None)
        inert["size_param"] = "--sizes none draws no client sizes (give --sizes powerlaw, lognormal or dirichlet)"
    return {**inert, **shift}
