"""Issue 36: the checks that need the algorithm, K, the data or the built upload live with the
setting group that owns the option (``SettingGroup.check_run``), and a run learns each part
once, so each check runs once; ``--dp sample`` reaches the batch loop with each job, never by
writing into the plugin's program; the help sections and the run's name come from their owners."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pflbench.cli.help import SECTIONS
from pflbench.config.identity import run_name
from pflbench.config.run_config import RunConfig
from pflbench.config.settings import GROUPS, RunFacts
from pflbench.engine.federation import federation_of
from pflbench.errors import ConfigError
from pflbench.runs import prepare as prepare_module
from pflbench.runs.prepare import plan_run, prepare
from pflbench.runs.prepared import RunIdentity

TINY = dict(dataset="digits", model="mlp", rounds=1, backbone="random", val_frac=0.0)
PARTS = ("algorithm", "clients", "data", "upload")


def parts_checked(monkeypatch: pytest.MonkeyPatch, config: RunConfig) -> list[str]:
    """Which parts of ``RunFacts`` the run's checks were given, call by call, while it prepares."""
    given: list[str] = []
    real = prepare_module.check_run

    def spy(config: RunConfig, run: RunFacts) -> None:
        given.extend(part for part in PARTS if getattr(run, part) is not None)
        real(config, run)

    monkeypatch.setattr(prepare_module, "check_run", spy)
    prepare(config)
    return given


@pytest.mark.parametrize("num_clients", [6, None])
def test_each_part_is_checked_once(num_clients: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """K given: its checks run at planning; K unset: once it is fitted (not again in prepare)."""
    config = RunConfig(**TINY, num_clients=num_clients, attack="label-flip", attackers=0.3, robust_agg="median")
    assert sorted(parts_checked(monkeypatch, config)) == sorted(PARTS)


def test_a_check_that_needs_k_refuses_when_k_is_fitted() -> None:
    """--attackers 0.99 of the default K leaves no honest client: refused when K is fitted."""
    plan = plan_run(RunConfig(**TINY, attack="label-flip", attackers=0.99))  # K unknown: passes planning
    with pytest.raises(ConfigError, match="leaving no honest client"):
        prepare(plan)


def test_every_group_declares_its_run_check_and_the_loop_reaches_it() -> None:
    facts = RunFacts()  # nothing known: no check has anything to refuse
    config = plan_run(RunConfig(**TINY, num_clients=4)).config
    for group in GROUPS:
        group.of(config).check_run(config, facts)


def test_dp_sample_travels_with_the_jobs_not_in_the_program() -> None:
    pytest.importorskip("opacus")
    run = prepare(RunConfig(**TINY, num_clients=4, model_option=(), dp="sample"))
    program_before = dict(vars(run.algorithm.program))
    federation = federation_of(run)
    assert federation.sample_privacy is not None
    assert vars(run.algorithm.program) == program_before and "sample_privacy" not in vars(run.algorithm.program)


def test_help_sections_are_the_groups() -> None:
    """Every run setting is shown once, in its group's section, sections in the groups' order."""
    titles = list(dict.fromkeys(group.section or group.title for group in GROUPS))
    assert list(SECTIONS) == titles
    shown = [name for names in SECTIONS.values() for name in names]
    assert sorted(shown) == sorted(f.name for f in dataclasses.fields(RunConfig))


def test_the_run_folder_is_named_from_the_identity_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_run(RunConfig(**TINY, num_clients=4))
    calls: list[Any] = []
    from pflbench.config import identity

    real = identity.identity_settings
    monkeypatch.setattr(identity, "identity_settings", lambda *a: calls.append(a) or real(*a))
    named = RunIdentity.of(plan.config, plan.algorithm_class, plan.hparams)
    assert len(calls) == 1
    assert named.name == run_name(plan.config, plan.algorithm_class, plan.hparams)
    assert named.name.endswith("__" + named.hash)
