"""FLUTE: the ETF target and distance, the server's step on the heads, the local phases and loss
terms, each against a hand or independent computation; the server wiring; resume and Ray give
the same numbers; bad input is one ``Error:`` line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench.algorithms.flute import (
    CLASSES,
    FLUTE,
    HEAD,
    class_indicator,
    etf_distance,
    etf_target,
    server_head_step,
)
from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
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
def test_etf_target_hand_computed() -> None:
    target = etf_target(torch.tensor([1.0, 1.0, 0.0]))
    expected = torch.tensor([[2 / 3, -1 / 3, 0.0], [-1 / 3, 2 / 3, 0.0], [0.0, 0.0, 0.0]]) / math.sqrt(2)
    assert torch.allclose(target, expected)


def test_etf_distance_hand_computed() -> None:
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    # WWᵀ/‖WWᵀ‖ = diag(1, 1, 0)/√2; minus the target above leaves four entries ±(1/3)/√2
    assert math.isclose(float(etf_distance(weight, torch.tensor([1.0, 1.0, 0.0]))), math.sqrt(2) / 3, rel_tol=1e-6)
    # a simplex ETF of 3 classes (an equilateral triangle, centred) is at distance 0
    angles = torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3])
    etf = torch.stack([angles.cos(), angles.sin()], dim=1) * 5.0
    assert float(etf_distance(etf, torch.ones(3))) < 1e-6
    assert float(etf_distance(etf, torch.tensor([1.0, 1.0, 0.0]))) > 0.1  # but not for two classes


def test_server_step_is_a_gradient_step_on_the_mean_etf_distance() -> None:
    generator = torch.Generator().manual_seed(0)
    heads = [torch.randn(3, 4, generator=generator, dtype=torch.float64) for _ in range(2)]
    indicators = [torch.tensor([1.0, 1.0, 0.0]), torch.ones(3)]
    stepped = server_head_step(heads, indicators, lr=0.5)
    # independently: central finite differences of r1(W_j; y_j)/2 (M = 2) for each entry of each head
    for j, head in enumerate(heads):
        gradient = torch.zeros_like(head)
        for index in range(head.numel()):
            delta = torch.zeros(head.numel(), dtype=torch.float64)
            delta[index] = 1e-6
            plus = etf_distance(head + delta.view_as(head), indicators[j].double())
            minus = etf_distance(head - delta.view_as(head), indicators[j].double())
            gradient.view(-1)[index] = (plus - minus) / 2e-6 / 2
        assert torch.allclose(stepped[j], head - 0.5 * gradient, atol=1e-7)


def test_class_indicator() -> None:
    assert class_indicator(torch.tensor([2, 0, 2]), 4).tolist() == [1.0, 0.0, 1.0, 0.0]


# ---- wiring ---------------------------------------------------------------------------------------
def test_phases_loss_terms_and_upload(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("flute", tmp_path, local_epochs=3)))
    algorithm = harness.algorithm
    program = algorithm.program
    head = algorithm.head_module
    phases = program.local_phases(0)
    assert [p.epochs for p in phases] == [2, 1]
    assert phases[0].trainable == {f"{head}.weight", f"{head}.bias"}
    assert phases[1].trainable == frozenset(algorithm.layout.trainable)
    assert program.loss_weights == {"etf": 0.25, "head_norm": 0.0025, "feature_norm": 0.0005}
    # the terms on one batch: r3 sums ‖φ(x)‖² over the batch, r2 is ‖W‖²
    data = harness.data
    inputs, targets = data.gather(data.train_indices[0][:5])
    job = type(program).__new__(type(program))
    job.__dict__.update(program.__dict__)
    job.captured, job.indicator = [], class_indicator(data.labels[data.train_indices[0]], 10)
    hook = harness.model.get_submodule(head).register_forward_pre_hook(lambda m, a: job.captured.append(a[0]))
    params = dict(harness.model.named_parameters())
    terms = job.loss_terms(lambda p, x: harness.model(x), params, inputs, targets, {})
    hook.remove()
    features = torch.relu(harness.model.fc2(torch.relu(harness.model.fc1(inputs.flatten(1)))))
    assert torch.allclose(terms["feature_norm"], (features**2).sum())
    assert torch.allclose(terms["head_norm"], (params[f"{head}.weight"] ** 2).sum())
    assert torch.allclose(terms["etf"], etf_distance(params[f"{head}.weight"], job.indicator))


def test_server_averages_bodies_and_steps_the_heads(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("flute", tmp_path, alpha=0.1)))
    algorithm = harness.algorithm
    head = algorithm.head_module
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    updates = [harness.train_client(k, received) for k in range(3)]
    for k, update in enumerate(updates):
        labels = harness.data.labels[harness.data.train_indices[k]]
        assert torch.equal(update.params[CLASSES], class_indicator(labels, 10))
        assert set(update.params) == set(algorithm.layout.shared) | {HEAD, CLASSES}
    algorithm.aggregate(updates)
    expected = server_head_step([u.params[HEAD] for u in updates], [u.params[CLASSES] for u in updates], 0.5)
    total = sum(u.num_samples for u in updates)
    for name in algorithm.layout.shared:
        mean = sum(u.num_samples * u.params[name] for u in updates) / total
        assert torch.allclose(algorithm.global_state[name], mean, atol=1e-6)
    for k in range(3):
        assert torch.allclose(algorithm.store.get(k)[f"{head}.weight"], expected[k])
        assert torch.equal(algorithm.personal_model(k)[f"{head}.weight"], algorithm.store.get(k)[f"{head}.weight"])
    assert FLUTE.method_family == "decoupling" and not FLUTE.has_global_model


# ---- every executor, resume -----------------------------------------------------------------------
def sgd_run(out: Path, **settings) -> RunConfig:
    base = dict(dataset="digits", model="cnn_bn", num_clients=4, rounds=3, alpha=0.3, optimizer="sgd", lr=0.05)
    return RunConfig(algo="flute", out=str(out), **{**base, **settings})


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return sgd_run(out, rounds=4, frac=0.67, checkpoint_every=2, new_clients=0.25, local_epochs=2)

    resumed, whole = killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    assert round_numbers(resumed) == round_numbers(whole)
    assert resumed["pers_acc"] == whole["pers_acc"] and resumed["new_acc"] == whole["new_acc"]


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        sequential = run_experiment(sgd_run(tmp_path / "seq", rounds=2, model="mlp"))
        on_ray = run_experiment(sgd_run(tmp_path / "ray", rounds=2, model="mlp", executor="ray", ray_workers=2))
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "flute", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--etf-weight", "-1"], "--etf-weight must be ≥ 0, got -1.0"),
        (["--head-norm-weight", "-1"], "--head-norm-weight must be ≥ 0"),
        (["--feature-norm-weight", "-1"], "--feature-norm-weight must be ≥ 0"),
        (["--server-head-lr", "-0.5"], "--server-head-lr must be ≥ 0"),
        (["--rep-epochs", "-1"], "--rep-epochs must be ≥ 0, got -1"),
        (["--head-layers", "2"], "--head-layers 2 would be ignored"),
        (["--executor", "vmap"], "vmap"),
        (["--dp", "client"], "cannot make --algo flute private"),
        (["--robust-agg", "krum"], "cannot replace the aggregation of --algo flute"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_runs_from_a_config_file_and_declares_its_search_space(tmp_path: Path, run_config_file) -> None:
    hparams = run_config_file(
        tmp_path,
        "flute",
        'algo = "flute"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\netf_weight = 0.5\nrep_epochs = 0\n',
    )["algo_hparams"]
    assert hparams["etf_weight"] == 0.5 and hparams["rep_epochs"] == 0
    resolved = dataclasses.replace(RunConfig(algo="flute"), lr=0.05)
    assert set(FLUTE.search_space(resolved, FLUTE.hyperparameters())) == {"lr", "etf_weight", "feature_norm_weight"}
