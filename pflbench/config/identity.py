"""What a run reads, and so what identifies it: the one owner of "which settings count".

A setting is part of a run's identity (its folder hash, its sweep and leaderboard keys) exactly
when the resolved run reads it; a setting given explicitly that the run would not read is refused
as inert (``inert_settings``), never recorded as if it applied. For the partition, what is read is
decided from the partitioner's own signature (``partition_settings``): a plugin partitioner whose
function takes ``alpha`` reads ``--alpha``, whatever its name.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from pflbench.config import lora
from pflbench.config.groups import PartitionSpec
from pflbench.config.run_config import FEATURE_SHIFTS, RunConfig, feature_shift_names
from pflbench.registry import PARTITIONERS
from pflbench.util.hashing import settings_hash
from pflbench.util.threads import resolved_threads

# Settings a run's identity leaves out at these values (the numbers are those of the default;
# --executor ray gives sequential's numbers too): how a table names a run that omits them.
OMITTED_AT_DEFAULT: dict[str, Any] = {
    "executor": "sequential",
    "finetune_epochs": 0,
    "new_clients": 0.0,
    "threads": 1,
    "precision": "fp32",
    "dp": "off",
    # the system model (engine.availability): left out while it is off (``availability_settings``)
    "dropout": 0.0,
    "availability": "always",
    "straggler_model": "none",
    "over_select": 0.0,
    "attack": "none",  # engine.attacks / engine.robust: left out while off (``attack_settings``)
    "robust_agg": "none",
}
RUN_HASH_LENGTH = 8  # a run folder's name ends in the first 8 characters of its identity's hash

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


def partition_settings(spec: PartitionSpec | RunConfig) -> dict[str, Any]:
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


def feature_shift_settings(spec: PartitionSpec | RunConfig) -> dict[str, Any]:
    """The feature shift a run reads (data.feature_shift): none without --feature-shift, so the
    runs made before it keep their identities."""
    if not spec.feature_shift:
        return {}
    named = feature_shift_names(spec.feature_shift)  # in a fixed order: "noise, rotate" is "rotate,noise"
    canonical = ",".join(name for name in FEATURE_SHIFTS if name in named)
    return {"feature_shift": canonical, "shift_groups": spec.shift_groups}


def partitioner_arguments(spec: PartitionSpec | RunConfig) -> dict[str, Any]:
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


def partition_label(spec: PartitionSpec | RunConfig) -> str:
    """The partition's part of a run-folder name: ``a<α>`` when the partitioner reads α (the
    historical spelling of Dirichlet runs), else the partitioner's name; the folder's hash tells
    apart everything else the partition reads."""
    settings = partition_settings(spec)
    label = f"a{settings['alpha']:g}" if "alpha" in settings else spec.partition
    if "sizes" in settings:
        label += f"-{spec.sizes}{spec.size_param:g}"
    return label + ("-shift" if spec.feature_shift else "")


def run_identity(config: RunConfig, algorithm: Any, hyperparameters: Any) -> dict[str, Any]:
    """Exactly the settings a resolved run reads: an inert option (``--shards-per-client`` under
    Dirichlet, ``--lora-alpha`` without LoRA, ``--momentum`` with Adam, ...) is left out."""
    lora_rank = lora.lora_rank(algorithm, config, hyperparameters)
    init = config.init_spec
    identity: dict[str, Any] = {
        "algo": config.algo,
        "dataset": config.dataset,
        "dataset_options": config.dataset_options(),
        **partition_identity(config.partition_spec),
        "seed": config.seed,
        "model": config.model,
        "model_options": config.model_options(),
        "rounds": config.rounds,
        "frac": config.frac,
        # every N ≥ rounds evaluates only after the last round: one run, one identity
        "eval_every": min(config.resolved_eval_every, config.rounds),
        **config.local_spec.identity(),
        "device": config.device.split(":")[0],
        "algo_hparams": hyperparameter_identity(hyperparameters),
    }
    if getattr(algorithm, "uses_head_layers", False) or lora_rank is not None:
        identity["head_layers"] = config.head_layers
    if config.executor not in ("sequential", "ray"):  # ray gives sequential's numbers: the same run
        identity["executor"] = config.executor
    if config.finetune_epochs != OMITTED_AT_DEFAULT["finetune_epochs"]:
        identity["finetune_epochs"] = config.finetune_epochs
    if config.new_clients != OMITTED_AT_DEFAULT["new_clients"]:
        identity["new_clients"] = config.new_clients
    # --precision bf16 changes the numbers; fp32 is left out, so older runs keep their folders
    if config.precision != OMITTED_AT_DEFAULT["precision"]:
        identity["precision"] = config.precision
    identity.update(availability_settings(config))  # none while it is off: older runs keep their folders
    identity.update(privacy_settings(config))  # none without --dp: older runs keep their folders
    identity.update(attack_settings(config))  # none without --attack / --robust-agg: older runs keep their folders
    threads = cpu_threads(config)
    if threads is not None and threads != OMITTED_AT_DEFAULT["threads"]:
        identity["threads"] = threads
    if config.pretrained or config.weights:
        identity.update(pretrained=config.pretrained, weights=config.weights)
    if init.pretrains(lora_rank is not None):
        identity.update(backbone="public", pretrain_epochs=config.pretrain_epochs, pretrain_lr=config.pretrain_lr)
    if lora_rank is not None:
        identity.update(lora_rank=lora_rank, lora_alpha=config.lora_alpha, lora_targets=config.lora_targets)
    return identity


def hyperparameter_identity(hyperparameters: Any) -> dict[str, Any]:
    """Every hyperparameter, except one declared ``option(..., omit_at_default=True)`` while it is
    at its default: an option added to an algorithm after runs were made, so that the runs that
    leave it unset keep their folders (the option must then leave their numbers unchanged)."""
    values = dataclasses.asdict(hyperparameters)
    for field in dataclasses.fields(hyperparameters):
        if field.metadata.get("omit_at_default") and values[field.name] == field.default:
            del values[field.name]
    return values


def availability_settings(config: RunConfig) -> dict[str, Any]:
    """The availability and system-model settings a run reads (engine.availability): none while
    it is off (``AvailabilitySpec.active``); else each setting that applies."""
    spec = config.availability_spec
    if not spec.active:
        return {}
    read: dict[str, Any] = {"dropout": spec.dropout, "availability": spec.availability}
    if spec.availability != "always":
        read["availability_rate"] = spec.availability_rate
    if spec.availability == "cyclic":
        read["availability_period"] = spec.availability_period
    read["straggler_model"] = spec.straggler_model
    if spec.straggler_model != "none":
        read["straggler_sigma"] = spec.straggler_sigma
    read.update(sample_time=spec.sample_time, bandwidth=spec.bandwidth, deadline=spec.deadline)
    if spec.deadline is not None:
        read["deadline_policy"] = spec.deadline_policy
    read["over_select"] = spec.over_select
    return read


def privacy_settings(config: RunConfig) -> dict[str, Any]:
    """The differential-privacy settings a run reads (engine.privacy): none without --dp; the
    adaptive clipping's settings only with --dp-adaptive-quantile."""
    if config.dp == "off":
        return {}
    read: dict[str, Any] = {"dp": config.dp, "dp_clip": config.dp_clip, "dp_noise": config.dp_noise}
    read["dp_delta"] = config.dp_delta  # the ε reported is part of the run's results
    if config.dp_adaptive_quantile:
        read.update(
            dp_adaptive_quantile=config.dp_adaptive_quantile,
            dp_clip_lr=config.dp_clip_lr,
            dp_count_noise=config.dp_count_noise,
        )
    return read


