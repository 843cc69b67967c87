"""Declared capabilities (engine.capabilities): the engine reads what a class declares, never
which hooks it overrides. A plugin that overrides only a diagnostics hook keeps every capability
it declares (--dp, --attack, --robust-agg, streaming aggregation); a class that declares nothing
gets nothing (a FedAvg subclass with its own aggregate never silently streams FedAvg's average);
the refusals keep their words; every built-in declares."""

from __future__ import annotations

from typing import Any

import pytest

from pflbench import Capabilities, ClientProgram, ProgramCapabilities, register_algorithm
from pflbench.algorithms.fedavg import FedAvg
from pflbench.config.run_config import RunConfig
from pflbench.engine.capabilities import PROGRAM_UNDECLARED, UNDECLARED, refusal
from pflbench.engine.privacy import client_level_refusal, sample_level_refusal
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import plan_run, prepare

TINY = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, optimizer="adam", lr=0.01, backbone="random")


@register_algorithm("test_caps_logging")
class LoggingAvg(FedAvg):
    """FedAvg that overrides only round_diagnostics, to log a number that reads no upload."""

    capabilities = FedAvg.capabilities  # restated: its overrides keep every FedAvg promise
    calls: list[int] = []

    def round_diagnostics(self, updates: list[Any]) -> dict[str, Any]:
        type(self).calls.append(len(updates))
        return {"reported": len(updates)}


@register_algorithm("test_caps_undeclared")
class ScaledAvg(FedAvg):
    """A third-party FedAvg subclass with its own aggregate that declares nothing."""

    def aggregate(self, updates: list[Any]) -> None:
        super().aggregate(updates)
        for tensor in self.global_state.values():
            tensor.mul_(0.5)


@register_algorithm("test_caps_not_averaged")
class NotAveraged(FedAvg):
    capabilities = Capabilities.of_defaults(averaged_upload=False)


