"""What a run reads, and so what identifies it: the one owner of "which settings count".

A setting is part of a run's identity (its folder hash, its sweep and leaderboard keys) exactly
when the resolved run reads it; a setting given explicitly that the run would not read is refused
as inert (``inert_settings``), never recorded as if it applied. Each setting group says what of
it a run reads and what not (``config.settings``: ``SettingGroup.identity`` and ``.inert``);
this module loops over the groups, adds the algorithm's hyperparameters, and names and hashes
the result. For the partition, what is read is decided from the partitioner's own signature
(``config.settings.partition.partition_settings``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pflbench.config import lora
from pflbench.config.run_config import RunConfig
from pflbench.config.settings import (
    GROUPS,
    OMITTED_AT_DEFAULT,
    AttackSettings,
    AvailabilitySettings,
    BackboneSettings,
    LoRASettings,
    PrivacySettings,
    RobustSettings,
    RunReads,
)
from pflbench.config.settings.execution import cpu_threads
from pflbench.config.settings.partition import (
    PARTITION_SETTING_LABELS,
    PARTITIONER_KEYWORDS,
    QUANTITY_SETTINGS,
    feature_shift_settings,
    partition_identity,
    partition_inert,
    partition_label,
    partition_settings,
    partitioner_arguments,
)
from pflbench.util.hashing import settings_hash

__all__ = [  # the partition's and the threads' owners are config.settings.partition / .execution
    "IDENTITY_ORDER",
    "OMITTED_AT_DEFAULT",
    "PARTITIONER_KEYWORDS",
    "PARTITION_SETTING_LABELS",
    "QUANTITY_SETTINGS",
    "RUN_HASH_LENGTH",
    "cpu_threads",
    "feature_shift_settings",
    "folder_name",
    "hyperparameter_identity",
    "identity_hash",
    "identity_settings",
    "inert_settings",
    "partition_identity",
    "partition_inert",
    "partition_label",
    "partition_settings",
    "partitioner_arguments",
    "run_name",
]

RUN_HASH_LENGTH = 8  # a run folder's name ends in the first 8 characters of its identity's hash


def _fields(group: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(group))


# The order config.json has always listed a run's identity in (the hash sorts its keys: the
# order is only how the file reads). A key not listed follows, in the order of ``GROUPS``.
IDENTITY_ORDER: tuple[str, ...] = (
    *("algo", "dataset", "dataset_options"),
    *("partition", "num_clients", "test_frac", "val_frac", "public_frac", "partition_file"),
    *PARTITIONER_KEYWORDS,
    *("feature_shift", "shift_groups", "seed", "model", "model_options", "rounds", "frac", "eval_every"),
    *("local_epochs", "batch_size", "lr", "optimizer", "weight_decay", "max_grad_norm", "momentum"),
    *("device", "algo_hparams", "head_layers", "executor", "finetune_epochs", "new_clients", "precision"),
    *_fields(AvailabilitySettings),
    *_fields(PrivacySettings),
    *_fields(AttackSettings),
    *_fields(RobustSettings),
    "threads",
    *_fields(BackboneSettings),
    *_fields(LoRASettings),
)


def run_reads(config: RunConfig, algorithm: Any, hyperparameters: Any) -> RunReads:
    """What the setting groups need to know of the run besides their own settings."""
    return RunReads(config, algorithm, hyperparameters, lora.lora_rank(algorithm, config, hyperparameters))


def identity_settings(config: RunConfig, algorithm: Any, hyperparameters: Any) -> dict[str, Any]:
    """Exactly the settings a resolved run reads (config.json's ``identity``): each group's share
    (``SettingGroup.identity``) and the algorithm's hyperparameters. An inert option
    (``--shards-per-client`` under Dirichlet, ``--lora-alpha`` without LoRA, ``--momentum`` with
    Adam, ...) is left out. Its hash: ``identity_hash``."""
    run = run_reads(config, algorithm, hyperparameters)
    read: dict[str, Any] = {"algo_hparams": hyperparameter_identity(hyperparameters)}
    for group in GROUPS:
        read.update(group.of(config).identity(run))
    ordered = {key: read[key] for key in IDENTITY_ORDER if key in read}
    return {**ordered, **{key: value for key, value in read.items() if key not in ordered}}


def hyperparameter_identity(hyperparameters: Any) -> dict[str, Any]:
    """Every hyperparameter, except one declared ``option(..., omit_at_default=True)`` while it is
    at its default: an option added to an algorithm after runs were made, so that the runs that
    leave it unset keep their folders (the option must then leave their numbers unchanged)."""
    values = dataclasses.asdict(hyperparameters)
    for field in dataclasses.fields(hyperparameters):
        if field.metadata.get("omit_at_default") and values[field.name] == field.default:
            del values[field.name]
    return values


def identity_hash(identity: dict[str, Any]) -> str:
    """The run-folder hash of ``identity_settings`` (config.json's ``identity_hash``)."""
    return settings_hash(identity, RUN_HASH_LENGTH)


def run_name(config: RunConfig, algorithm: Any, hyperparameters: Any) -> str:
    """``<algo>__<dataset>__<partition>__s<seed>__<hash>`` with a hash of every setting read
    (a run computes its identity once: ``folder_name`` names it from the hash)."""
    return folder_name(config, identity_hash(identity_settings(config, algorithm, hyperparameters)))


def folder_name(config: RunConfig, digest: str) -> str:
    """The run folder's name for the identity hash ``digest`` of ``config``."""
    return f"{config.algo}__{config.dataset}__{partition_label(config)}__s{config.seed}__{digest}"


def inert_settings(config: RunConfig, algorithm: Any, hyperparameters: Any) -> dict[str, str]:
    """The settings a resolved run would not read, each with why: given explicitly they are
    refused (``--momentum`` with Adam, LoRA options without LoRA, ...), never recorded as if
    they applied (``identity_settings`` leaves them out). Each group says which of its own
    (``SettingGroup.inert``); the algorithm which of its hyperparameters."""
    run = run_reads(config, algorithm, hyperparameters)
    inert: dict[str, str] = {}
    for group in GROUPS:
        inert.update(group.of(config).inert(run))
    inert_hyperparameters = getattr(algorithm, "inert_hyperparameters", None)
    if inert_hyperparameters is not None and hyperparameters is not None:
        inert.update(inert_hyperparameters(config, hyperparameters))
    return inert