def attack_settings(config: RunConfig) -> dict[str, Any]:
    """The attack and robust-aggregation settings a run reads (engine.attacks, engine.robust):
    none while both are off; else each setting that applies."""
    read: dict[str, Any] = {}
    if config.attack != "none":
        read.update(attack=config.attack, attackers=config.attackers)
        if config.attack in ("scale", "gaussian"):
            read["attack_scale"] = config.attack_scale
        if config.attack == "backdoor":
            read.update(backdoor_target=config.backdoor_target, backdoor_frac=config.backdoor_frac)
    if config.robust_agg != "none":
        read["robust_agg"] = config.robust_agg
        read.update(
            {
                "trimmed-mean": {"trim_frac": config.trim_frac},
                "krum": {"krum_f": config.krum_f},
                "multi-krum": {"krum_f": config.krum_f, "krum_select": config.krum_select},
                "norm-bound": {"norm_bound": config.norm_bound},
            }.get(config.robust_agg, {})
        )
    return read


def attack_inert(config: RunConfig) -> dict[str, str]:
    """The attack and robust-aggregation settings this run does not read, each with why."""
    read = attack_settings(config)
    reasons = {
        "attackers": "no --attack is set (label-flip, sign-flip, scale, gaussian or backdoor)",
        "attack_scale": "only --attack scale or gaussian reads it",
        "backdoor_target": "only --attack backdoor reads it",
        "backdoor_frac": "only --attack backdoor reads it",
        "trim_frac": "only --robust-agg trimmed-mean reads it",
        "krum_f": "only --robust-agg krum or multi-krum reads it",
        "krum_select": "only --robust-agg multi-krum reads it",
        "norm_bound": "only --robust-agg norm-bound reads it",
    }
    return {name: why for name, why in reasons.items() if name not in read}


