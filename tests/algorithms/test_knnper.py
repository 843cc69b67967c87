"""kNN-Per: the kNN distribution and the interpolation λ·p_kNN + (1 − λ)·p_model against hand
computations; the datastore holds the client's train representations under the global model;
evaluation interpolates; λ = 0 is FedAvg; resume and Ray give the same numbers; bad input is one
``Error:`` line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench.algorithms.knnper import KEYS, LABELS, SIZE, KNNPer, interpolate, knn_probabilities
from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.engine import personalize
from pflbench.engine.types import load_into
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.testing import (
    Harness,
    assert_refused,
    killed_and_resumed,
    local_ray,
    round_numbers,
    tiny_run,
)


# ---- the math against hand computations -------------------------------------------------------
def test_knn_probabilities_hand_computed() -> None:
    keys, labels = torch.tensor([[0.0], [1.0], [3.0]]), torch.tensor([0.0, 1.0, 1.0])
    feature = torch.tensor([[0.2]])  # squared distances 0.04, 0.64, 7.84
    w0 = math.exp(-0.04) / (math.exp(-0.04) + math.exp(-0.64))  # k = 2, D = 1, s = 1
    assert torch.allclose(knn_probabilities(feature, keys, labels, 2, 1.0, 3), torch.tensor([[w0, 1 - w0, 0.0]]))
    w0 = math.exp(-0.02) / (math.exp(-0.02) + math.exp(-0.32))  # s = 2 halves the exponents
    assert torch.allclose(knn_probabilities(feature, keys, labels, 2, 2.0, 3), torch.tensor([[w0, 1 - w0, 0.0]]))
    # k = 3: the far key joins with weight e^{−7.84}
    e = [math.exp(-0.04), math.exp(-0.64), math.exp(-7.84)]
    assert torch.allclose(
        knn_probabilities(feature, keys, labels, 3, 1.0, 3),
        torch.tensor([[e[0] / sum(e), (e[1] + e[2]) / sum(e), 0.0]]),
    )
    # D = 2 divides the squared distance: keys (0,0), (1,1) seen from (0,0): weights ∝ 1, e^{−2/2}
    two = knn_probabilities(
        torch.zeros(1, 2), torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([0.0, 1.0]), 5, 1.0, 2
    )
    assert torch.allclose(two, torch.tensor([[1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))]]))


def test_interpolation_hand_computed() -> None:
    mixed = interpolate(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, math.log(3.0)]]), 0.25)
    assert torch.allclose(mixed, torch.tensor([[0.25 + 0.75 * 0.25, 0.75 * 0.75]]))  # softmax = (¼, ¾)


# ---- wiring ---------------------------------------------------------------------------------------
def served(tmp_path: Path, client: int, **options) -> tuple[Harness, dict]:
    run = Harness(prepare(dataclasses.replace(tiny_run("knnper", tmp_path), optimizer="sgd", lr=0.05), options))
    algorithm = run.algorithm
    start = algorithm.personal_model(client)
    (state,) = personalize(run.executor, algorithm.personalization_program(), [start], [client], [3], 1)
    return run, state


def representations(run: Harness, inputs: torch.Tensor) -> torch.Tensor:
    captured = []
    head = run.model.get_submodule(run.algorithm.head_module)
    handle = head.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    with torch.no_grad():
        run.model(inputs)
    handle.remove()
    return captured[0]


def test_the_datastore_holds_the_clients_train_representations(tmp_path: Path) -> None:
    run, state = served(tmp_path, 1)
    algorithm = run.algorithm
    assert set(algorithm.layout.private) == {KEYS, LABELS, SIZE}  # the datastore never travels
    indices = run.data.train_indices[1]
    inputs, targets = run.data.gather(indices)
    run.load_global_model()
    run.model.eval()
    expected = representations(run, inputs)
    n = len(indices)
    assert int(state[SIZE]) == n and torch.allclose(state[KEYS][:n], expected, atol=1e-6)
    assert torch.equal(state[LABELS][:n].long(), targets) and float(state[KEYS][n:].abs().sum()) == 0
    for name in algorithm.layout.shared:  # the model itself is the global one
        assert torch.equal(state[name], algorithm.global_state[name])


def test_evaluation_interpolates_the_knn_and_the_model(tmp_path: Path) -> None:
    run, state = served(tmp_path, 0, knn_weight=0.3, neighbors=4)
    test = run.data.eval_indices("test")[0][:6]
    inputs, _ = run.data.gather(test)
    run.load_global_model()
    run.model.eval()
    with torch.no_grad():
        logits = run.model(inputs)  # empty datastore: the model alone
        features = representations(run, inputs)
    n = int(state[SIZE])
    knn = knn_probabilities(features, state[KEYS][:n], state[LABELS][:n], 4, 1.0, logits.shape[1])
    expected = torch.log(0.3 * knn + 0.7 * logits.softmax(1))
    load_into(run.state, state)
    with torch.no_grad():
        output = run.model(inputs)
    assert torch.allclose(output, expected, atol=1e-5)


def test_capacity_keeps_a_seeded_random_subset(tmp_path: Path) -> None:
    _, first = served(tmp_path / "a", 2, capacity=10)
    _, again = served(tmp_path / "b", 2, capacity=10)
    assert int(first[SIZE]) == 10 and torch.equal(first[KEYS], again[KEYS])
    assert first[KEYS].shape[0] == 10


def test_zero_weight_is_fedavg_and_the_memory_helps(tmp_path: Path) -> None:
    settings = dict(dataset="digits", model="mlp", num_clients=3, rounds=2, alpha=0.1, optimizer="sgd", lr=0.05)
    fedavg = run_experiment(RunConfig(algo="fedavg", out=str(tmp_path / "a"), **settings))
    none = run_experiment(RunConfig(algo="knnper", out=str(tmp_path / "b"), **settings), {"knn_weight": 0.0})
    half = run_experiment(RunConfig(algo="knnper", out=str(tmp_path / "c"), **settings))
    assert none["pers_acc"] == fedavg["pers_acc"] and none["global_acc"] == fedavg["global_acc"]
    assert half["global_acc"] == fedavg["global_acc"] and half["pers_acc"] > fedavg["pers_acc"]
    assert KNNPer.method_family == "memorization" and KNNPer.has_global_model


# ---- executors, resume ----------------------------------------------------------------------------
SGD = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, alpha=0.3, optimizer="sgd", lr=0.05)


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return RunConfig(algo="knnper", out=str(out), **{**SGD, "rounds": 4, "frac": 0.67, "checkpoint_every": 2})

    resumed, whole = killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    assert round_numbers(resumed) == round_numbers(whole)


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        sequential = run_experiment(RunConfig(algo="knnper", out=str(tmp_path / "seq"), **SGD))
        on_ray = run_experiment(
            RunConfig(algo="knnper", out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **SGD)
        )
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "knnper", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--knn-weight", "1.5"], "--knn-weight must be in [0, 1], got 1.5"),
        (["--neighbors", "0"], "--neighbors must be ≥ 1, got 0"),
        (["--kernel-scale", "0"], "--kernel-scale must be > 0, got 0.0"),
        (["--capacity", "0"], "--capacity must be ≥ 1, got 0"),
        (["--executor", "vmap"], "knnper builds each client's datastore"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_runs_from_a_config_file(tmp_path: Path, run_config_file) -> None:
    hparams = run_config_file(
        tmp_path, "knnper", 'algo = "knnper"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\nneighbors = 5\n'
    )["algo_hparams"]
    assert hparams == {"knn_weight": 0.5, "neighbors": 5, "kernel_scale": 1.0, "capacity": 4096}


@pytest.mark.parametrize(
    "defence",
    [{"dp": "client", "dp_noise": 0.5}, {"robust_agg": "trimmed-mean", "trim_frac": 0.2}],
    ids=["dp-client", "trimmed-mean"],
)
def test_fedavg_training_takes_dp_and_robust_aggregation(defence: dict, tmp_path: Path) -> None:
    if "dp" in defence:
        pytest.importorskip("opacus")
    settings = {**SGD, "num_clients": 5, "rounds": 1, **defence}
    summary = run_experiment(RunConfig(algo="knnper", out=str(tmp_path), **settings))
    assert summary["status"] == "completed" and 0.0 <= summary["pers_acc"] <= 1.0


def test_a_model_whose_final_layer_is_not_linear_is_refused() -> None:
    from pflbench import ConfigError

    class ConvHead(torch.nn.Module):
        layer_names = ("body", "head")

        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Conv2d(1, 4, 3)
            self.head = torch.nn.Conv2d(4, 10, 1)

    with pytest.raises(
        ConfigError, match="knnper's datastore holds the input of a linear final layer; 'head' is a Conv2d"
    ):
        KNNPer.configure_model(ConvHead(), RunConfig(algo="knnper"), KNNPer.hyperparameters())
