"""FedEM: the E-step responsibilities, the M-step mixture weights and the mixture prediction
against hand computations; the responsibilities weight each component's loss; M = 1 is FedAvg;
new clients learn π with the components frozen; resume and Ray give the same numbers; bad input
is one ``Error:`` line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import pflbench.algorithms.fedem as fedem
from pflbench.algorithms.fedem import (
    PI,
    FedEM,
    mixture_prediction,
    mixture_weights,
    responsibilities,
)
from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.engine import personalize
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness, assert_refused, killed_and_resumed, local_ray, round_numbers, tiny_run


# ---- the math against hand computations -------------------------------------------------------
def test_e_step_and_m_step_hand_computed() -> None:
    losses = torch.tensor([[1.0, 2.0], [2.0, 0.5]])  # ℓ[m, i]: 2 components, 2 samples
    pi = torch.tensor([0.25, 0.75])
    q = responsibilities(losses, pi)
    # q[0, 0] = 0.25·e^{−1} / (0.25·e^{−1} + 0.75·e^{−2}); q[0, 1] = 0.25·e^{−2} / (0.25·e^{−2} + 0.75·e^{−0.5})
    q00 = 0.25 * math.exp(-1) / (0.25 * math.exp(-1) + 0.75 * math.exp(-2))
    q01 = 0.25 * math.exp(-2) / (0.25 * math.exp(-2) + 0.75 * math.exp(-0.5))
    assert torch.allclose(q, torch.tensor([[q00, q01], [1 - q00, 1 - q01]]), atol=1e-6)
    assert torch.allclose(mixture_weights(q), torch.tensor([(q00 + q01) / 2, 1 - (q00 + q01) / 2]), atol=1e-6)


def test_mixture_prediction_hand_computed() -> None:
    logits = [torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([[math.log(4.0), 0.0]])]
    # softmax: (1/4, 3/4) and (4/5, 1/5); π = (0.5, 0.5): (0.525, 0.475)
    mixed = mixture_prediction(logits, torch.tensor([0.5, 0.5]))
    assert torch.allclose(mixed, torch.tensor([[0.525, 0.475]]))
    assert torch.allclose(mixture_prediction(logits, torch.tensor([1.0, 0.0])), torch.tensor([[0.25, 0.75]]))


# ---- wiring ---------------------------------------------------------------------------------------
def harness(tmp_path: Path, **options) -> Harness:
    config = dataclasses.replace(tiny_run("fedem", tmp_path), optimizer="sgd", lr=0.05)
    return Harness(prepare(config, {"components": 2, **options}))


def test_components_start_apart_and_pi_is_private(tmp_path: Path) -> None:
    algorithm = harness(tmp_path).algorithm
    assert algorithm.layout.private == (PI,)
    state = algorithm.global_state
    assert not torch.equal(state["fc1.weight"], state["fedem_2.fc1.weight"])  # re-initialised component 2
    assert torch.equal(algorithm.store.initial[PI], torch.tensor([0.5, 0.5]))
    assert FedEM.method_family == "multi_task" and FedEM.has_global_model


def test_a_client_takes_one_em_step(tmp_path: Path) -> None:
    run = harness(tmp_path)
    algorithm = run.algorithm
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    # the E-step by hand: per-sample losses of both received components on client 0's train split
    run.load_client(0, received)
    model = run.model
    model.eval()
    inputs, targets = run.data.gather(run.data.train_indices[0])
    with torch.no_grad():
        model.fedem_mixing = False  # component 1 alone
        losses = torch.stack([F.cross_entropy(m(inputs), targets, reduction="none") for m in (model, model.fedem_2)])
        model.fedem_mixing = True
    q = responsibilities(losses, torch.tensor([0.5, 0.5]))
    update = run.train_client(0, received)
    assert torch.allclose(algorithm.store.get(0)[PI], q.mean(dim=1), atol=1e-5)
    assert set(update.params) == set(algorithm.layout.shared)  # both components travel, π stays


def test_each_component_trains_on_its_responsibility_weighted_loss(tmp_path: Path, monkeypatch) -> None:
    run = harness(tmp_path)
    received = {n: t.clone() for n, t in run.algorithm.broadcast(0).items()}
    # every sample belongs to component 1: component 2's loss is 0·ℓ, so it must not move
    monkeypatch.setattr(
        fedem,
        "responsibilities",
        lambda losses, pi: torch.stack([torch.ones_like(losses[0]), torch.zeros_like(losses[0])]),
    )
    update = run.train_client(0, received)
    first = [n for n in run.algorithm.layout.trainable if not n.startswith("fedem_")]
    second = [n for n in run.algorithm.layout.trainable if n.startswith("fedem_2.")]
    assert all(torch.equal(update.params[n], received[n]) for n in second)
    assert any(not torch.equal(update.params[n], received[n]) for n in first)
    assert torch.equal(run.algorithm.store.get(0)[PI], torch.tensor([1.0, 0.0]))


def test_evaluation_mixes_the_components_with_the_clients_pi(tmp_path: Path) -> None:
    run = harness(tmp_path)
    algorithm = run.algorithm
    algorithm.store.put(1, {PI: torch.tensor([0.2, 0.8])})
    run.load_personal_model(1)
    model = run.model
    model.eval()
    inputs, _ = run.data.gather(run.data.train_indices[1][:5])
    with torch.no_grad():
        output = model(inputs)
        model.fedem_mixing = False
        first = model(inputs)
        model.fedem_mixing = True
        second = model.fedem_2(inputs)
    expected = torch.log(0.2 * first.softmax(1) + 0.8 * second.softmax(1))
    assert torch.allclose(output, expected, atol=1e-6)


def test_a_new_client_learns_pi_by_em_with_the_components_frozen(tmp_path: Path) -> None:
    run = harness(tmp_path)
    algorithm = run.algorithm
    program = algorithm.new_client_program()
    assert type(program).__name__ == "FedEMNewClientProgram" and program.epochs == algorithm.config.local_epochs
    start = algorithm.new_client_model(2)
    (served,) = personalize(run.executor, program, [start], [2], [7], 1)
    assert all(torch.equal(served[n], start[n]) for n in algorithm.layout.shared)  # frozen
    run.load_client(2, start)
    model = run.model
    model.eval()
    inputs, targets = run.data.gather(run.data.train_indices[2])
    with torch.no_grad():
        model.fedem_mixing = False
        losses = torch.stack([F.cross_entropy(m(inputs), targets, reduction="none") for m in (model, model.fedem_2)])
        model.fedem_mixing = True
    pi = torch.tensor([0.5, 0.5])
    for _ in range(program.epochs):
        pi = responsibilities(losses, pi).mean(dim=1)
    assert torch.allclose(served[PI], pi, atol=1e-5)


def test_one_component_is_fedavg(tmp_path: Path) -> None:
    settings = dict(dataset="digits", model="mlp", num_clients=3, rounds=2, alpha=0.3, optimizer="sgd", lr=0.05)
    fedavg = round_numbers(run_experiment(RunConfig(algo="fedavg", out=str(tmp_path / "a"), **settings)))
    one = round_numbers(run_experiment(RunConfig(algo="fedem", out=str(tmp_path / "b"), **settings), {"components": 1}))
    for a, b in zip(fedavg, one, strict=True):
        assert a["pers_acc"] == b["pers_acc"] and a["global_acc"] == b["global_acc"]
        assert math.isclose(a["train_loss"], b["train_loss"], rel_tol=1e-5)


# ---- executors, resume ----------------------------------------------------------------------------
SGD = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, alpha=0.3, optimizer="sgd", lr=0.05)


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return RunConfig(
            algo="fedem", out=str(out), **{**SGD, "rounds": 4, "frac": 0.67, "checkpoint_every": 2, "model": "cnn_bn"}
        )

    resumed, whole = killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    assert round_numbers(resumed) == round_numbers(whole)


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        sequential = run_experiment(RunConfig(algo="fedem", out=str(tmp_path / "seq"), **SGD))
        on_ray = run_experiment(
            RunConfig(algo="fedem", out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **SGD)
        )
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "fedem", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--components", "0"], "--components must be ≥ 1, got 0"),
        (["--components", "100"], "give --components in [1, 32]"),
        (["--executor", "vmap"], "--executor vmap cannot run this"),
        (["--dp", "client"], "cannot make --algo fedem private"),
        (["--robust-agg", "krum"], "cannot replace the aggregation of --algo fedem"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_runs_from_a_config_file(tmp_path: Path) -> None:
    config_file = tmp_path / "fedem.toml"
    config_file.write_text('algo = "fedem"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\ncomponents = 2\n')
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", "--config", str(config_file), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    (folder,) = (out / "runs").iterdir()
    assert json.loads((folder / "config.json").read_text())["algo_hparams"] == {"components": 2}
    assert "fedem_pi" in (folder / "clients.csv").read_text().splitlines()[0]