def privacy_inert(config: RunConfig) -> dict[str, str]:
    """The differential-privacy settings this run does not read, each with why."""
    read = privacy_settings(config)
    off = "no --dp (client or sample) is set"
    adaptive_off = "adaptive clipping is off (give --dp-adaptive-quantile with --dp client)"
    reasons = {
        "dp_clip": off,
        "dp_noise": off,
        "dp_delta": off,
        "dp_adaptive_quantile": off if config.dp == "off" else "adaptive clipping adapts client updates (--dp client)",
        "dp_clip_lr": adaptive_off,
        "dp_count_noise": adaptive_off,
    }
    if config.dp == "client":
        del reasons["dp_adaptive_quantile"]  # read at 0 too: fixed clipping
    return {name: why for name, why in reasons.items() if name not in read}


def availability_inert(config: RunConfig) -> dict[str, str]:
    """The availability settings this run does not read, each with why."""
    read = availability_settings(config)
    reasons = {
        "availability_rate": "only --availability bernoulli or cyclic reads it",
        "availability_period": "only --availability cyclic reads it",
        "straggler_sigma": "only --straggler-model lognormal reads it",
        "deadline_policy": "it says what --deadline does to late clients; no --deadline is set",
        "sample_time": "it times the simulated rounds, simulated only with --dropout, --availability, "
        "--straggler-model, --deadline or --over-select",
        "bandwidth": "it times the simulated rounds, simulated only with --dropout, --availability, "
        "--straggler-model, --deadline or --over-select",
    }
    return {name: why for name, why in reasons.items() if name not in read}


def cpu_threads(config: RunConfig) -> int | None:
    """The CPU thread count that shapes a run's numbers (None on an accelerator). torch's CPU
    reductions split their work by thread, so 1 and 2 threads give different numbers (measured
    for mlp, cnn, cnn_bn and the ViT of a LoRA run, issue 25): the count is part of the identity
    (left out at 1, so runs made before it counted keep their folders)."""
    return resolved_threads(config.threads) if config.device.split(":")[0] == "cpu" else None


def identity_hash(identity: dict[str, Any]) -> str:
    return settings_hash(identity, RUN_HASH_LENGTH)


def run_name(config: RunConfig, algorithm: Any, hyperparameters: Any) -> str:
    """``<algo>__<dataset>__<partition>__s<seed>__<hash>`` with a hash of every setting read."""
    digest = identity_hash(run_identity(config, algorithm, hyperparameters))
    split = partition_label(config)
    return f"{config.algo}__{config.dataset}__{split}__s{config.seed}__{digest}"


def inert_settings(config: RunConfig, algorithm: Any, hyperparameters: Any) -> dict[str, str]:
    """The settings a resolved run would not read, each with why: given explicitly they are
    refused (``--momentum`` with Adam, LoRA options without LoRA, ...), never recorded as if
    they applied. (``run_identity`` leaves them out.)"""
    uses_lora = lora.is_lora_run(algorithm, config, hyperparameters)
    inert: dict[str, str] = {}
    if config.optimizer is not None and config.optimizer != "sgd":
        inert["momentum"] = f"--optimizer {config.optimizer} has no momentum (use --optimizer sgd)"
    if not uses_lora:
        for name in ("lora_alpha", "lora_targets"):
            inert[name] = f"--algo {config.algo} without --lora-rank trains no LoRA layers"
    if not (getattr(algorithm, "uses_head_layers", False) or uses_lora):
        inert["head_layers"] = f"--algo {config.algo} has no private head (fedper, fedrep or LoRA runs use it)"
    inert.update(partition_inert(config))
    inert.update(availability_inert(config))
    inert.update(privacy_inert(config))
    inert.update(attack_inert(config))
    inert_hyperparameters = getattr(algorithm, "inert_hyperparameters", None)
    if inert_hyperparameters is not None and hyperparameters is not None:
        inert.update(inert_hyperparameters(config, hyperparameters))
    if not config.init_spec.pretrains(uses_lora):
        for name in ("pretrain_epochs", "pretrain_lr"):
            inert[name] = "this run pretrains no backbone (LoRA runs or --backbone public do)"
    return inert


def partition_inert(spec: PartitionSpec | RunConfig) -> dict[str, str]:
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
