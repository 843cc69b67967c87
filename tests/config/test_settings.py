"""The setting groups own their settings: every RunConfig field is declared by exactly one
group (type, default, help), validation / identity / inertness are the groups', and the
engine-side views take their defaults from them (issue 36)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from pflbench.config.groups import AttackSpec, PrivacySpec, RobustSpec
from pflbench.config.identity import OMITTED_AT_DEFAULT, identity_settings, inert_settings
from pflbench.config.run_config import RunConfig, resolve, validate
from pflbench.config.settings import GROUPS, PrivacySettings, RobustSettings, SettingGroup
from pflbench.config.settings.base import composed_of, declared, option
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS


def test_every_field_is_declared_by_exactly_one_group_with_its_default_and_help() -> None:
    declared_by = [(f.name, group) for group in GROUPS for f in dataclasses.fields(group)]  # type: ignore[arg-type]
    owners = dict(declared_by)
    fields = dataclasses.fields(RunConfig)
    assert [f.name for f in fields if f.name not in owners] == []
    assert len(declared_by) == len(owners) == len(fields)
    for f in fields:
        group = owners[f.name]
        assert f.default == group.default(f.name)
        assert f.metadata["help"] == group.field_of(f.name).metadata["help"]
        assert f.metadata["group"] == group.title


def test_the_engine_views_take_their_defaults_from_the_groups() -> None:
    """trim_frac and dp_clip_lr were written twice (RunConfig and the spec) before issue 36."""
    assert RobustSpec("trimmed-mean").trim_frac == RobustSettings.default("trim_frac") == RunConfig().trim_frac
    assert PrivacySpec("client").clip_lr == PrivacySettings.default("dp_clip_lr") == RunConfig().dp_clip_lr
    assert AttackSpec("scale", 0.2).scale == RunConfig().attack_scale
    config = RunConfig(robust_agg="krum", dp="sample", attack="gaussian", attackers=0.1)
    assert config.robust_spec == RobustSpec("krum")
    assert config.privacy_spec == PrivacySpec("sample")
    assert config.attack_spec == AttackSpec("gaussian", 0.1)


def test_omitted_at_default_is_declared_by_the_groups() -> None:
    assert OMITTED_AT_DEFAULT == {
        "executor": "sequential",
        "finetune_epochs": 0,
        "new_clients": 0.0,
        "threads": 1,
        "precision": "fp32",
        "dp": "off",
        "dropout": 0.0,
        "availability": "always",
        "straggler_model": "none",
        "over_select": 0.0,
        "attack": "none",
        "robust_agg": "none",
    }


def resolved(**settings: Any) -> tuple[RunConfig, Any, Any]:
    algorithm = ALGORITHMS.get(settings.get("algo", "fedavg"))
    hparams = algorithm.hyperparameters()
    config, _ = resolve(RunConfig(num_clients=10, **settings), algorithm, hparams)
    return config, algorithm, hparams


def test_identity_and_inertness_are_the_union_of_the_groups() -> None:
    config, algorithm, hparams = resolved(robust_agg="multi-krum", optimizer="adam")
    identity = identity_settings(config, algorithm, hparams)
    assert identity["robust_agg"] == "multi-krum" and identity["krum_select"] == 0 and "trim_frac" not in identity
    inert = inert_settings(config, algorithm, hparams)
    assert {"trim_frac", "norm_bound", "momentum", "lora_alpha", "attackers", "dp_clip"} <= set(inert)
    assert not {"krum_f", "krum_select"} & set(inert)
    assert not set(inert) & set(identity)  # a setting is either read (in the identity) or inert


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"trim_frac": 0.5}, "--trim-frac"),
        ({"dp": "client", "dp_clip_lr": 0.0}, "--dp-clip-lr"),
        ({"availability_period": 0}, "--availability-period"),
        ({"robust_agg": "median", "dp": "client"}, "replaces the mean"),
        ({"lora_alpha": 0.0}, "--lora-alpha"),
        ({"shift_groups": 1}, "--shift-groups"),
    ],
)
def test_each_group_refuses_its_bad_values(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(resolved(**settings)[0])


def test_a_field_must_take_its_declaration_from_its_group() -> None:
    @dataclass(frozen=True)
    class Things(SettingGroup):
        size: int = option(3, "How many.")

    with pytest.raises(TypeError, match="belongs to no setting group"):

        @composed_of(Things)
        class Stray:
            size: int = declared()
            colour: str = declared()

    with pytest.raises(TypeError, match="declares int"):

        @composed_of(Things)
        class Retyped:
            size: float = declared()

    with pytest.raises(TypeError, match="take its default from Things"):

        @composed_of(Things)
        class Redeclared:
            size: int = 4

    with pytest.raises(TypeError, match="lacks the group settings size"):

        @composed_of(Things)
        class Missing:
            pass

    @dataclass(frozen=True)
    @composed_of(Things)
    class Composed:
        size: int = declared()

    assert Composed().size == 3 and dataclasses.fields(Composed)[0].metadata["help"] == "How many."