def rounds_of(tmp_path, algo: str, **settings: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    run_experiment(RunConfig(algo=algo, out=str(tmp_path), **{**TINY, **settings}), on_round=records.append)
    return records


def test_capabilities_are_not_inherited() -> None:
    class Plain(FedAvg):
        pass

    class PlainProgram(ClientProgram):
        pass

    assert Plain.capabilities is UNDECLARED and ScaledAvg.capabilities is UNDECLARED
    assert PlainProgram.capabilities is PROGRAM_UNDECLARED
    assert LoggingAvg.capabilities == FedAvg.capabilities == Capabilities.of_defaults()
    assert ClientProgram.capabilities == ProgramCapabilities.of_defaults()


def test_the_old_flag_is_refused_not_ignored() -> None:
    with pytest.raises(TypeError, match="averaged_upload"):

        class Old(FedAvg):
            upload_is_averaged_update = False


def test_a_diagnostics_only_plugin_keeps_streaming_dp_attacks_and_robust_rules(tmp_path) -> None:
    assert client_level_refusal(LoggingAvg) is None and sample_level_refusal(LoggingAvg) is None
    prepared = prepare(RunConfig(algo="test_caps_logging", out=str(tmp_path / "built"), **TINY))
    assert prepared.algorithm.streaming_aggregate([1, 2]) is not None  # uploads folded in as they arrive
    plain = rounds_of(tmp_path / "plain", "test_caps_logging")
    assert [r["reported"] for r in plain] == [4, 4]  # its diagnostics still run (updates without tensors)
    scenarios = {  # each is refused at planning for an algorithm that does not declare it
        "attackers": dict(attack="sign-flip", attackers=0.25),
        "reported": dict(robust_agg="median"),
        "dp_epsilon": dict(dp="client", dp_clip=0.5, dp_noise=0.5),
    }
    for key, settings in scenarios.items():
        if key == "dp_epsilon":
            pytest.importorskip("opacus")
        records = rounds_of(tmp_path / key, "test_caps_logging", **settings)
        assert len(records) == 2 and all("reported" in r and key in r for r in records), key


def test_an_undeclared_aggregate_is_never_bypassed(tmp_path) -> None:
    """A FedAvg subclass with its own aggregate and no declaration: no streamed FedAvg average
    (its aggregate gets the list), and DP, model poisoning and robust rules are refused."""
    prepared = prepare(RunConfig(algo="test_caps_undeclared", out=str(tmp_path), **TINY))
    assert prepared.algorithm.streaming_aggregate([1, 2]) is None
    assert "declares no capabilities" in client_level_refusal(ScaledAvg)
    with pytest.raises(ConfigError, match="--robust-agg median cannot replace the aggregation"):
        plan_run(RunConfig(algo="test_caps_undeclared", robust_agg="median", out=str(tmp_path), **TINY))


def test_declared_no_averaged_upload_is_refused_dp_with_the_same_words(tmp_path) -> None:
    pytest.importorskip("opacus")
    with pytest.raises(ConfigError) as error:
        plan_run(RunConfig(algo="test_caps_not_averaged", dp="client", out=str(tmp_path), **TINY))
    assert str(error.value) == (
        "--dp client cannot make --algo test_caps_not_averaged private: "
        "its upload is not a model update averaged by the FedAvg rule"
    )
    with pytest.raises(ConfigError) as error:
        plan_run(RunConfig(algo="fedcac", dp="client", out=str(tmp_path), **TINY))
    assert str(error.value) == (
        "--dp client cannot make --algo fedcac private: its upload is not a model update averaged by the FedAvg rule"
    )
    assert sample_level_refusal(NotAveraged) == "its upload is not a model update"


def test_the_refusals_keep_their_words() -> None:
    """The reasons the sniffing gave, now read from the declarations (one per hook)."""
    get = ALGORITHMS.get
    assert client_level_refusal(get("scaffold")) == "its aggregation is not the FedAvg average (it overrides aggregate)"

    class OwnBroadcast(FedAvg):
        capabilities = Capabilities.of_defaults(same_broadcast=False)

    assert client_level_refusal(OwnBroadcast) == "clients receive different models (it overrides broadcast)"
    assert (
        client_level_refusal(get("fedcp")) == "its clients upload more than their model tensors (it overrides upload)"
    )
    assert client_level_refusal(get("ditto")) == (
        "its clients' update is its own code (it overrides local_update), which may upload anything"
    )
    assert sample_level_refusal(get("ditto")) == (
        "its clients' update is its own code (it overrides local_update), outside the DP-SGD batch loop"
    )
    assert (
        refusal("batch-loop", get("ditto"))
        == "Ditto's client program overrides local_update (a custom local training loop)"
    )
    assert refusal("streaming", get("fednova")) is not None  # its own rule: aggregate gets the list
    # one evaluation pass for all clients needs the same received model for all (FedCAC: not)
    assert refusal("shared-evaluation", FedAvg) is None
    assert refusal("shared-evaluation", OwnBroadcast) == "clients receive different models (it overrides broadcast)"
    assert refusal("shared-evaluation", get("fedcac")) is not None


def test_every_builtin_algorithm_declares_its_capabilities() -> None:
    for name in ALGORITHMS.items:
        algorithm = ALGORITHMS.get(name)
        if not algorithm.__module__.startswith("pflbench.algorithms."):
            continue  # plugins registered by tests
        assert algorithm.capabilities is not UNDECLARED, name
        assert algorithm.program_class.capabilities is not PROGRAM_UNDECLARED, name


def test_builtin_declarations_match_their_hooks() -> None:
    """The engine reads declarations only; this test (not the engine) checks that each built-in's
    declaration says what its code does, hook by hook (the rule in engine.capabilities)."""
    from pflbench.algorithms.lgfedavg import WarmStartProgram
    from pflbench.algorithms.pfedhn import PFedHNInnerStepsProgram
    from pflbench.engine.algorithm import Algorithm

    def default(cls: type, base: type, hook: str) -> bool:
        return getattr(cls, hook) is getattr(base, hook)

    programs = {WarmStartProgram, PFedHNInnerStepsProgram}  # chosen by make_program per hyperparameter
    for name in ALGORITHMS.items:
        algorithm = ALGORITHMS.get(name)
        if not algorithm.__module__.startswith("pflbench.algorithms."):
            continue
        caps = algorithm.capabilities
        assert caps.same_broadcast == default(algorithm, Algorithm, "broadcast"), name
        own_rule = not default(algorithm, Algorithm, "aggregate") or not default(
            algorithm, Algorithm, "streaming_aggregate"
        )
        assert caps.fedavg_aggregate == (not own_rule), name
        if not default(algorithm, Algorithm, "round_diagnostics"):
            assert not caps.diagnostics_without_uploads, name  # declared as the sniffing read it (conservative)
        assert caps.received_personal_model == default(algorithm, Algorithm, "personal_model"), name
        programs.add(algorithm.program_class)
    for program in programs:
        assert program.capabilities.batch_loop == default(program, ClientProgram, "local_update"), program
        assert program.capabilities.model_upload == default(program, ClientProgram, "upload"), program
