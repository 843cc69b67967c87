"""Run configuration: one flat frozen dataclass (the namespace of the command line, config files
and sweep axes) composed of the setting groups of ``config.settings``, with grouped views, one
per stage that reads a group: ``partition_spec``, ``init_spec``, ``local_spec``,
``federation_spec``, ``executor_spec``.

Each field's type, default, help and choices are declared once, by its group
(``config.settings.*``); ``RunConfig`` lists the fields in their recorded order (the order of
``config.json``) and takes each declaration from its group (``composed_of`` checks that every
field has exactly one group, of the same type). Checks (``validate``; ``check_run`` once the
algorithm, K, the data or the built upload is known), the run identity and the inert options
(``config.identity``) are loops over the groups.

Settings that depend on the algorithm (model, public fraction, optimizer, lr, gradient clipping)
default to ``None`` = unset; ``resolve`` fills them once, the same way for ``run``, ``sweep`` and
library calls.

The CLI's options and the saved ``config.json`` are generated from the dataclasses (this one and
each algorithm's own); ``metadata["group"]`` names a field's group.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from pflbench.config.defaults import AUTO_FIELDS, BASE_DEFAULTS, family_defaults
from pflbench.config.groups import FederationSpec
from pflbench.config.settings import (
    GROUPS,
    AttackSettings,
    BackboneSettings,
    ExecutionSettings,
    ExperimentSettings,
    LocalSettings,
    ModelSettings,
    PartitionSettings,
    PrivacySettings,
    RobustSettings,
    RoundsSettings,
)
from pflbench.config.settings.attack import ATTACKS, MODEL_POISONING, AttackSpec
from pflbench.config.settings.availability import (
    AVAILABILITY_TRACES,
    DEADLINE_POLICIES,
    STRAGGLER_MODELS,
    AvailabilitySettings,
    AvailabilitySpec,
)
from pflbench.config.settings.backbone import InitSpec
from pflbench.config.settings.base import ClientCounts, RunFacts, composed_of, declared, option
from pflbench.config.settings.execution import MAX_THREADS, PRECISIONS, ExecutorSpec
from pflbench.config.settings.experiment import key_values as _key_values
from pflbench.config.settings.local import LocalSpec
from pflbench.config.settings.local import resolved as _resolved
from pflbench.config.settings.new_clients import check_new_clients_fraction, new_client_count
from pflbench.config.settings.partition import FEATURE_SHIFTS, QUANTITY_SKEWS, PartitionSpec, feature_shift_names
from pflbench.config.settings.privacy import DP_MODES, PrivacySpec
from pflbench.config.settings.robust import ROBUST_AGGREGATORS, RobustSpec
from pflbench.errors import ConfigError

__all__ = [  # the names other modules import from here (their owners: config.settings.*)
    "ATTACKS",
    "AVAILABILITY_TRACES",
    "DEADLINE_POLICIES",
    "DP_MODES",
    "FEATURE_SHIFTS",
    "MAX_THREADS",
    "MODEL_POISONING",
    "PRECISIONS",
    "QUANTITY_SKEWS",
    "ROBUST_AGGREGATORS",
    "STRAGGLER_MODELS",
    "VALUE_BEFORE_ADDED",
    "RunConfig",
    "_key_values",
    "check_new_clients_fraction",
    "check_run",
    "feature_shift_names",
    "field_types",
    "hyperparameters_from",
    "new_client_count",
    "option",
    "recorded_fields",
    "recorded_options",
    "resolve",
    "validate",
    "validate_given",
    "with_base_defaults",
]

# Settings added after runs were recorded whose default changes the numbers: the value that
# reproduces a run whose config.json predates them (a rerun fills a missing setting with it).
VALUE_BEFORE_ADDED: dict[str, Any] = {"val_frac": 0.0}


@dataclass(frozen=True)
@composed_of(*GROUPS)
class RunConfig:
    """Everything that determines a run's numbers (plus where to write them). Each field is
    declared by its group (``config.settings``; ``--help`` shows the help text)."""

    # in config.json's order (``dataclasses.asdict``): a new setting goes at the end of its neighbours
    algo: str = declared()
    dataset: str = declared()
    dataset_option: tuple[str, ...] = declared()
    data_dir: str | None = declared()
    partition: str = declared()
    alpha: float = declared()
    shards_per_client: int = declared()
    min_size: int = declared()
    dirichlet_cut: str = declared()
    sizes: str = declared()
    size_param: float = declared()
    feature_shift: str = declared()
    shift_groups: int = declared()
    holdout_domain: str | None = declared()
    partition_file: str | None = declared()
    test_frac: float = declared()
    val_frac: float = declared()
    num_clients: int | None = declared()
    frac: float = declared()
    new_clients: float = declared()
    rounds: int = declared()
    dropout: float = declared()
    availability: str = declared()
    availability_rate: float = declared()
    availability_period: int = declared()
    straggler_model: str = declared()
    straggler_sigma: float = declared()
    sample_time: float = declared()
    bandwidth: float = declared()
    deadline: float | None = declared()
    deadline_policy: str = declared()
    over_select: float = declared()
    dp: str = declared()
    dp_clip: float = declared()
    dp_noise: float = declared()
    dp_delta: float = declared()
    dp_adaptive_quantile: float = declared()
    dp_clip_lr: float = declared()
    dp_count_noise: float = declared()
    attack: str = declared()
    attackers: float = declared()
    attack_scale: float = declared()
    backdoor_target: int = declared()
    backdoor_frac: float = declared()
    robust_agg: str = declared()
    trim_frac: float = declared()
    krum_f: int = declared()
    krum_select: int = declared()
    norm_bound: float = declared()
    local_epochs: int = declared()
    batch_size: int = declared()
    lr: float | None = declared()
    optimizer: str | None = declared()
    momentum: float = declared()
    weight_decay: float = declared()
    max_grad_norm: float | None = declared()
    model: str | None = declared()
    head_layers: int = declared()
    model_option: tuple[str, ...] = declared()
    pretrained: bool = declared()
    weights: str | None = declared()
    public_frac: float | None = declared()
    backbone: str = declared()
    pretrain_epochs: int = declared()
    pretrain_lr: float = declared()
    lora_rank: int | None = declared()
    lora_alpha: float = declared()
    lora_targets: str = declared()
    seed: int = declared()
    eval_every: int | None = declared()
    finetune_epochs: int = declared()
    device: str = declared()
    precision: str = declared()
    executor: str = declared()
    ray_address: str | None = declared()
    ray_workers: int | None = declared()
    threads: int = declared()
    out: str = declared()
    portable: bool = declared()
    checkpoint_every: int = declared()
    save_model: bool = declared()
    log: tuple[str, ...] = declared()
    mlflow_uri: str | None = declared()

    @property
    def num_training_clients(self) -> int:
        """K_train: the clients that take part in training (K less the new clients)."""
        num_clients = _resolved(self.num_clients, "num_clients")
        return num_clients - new_client_count(num_clients, self.new_clients)

    @property
    def sampled_per_round(self) -> int:
        return max(1, round(self.num_training_clients * self.frac))

    @property
    def client_counts(self) -> ClientCounts | None:
        """K_train and M for the run's checks (``check_run``); None while K is unknown (it is set
        when the plan is fitted to the data)."""
        if self.num_clients is None:
            return None
        return ClientCounts(self.num_training_clients, self.sampled_per_round)

    @property
    def resolved_eval_every(self) -> int:
        return RoundsSettings.of(self).resolved_eval_every

    def dataset_options(self) -> dict[str, Any]:
        return ExperimentSettings.of(self).dataset_options()

    def model_options(self) -> dict[str, Any]:
        return ModelSettings.of(self).model_options()

    # ---- the groups each stage receives (built from the setting groups, by keyword) ----------
    @property
    def partition_spec(self) -> PartitionSpec:
        return PartitionSettings.of(self).spec(
            dataset=self.dataset,
            seed=self.seed,
            new_clients=self.new_clients,
            public_frac=_resolved(self.public_frac, "public_frac"),
        )

    @property
    def init_spec(self) -> InitSpec:
        return BackboneSettings.of(self)

    @property
    def federation_spec(self) -> FederationSpec:
        return FederationSpec(
            num_clients=_resolved(self.num_clients, "num_clients"),
            sampled_per_round=self.sampled_per_round,
            rounds=self.rounds,
            eval_every=self.resolved_eval_every,
            seed=self.seed,
            finetune_epochs=self.finetune_epochs,
            local=self.local_spec,
            availability=self.availability_spec,
            privacy=self.privacy_spec,
            attack=self.attack_spec,
            robust=self.robust_spec,
        )

    @property
    def attack_spec(self) -> AttackSpec | None:
        return AttackSettings.of(self).spec()

    @property
    def robust_spec(self) -> RobustSpec | None:
        return RobustSettings.of(self).spec()

    @property
    def privacy_spec(self) -> PrivacySpec | None:
        return PrivacySettings.of(self).spec()

    @property
    def availability_spec(self) -> AvailabilitySpec:
        return AvailabilitySettings.of(self)

    @property
    def executor_spec(self) -> ExecutorSpec:
        return ExecutionSettings.of(self).spec(self.sampled_per_round)

    @property
    def local_spec(self) -> LocalSpec:
        return LocalSettings.of(self).spec(self.precision)


def with_base_defaults(config: RunConfig) -> RunConfig:
    """``config`` with its unset settings at ``BASE_DEFAULTS`` (stages used without an algorithm:
    ``pflbench partition``, ``pflbench pretrain``, ``make_partition``)."""
    unset = {k: v for k, v in BASE_DEFAULTS.items() if getattr(config, k) is None}
    return dataclasses.replace(config, **unset) if unset else config


def resolve(
    config: RunConfig, algorithm: Any, hparams: Any, shared_defaults: dict[str, Any] | None = None
) -> tuple[RunConfig, dict[str, Any]]:
    """Fill the unset (None) settings: the algorithm's ``run_defaults`` first, then
    ``shared_defaults`` (a sweep gives every run of a LoRA grid the same model and data), then
    the defaults of the model's family (``defaults.DEFAULTS_BY_FAMILY``), then ``BASE_DEFAULTS``. Returns the resolved config and the values filled in. The same function
    serves ``run``, ``sweep`` and library calls."""
    chosen = {**(shared_defaults or {}), **algorithm.run_defaults(config, hparams)}
    model = config.model if config.model is not None else chosen.get("model", BASE_DEFAULTS["model"])
    defaults = {**BASE_DEFAULTS, **family_defaults(model, getattr(algorithm, "defaults_by_family", None)), **chosen}
    applied = {name: defaults[name] for name in AUTO_FIELDS if getattr(config, name) is None}
    if config.model is None and not config.model_option and "model_option" in defaults:
        applied["model_option"] = tuple(defaults["model_option"])
    return dataclasses.replace(config, **applied), applied


def validate(config: RunConfig) -> None:
    """Raise ConfigError naming the first bad value and what would be valid (a resolved config):
    each setting group checks its own values (``SettingGroup.validate``), in ``GROUPS`` order."""
    unset = [name for name in AUTO_FIELDS if getattr(config, name) is None]
    if unset:
        raise RuntimeError(f"validate() needs a resolved config; unset: {', '.join(unset)} (config.resolve)")
    for group in GROUPS:
        group.of(config).validate(config)


def check_run(config: RunConfig, run: RunFacts) -> None:
    """Raise ConfigError naming the first value this run cannot serve, once it knows a part of
    ``run`` (the algorithm, K, the data or the built upload): each setting group checks its own
    (``SettingGroup.check_run``), in ``GROUPS`` order."""
    for group in GROUPS:
        group.of(config).check_run(config, run)


def validate_given(config: RunConfig) -> None:
    """``validate`` before ``resolve``: the unset settings (``AUTO_FIELDS``, which the
    algorithm's run defaults fill, and the algorithm needs torch) take stand-ins that pass every
    check, so a bad value that was given is refused before torch or any data is loaded
    (``pflbench run --alpha 0``). ``validate`` checks the resolved config again."""
    passing = {"lr": 1.0, "public_frac": 0.5 if config.backbone == "public" else 0.0}  # public: needs one > 0
    stand_ins = {name: passing.get(name, BASE_DEFAULTS[name]) for name in AUTO_FIELDS if getattr(config, name) is None}
    validate(dataclasses.replace(config, **stand_ins))


def recorded_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The ``RunConfig`` fields a recorded config (``config.json``, ``models/meta.json``'s build)
    holds, JSON lists back to tuples: fields added since are absent (they keep their defaults,
    or the caller sets what runs before them did), fields removed since are ignored."""
    hints = field_types(RunConfig)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in record:
            value = record[f.name]
            if typing.get_origin(hints[f.name]) is tuple and value is not None:
                value = tuple(value)
            values[f.name] = value
    return values


def recorded_options(values: dict[str, Any]) -> dict[str, Any]:
    """Recorded algorithm hyperparameters, JSON lists (nested too) back to tuples."""
    return {name: _tuples(value) for name, value in values.items()}


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (annotations are strings here)."""
    return typing.get_type_hints(cls)


def hyperparameters_from(cls: type, values: dict[str, Any], algo: str) -> Any:
    """Build an algorithm's hyperparameter dataclass, rejecting names it does not have."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        flag = "--" + unknown[0].replace("_", "-")
        valid = ", ".join("--" + n.replace("_", "-") for n in sorted(names)) or "none"
        raise ConfigError(f"{flag} is not an option of --algo {algo}; its options: {valid}")
    hyperparameters = cls(**values)
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        value = getattr(hyperparameters, f.name)
        if choices and value not in choices:
            raise ConfigError(f"--{f.name.replace('_', '-')} {value!r} is not one of: {', '.join(choices)}")
    check = getattr(hyperparameters, "validate", None)
    if check is not None:
        check()
    return hyperparameters
