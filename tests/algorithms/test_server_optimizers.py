"""Server optimizers (FedAvgM, FedAdam, FedYogi, FedAdagrad) and FedNova: each defining formula on
2-element tensors against values computed by hand, FedAvgM(β = 0, η = 1) = FedAvg bit for bit,
FedNova's step count and a_k against what the local optimizer really did, the refusals, and a
killed and resumed FedAdam run equal to a whole one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pflbench.algorithms.fedadagrad import FedAdagrad, FedAdagradHyperparameters
from pflbench.algorithms.fedadam import (
    SERVER_LR_GRID,
    AverageThenStep,
    FedAdam,
    FedAdamHyperparameters,
    adagrad_second_moment,
    adam_second_moment,
    adaptive_step,
    first_moment,
    yogi_second_moment,
)
from pflbench.algorithms.fedavgm import FedAvgM, FedAvgMHyperparameters, momentum_step
from pflbench.algorithms.fednova import FedNova, fednova_step, normalizing_factor
from pflbench.algorithms.fedyogi import FedYogi, FedYogiHyperparameters
from pflbench.config.run_config import RunConfig
from pflbench.engine import build_optimizer
from pflbench.engine.types import ClientJob, ClientUpdate, OptimizerSpec
from pflbench.errors import ConfigError
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.store.layout import CHECKPOINT_FILE
from pflbench.testing import Harness, killed_after_round


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return torch.allclose(actual, expected, atol=1e-6, rtol=0)


# ---- the pure formulas, by hand ----------------------------------------------------------------
def test_the_round_average_by_samples_or_uniform() -> None:
    # w_1 = [2, 0] (n = 3), w_2 = [1, 4] (n = 1): by samples 0.75·w_1 + 0.25·w_2 = [1.75, 1.0],
    # uniform 0.5·w_1 + 0.5·w_2 = [1.5, 2.0] (with w = [1, 2]: Δ = [0.75, −1.0] and [0.5, 0])
    for weighting, expected in (("samples", t(1.75, 1.0)), ("uniform", t(1.5, 2.0))):
        averages: list = []
        stream = AverageThenStep([3, 1], weighting, averages.append)
        for update in uploads((3, t(2, 0)), (1, t(1, 4))):
            stream.add(update)
        stream.finish()
        assert close(averages[0]["w"], expected)
    empty: list = []
    AverageThenStep([], "samples", empty.append).finish()
    assert empty == []  # nobody reported: no step


def test_moments_and_adaptive_step_by_hand() -> None:
    delta = t(1, -7)
    # m = 0.5·0 + 0.5·[1, −7] = [0.5, −3.5]
    assert close(first_moment(torch.zeros(2), delta, 0.5), t(0.5, -3.5))
    # Adam, v⁰ = τ² = 1, β₂ = 0.5: v = 0.5·1 + 0.5·[1, 49] = [1, 25]
    assert close(adam_second_moment(torch.ones(2), delta, 0.5), t(1, 25))
    # Adagrad: v = [1, 1] + [1, 49] = [2, 50]
    assert close(adagrad_second_moment(torch.ones(2), delta, 0.5), t(2, 50))
    # Yogi, β₂ = 0.5: v = [1, 9], Δ = [2, 1]: sign(v − Δ²) = sign([−3, 8]) = [−1, 1]
    # v = [1 + 0.5·4, 9 − 0.5·1] = [3, 8.5]
    assert close(yogi_second_moment(t(1, 9), t(2, 1), 0.5), t(3, 8.5))
    # Yogi where v = Δ² (sign 0): v stays; where v < Δ²: v = 1 + 0.5·16 = 9
    assert close(yogi_second_moment(t(1, 1), t(1, 4), 0.5), t(1, 9))
    # w + η·m/(√v + τ) = [1, 2] + 0.6·[0.5/(1 + 1), −3.5/(5 + 1)] = [1.15, 1.65]
    assert close(adaptive_step(t(1, 2), t(0.5, -3.5), t(1, 25), 0.6, 1.0), t(1.15, 1.65))


def test_momentum_step_by_hand() -> None:
    # w = [1, 2], w̄ = [2, 0] → Δ = [1, −2]; v = 0.5·[1, 1] + Δ = [1.5, −1.5]; w = w + 2·v = [4, −1]
    model, velocity = momentum_step(t(1, 2), t(2, 0), t(1, 1), 0.5, 2.0)
    assert close(velocity, t(1.5, -1.5)) and close(model, t(4, -1))


def test_fednova_normalizing_factor_by_hand_and_against_momentum_sgd() -> None:
    assert normalizing_factor(5, 0.0) == 5.0  # plain SGD: a = τ
    # ρ = 0.5, τ = 3: [3 − 0.5·(1 − 0.125)/0.5]/0.5 = (3 − 0.875)/0.5 = 4.25
    # (= Σ_{j=1..3} (1 − ρ^j)/(1 − ρ) = (0.5 + 0.75 + 0.875)/0.5)
    assert normalizing_factor(3, 0.5) == pytest.approx(4.25, abs=1e-12)
    # the engine's momentum SGD, a constant gradient 1 for τ steps: w moves by lr·a
    for momentum, steps in ((0.0, 4), (0.5, 3), (0.9, 7)):
        weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        optimizer = build_optimizer(OptimizerSpec(kind="sgd", lr=0.1, momentum=momentum), {"w": weight})
        for _ in range(steps):
            weight.grad = torch.ones(1, dtype=torch.float64)
            optimizer.step()
        assert -float(weight.detach()) == pytest.approx(0.1 * normalizing_factor(steps, momentum), rel=1e-12)


def test_fednova_step_by_hand() -> None:
    # w = [1, 2]; client 1: w_1 = [0, 2] after a = 2, client 2: w_2 = [1, −2] after a = 4, p = ½ each
    # d_1 = [0.5, 0], d_2 = [0, 1]; τ_eff = 0.5·2 + 0.5·4 = 3; w − 3·[0.25, 0.5] = [0.25, 0.5]
    # (FedAvg would give [0.5, 0])
    assert close(fednova_step(t(1, 2), [t(0, 2), t(1, -2)], [2.0, 4.0], [0.5, 0.5]), t(0.25, 0.5))
    # equal a_k: FedAvg's average
    assert close(fednova_step(t(1, 2), [t(0, 2), t(1, -2)], [3.0, 3.0], [0.25, 0.75]), t(0.75, -1.0))
    # a client that took no step (a = 0) adds nothing: τ_eff = 0.5·2, Σ p d = [0.25, 0]
    assert close(fednova_step(t(1, 2), [t(0, 2), t(1, 2)], [2.0, 0.0], [0.5, 0.5]), t(0.75, 2))


# ---- the server classes on hand-made uploads ----------------------------------------------------
def server(cls, hparams, model: torch.Tensor, **state: dict[str, torch.Tensor]):
    """An algorithm instance holding one 2-element parameter ``w`` (no model, no run)."""
    algorithm = object.__new__(cls)
    algorithm.hparams, algorithm.global_state = hparams, {"w": model.clone()}
    for name, value in state.items():
        setattr(algorithm, name, value)
    return algorithm


def uploads(*pairs: tuple[int, torch.Tensor]) -> list[ClientUpdate]:
    return [ClientUpdate(k, n, {"w": w}, {}) for k, (n, w) in enumerate(pairs)]


def test_fedadam_round_by_hand_and_the_weighting() -> None:
    # w̄ = 0.75·[2, −4] + 0.25·[2, −8] = [2, −5] → Δ = [1, −7]; β₁ = β₂ = 0.5, τ = 1, η = 0.6:
    # m = [0.5, −3.5], v = [1, 25], w = [1.15, 1.65] (as test_moments_and_adaptive_step_by_hand)
    hparams = FedAdamHyperparameters(server_lr=0.6, server_beta1=0.5, server_beta2=0.5, server_tau=1.0)
    state = {"first_moment_state": {"w": torch.zeros(2)}, "second_moment_state": {"w": torch.ones(2)}}
    algorithm = server(FedAdam, hparams, t(1, 2), **state)
    algorithm.aggregate(uploads((3, t(2, -4)), (1, t(2, -8))))
    assert close(algorithm.first_moment_state["w"], t(0.5, -3.5))
    assert close(algorithm.second_moment_state["w"], t(1, 25))
    assert close(algorithm.global_state["w"], t(1.15, 1.65))
    # uniform weights: w̄ = [2, −6], Δ = [1, −8], m = 0.5·Δ = [0.5, −4]
    uniform = FedAdamHyperparameters(server_beta1=0.5, server_weighting="uniform")
    state = {"first_moment_state": {"w": torch.zeros(2)}, "second_moment_state": {"w": torch.ones(2)}}
    algorithm = server(FedAdam, uniform, t(1, 2), **state)
    algorithm.aggregate(uploads((3, t(2, -4)), (1, t(2, -8))))
    assert close(algorithm.first_moment_state["w"], t(0.5, -4))


def test_fedyogi_and_fedadagrad_rounds_by_hand() -> None:
    # Yogi, β₁ = 0, β₂ = 0.5, τ = 1, η = 1: Δ = [1, 4], v = [1, 9], w + [1/2, 4/4] = [1.5, 3]
    hparams = FedYogiHyperparameters(server_lr=1.0, server_beta1=0.0, server_beta2=0.5, server_tau=1.0)
    state = {"first_moment_state": {"w": torch.zeros(2)}, "second_moment_state": {"w": torch.ones(2)}}
    algorithm = server(FedYogi, hparams, t(1, 2), **state)
    algorithm.aggregate(uploads((1, t(2, 6))))
    assert close(algorithm.second_moment_state["w"], t(1, 9)) and close(algorithm.global_state["w"], t(1.5, 3))
    # Adagrad, β₁ = 0, τ = 3 (v⁰ = 9), η = 2: Δ = [4, 0], v = [25, 9], w + 2·[4/(5 + 3), 0] = [2, 2]
    hparams_ = FedAdagradHyperparameters(server_lr=2.0, server_tau=3.0)
    state = {"first_moment_state": {"w": torch.zeros(2)}, "second_moment_state": {"w": torch.full((2,), 9.0)}}
    algorithm = server(FedAdagrad, hparams_, t(1, 2), **state)
    algorithm.aggregate(uploads((1, t(5, 2))))
    assert close(algorithm.second_moment_state["w"], t(25, 9)) and close(algorithm.global_state["w"], t(2, 2))


def test_fedavgm_round_by_hand() -> None:
    # v⁰ = 0, β = 0.9, η = 1: w̄ = [3, 2] → Δ = v = [2, 0], w = [3, 2]; round 2, w̄ = [3, 2]:
    # Δ = 0, v = 0.9·[2, 0] = [1.8, 0], w = [4.8, 2]
    algorithm = server(FedAvgM, FedAvgMHyperparameters(), t(1, 2), velocity={"w": torch.zeros(2)})
    algorithm.aggregate(uploads((2, t(3, 2))))
    assert close(algorithm.global_state["w"], t(3, 2))
    algorithm.aggregate(uploads((2, t(3, 2))))
    assert close(algorithm.velocity["w"], t(1.8, 0)) and close(algorithm.global_state["w"], t(4.8, 2))
    algorithm.aggregate([])  # no client reported (dropouts): no step, v and w stay
    assert close(algorithm.velocity["w"], t(1.8, 0)) and close(algorithm.global_state["w"], t(4.8, 2))


# ---- defaults, options, refusals ----------------------------------------------------------------
def test_paper_defaults() -> None:
    adam, yogi, adagrad, avgm = (
        FedAdamHyperparameters(),
        FedYogiHyperparameters(),
        FedAdagradHyperparameters(),
        FedAvgMHyperparameters(),
    )
    assert (adam.server_lr, adam.server_beta1, adam.server_beta2, adam.server_tau) == (1e-2, 0.9, 0.99, 1e-3)
    assert yogi == FedYogiHyperparameters(**vars(adam))
    assert (adagrad.server_lr, adagrad.server_beta1, adagrad.server_tau) == (1e-1, 0.0, 1e-2)
    assert (avgm.server_momentum, avgm.server_lr, avgm.server_weighting) == (0.9, 1.0, "samples")
    assert SERVER_LR_GRID == (0.001, 0.003162, 0.01, 0.031623, 0.1, 0.316228, 1.0, 3.162278, 10.0)


@pytest.mark.parametrize(
    ("hparams", "flag"),
    [
        (FedAdamHyperparameters(server_beta1=1.0), "--server-beta1"),
        (FedAdamHyperparameters(server_beta2=-0.1), "--server-beta2"),
        (FedAdamHyperparameters(server_tau=0.0), "--server-tau"),
        (FedYogiHyperparameters(server_lr=0.0), "--server-lr"),
        (FedAdagradHyperparameters(server_weighting="median"), "--server-weighting"),
        (FedAvgMHyperparameters(server_momentum=1.0), "--server-momentum"),
    ],
)
def test_bad_server_settings_are_one_line_errors(hparams, flag: str) -> None:
    with pytest.raises(ConfigError) as error:
        hparams.validate()
    assert flag in str(error.value) and "\n" not in str(error.value)


def tiny(algo: str, out: Path, **settings) -> RunConfig:
    base = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, alpha=0.5, optimizer="sgd", lr=0.1)
    return RunConfig(algo=algo, out=str(out), **{**base, **settings})


def test_fednova_refuses_adam_and_hosts_vmap(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--optimizer adam has no such a_k: use --optimizer sgd"):
        FedNova.check_config(tiny("fednova", tmp_path, optimizer="adam"), None)
    FedNova.check_config(tiny("fednova", tmp_path, executor="vmap"), None)  # vmap reports τ_k (test_vmap_executor)


def test_search_space_adds_the_server_lr(tmp_path: Path) -> None:
    config = tiny("fedadam", tmp_path)
    space = FedAdam.search_space(config, FedAdamHyperparameters())
    assert set(space) == {"lr", "server_lr"} and space["server_lr"].values == SERVER_LR_GRID


# ---- end to end --------------------------------------------------------------------------------
TIMING = {"round_time_s", "eval_time_s", "finetune_time_s", "peak_mem_mb", "wall_time_s", "run_dir"}


def rounds_of(out: Path) -> list[dict]:
    (run,) = [p for p in (out / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    lines = (run / "rounds.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def test_fedavgm_without_momentum_and_unit_lr_is_fedavg_exactly(tmp_path: Path) -> None:
    run_experiment(tiny("fedavg", tmp_path / "fedavg"))
    run_experiment(tiny("fedavgm", tmp_path / "fedavgm"), {"server_momentum": 0.0, "server_lr": 1.0})
    fedavg, fedavgm = rounds_of(tmp_path / "fedavg"), rounds_of(tmp_path / "fedavgm")
    assert fedavgm == fedavg  # every accuracy, loss and byte count, bit for bit
    run_experiment(tiny("fedavgm", tmp_path / "momentum"))  # the default β = 0.9 does move differently
    momentum = rounds_of(tmp_path / "momentum")
    assert momentum[0] == fedavg[0]  # v¹ = Δ¹: round 1 is FedAvg's
    assert momentum[1]["global_acc"] != fedavg[1]["global_acc"]  # round 2 steps by Δ² + 0.9·Δ¹


def test_fednova_reads_the_steps_really_taken(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny("fednova", tmp_path, local_epochs=2, momentum=0.5, batch_size=16)))
    updates, expected_steps = [], set()
    for client in range(4):
        update = harness.train_client(client, harness.global_state)
        size = harness.data.num_train[client]
        batches = -(-size // 16) - (1 if size % 16 == 1 and size > 16 else 0)  # a lone last sample joins
        assert update.local_steps == 2 * batches
        assert set(update.params) == set(harness.global_state)  # w_k only: τ_k is metadata, like n_k
        updates.append(update)
        expected_steps.add(2 * batches)
    assert len(expected_steps) > 1, "clients of different sizes take different numbers of steps"
    assert harness.algorithm.factors(updates) == [normalizing_factor(u.local_steps, 0.5) for u in updates]


def test_fednova_a_k_counts_only_the_steps_of_partial_work(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny("fednova", tmp_path, momentum=0.5)))
    job = ClientJob(0, 1, 7, harness.global_state, harness.store.get(0), max_steps=3)  # a straggler
    (update,) = harness.executor.train(harness.program, [job])
    assert update.local_steps == 3
    assert harness.algorithm.factors([update]) == [pytest.approx(4.25)]  # a(3, ρ = 0.5), as by hand above


def test_fednova_logs_its_steps_and_moves_fedavg_s_bytes(tmp_path: Path) -> None:
    run_experiment(tiny("fednova", tmp_path / "nova"))
    run_experiment(tiny("fedavg", tmp_path / "avg"))
    nova, avg = rounds_of(tmp_path / "nova"), rounds_of(tmp_path / "avg")
    for record, plain in zip(nova, avg):
        assert record["fednova_steps_min"] < record["fednova_steps_max"]
        assert record["fednova_steps_min"] <= record["fednova_tau_eff"] <= record["fednova_steps_max"]
        assert (record["bytes_up"], record["bytes_down"]) == (plain["bytes_up"], plain["bytes_down"])
    assert nova[1]["global_acc"] != avg[1]["global_acc"]  # unequal τ_k: not FedAvg


def test_killed_and_resumed_fedadam_equals_a_whole_run(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return tiny("fedadam", out, num_clients=3, rounds=4, checkpoint_every=2, frac=0.67)

    # the checkpoint is at round 2
    killed_after_round(3, lambda: run_experiment(config(tmp_path / "killed")))
    (work,) = [p for p in (tmp_path / "killed" / "runs").iterdir() if p.name.startswith(".tmp-")]
    assert (work / CHECKPOINT_FILE).is_file()
    summary = run_experiment(config(tmp_path / "killed"), resume=True)
    assert summary["status"] == "completed"
    run_experiment(config(tmp_path / "whole"))
    resumed, whole = rounds_of(tmp_path / "killed"), rounds_of(tmp_path / "whole")
    assert [r["round"] for r in resumed] == [1, 2, 3, 4] and resumed == whole
