"""Floco: the simplex layer, the samplers of the simplex and of a subregion, the PCA coordinates,
the scaled-simplex projection and the Riesz energy, each against a hand or independent
computation; the server's projection after round τ − 1; resume and Ray give the same numbers;
bad input is one ``Error:`` line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pflbench.algorithms.floco import (
    Z_GRID,
    Floco,
    principal_coordinates,
    project_clients,
    project_to_scaled_simplex,
    riesz_log_energy,
    simplex_weight,
    subregion_sample,
    uniform_simplex_sample,
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
def test_simplex_weight_is_the_convex_combination_of_the_endpoints() -> None:
    endpoints = torch.tensor([[[1.0, 2.0]], [[3.0, -4.0]], [[0.0, 10.0]]])  # M = 3 endpoints of a 1 × 2 weight
    alpha = torch.tensor([0.5, 0.25, 0.25])
    assert torch.allclose(simplex_weight(endpoints, alpha), torch.tensor([[1.25, 2.5]]))


def test_uniform_simplex_sample_is_normalised_exponentials() -> None:
    alpha = uniform_simplex_sample(4, torch.Generator().manual_seed(3))
    u = torch.rand(4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    exponentials = -torch.log(1 - u)
    assert torch.allclose(alpha, exponentials / exponentials.sum())
    assert math.isclose(float(alpha.sum()), 1.0) and bool((alpha > 0).all())


def test_subregion_sample_hand_computed() -> None:
    center = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    alpha = subregion_sample(center, 0.1, torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(5)
    v = 2 * torch.rand(3, generator=generator, dtype=torch.float64) - 1
    r = 0.1 * float(torch.rand((), generator=generator, dtype=torch.float64))
    assert torch.allclose(alpha, center + r * v / v.abs().sum())
    assert float((alpha - center).abs().sum()) <= 0.1 + 1e-12  # within the L1 ball of radius ρ


def test_scaled_simplex_projection_hand_computed() -> None:
    point = np.array([[0.5, 0.2, -0.1]])
    # z = 1: all three in the support, shift (0.6 − 1)/3 = −0.4/3
    assert np.allclose(project_to_scaled_simplex(point, 1.0), [[0.5 + 0.4 / 3, 0.2 + 0.4 / 3, -0.1 + 0.4 / 3]])
    # z = 0.5: support {0.5, 0.2}, shift (0.7 − 0.5)/2 = 0.1
    assert np.allclose(project_to_scaled_simplex(point, 0.5), [[0.4, 0.1, 0.0]])


def test_riesz_log_energy_hand_computed() -> None:
    points = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    # distances √2, √0.5, √0.5: Σ 1/d² = 0.5 + 2 + 2 = 4.5 over 3 pairs
    assert math.isclose(riesz_log_energy(points), math.log(4.5) - math.log(3))
    twins = np.array([[1.0, 0.0], [1.0, 0.0]])  # distance 0 floored at 1e-4
    assert math.isclose(riesz_log_energy(twins), math.log(1e8))


def test_principal_coordinates_are_scikit_learn_s_pca() -> None:
    decomposition = pytest.importorskip("sklearn.decomposition")
    rows = np.random.default_rng(0).normal(size=(6, 9))
    expected = decomposition.PCA(n_components=4).fit_transform(rows)
    assert np.allclose(principal_coordinates(rows, 4), expected)
    padded = principal_coordinates(rows[:3], 5)  # 3 rows: rank ≤ 2 after centring, then zero columns
    assert padded.shape == (3, 5) and np.allclose(padded[:, 3:], 0.0)


def test_projection_picks_the_scale_of_least_energy() -> None:
    gradients = np.random.default_rng(1).normal(size=(5, 12))
    betas = project_clients(gradients, 3)
    assert betas.shape == (5, 3) and np.allclose(betas.sum(axis=1), 1.0) and (betas >= 0).all()
    kappas = principal_coordinates(gradients, 3)
    energies = []
    for z in Z_GRID:
        candidate = project_to_scaled_simplex(kappas, z)
        energies.append(riesz_log_energy(candidate / candidate.sum(axis=1, keepdims=True)))
    assert math.isclose(riesz_log_energy(betas), min(e for e in energies if math.isfinite(e)))
    assert np.allclose(project_clients(gradients[:1], 4), 0.25)  # one client: the centre


# ---- wiring ---------------------------------------------------------------------------------------
def test_the_final_layer_is_a_simplex_evaluated_at_the_client_s_point(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("floco", tmp_path), {"endpoints": 3, "tau": 2}))
    algorithm = harness.algorithm
    head = algorithm.head_module
    assert set(algorithm.layout.private) == {f"{head}.alpha", f"{head}.radius"}
    assert algorithm.global_state[f"{head}.endpoints"].shape[0] == 3
    assert Floco.method_family == "mode_connectivity"
    # round 1 = τ − 1: the clients' pseudo-gradients place them on the simplex
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    updates = [harness.train_client(k, received) for k in range(3)]
    sent = algorithm.global_state[f"{head}.endpoints"].flatten().double()
    gradients = np.stack([(sent - u.params[f"{head}.endpoints"].flatten().double()).numpy() for u in updates])
    algorithm.aggregate(updates)
    expected = project_clients(gradients, 3)
    for k in range(3):
        state = algorithm.store.get(k)
        assert np.allclose(state[f"{head}.alpha"].double().numpy(), expected[k], atol=1e-6)
        assert float(state[f"{head}.radius"]) == pytest.approx(0.1)
    # the evaluated model's layer is W(β_k) = Σ β_k,m θ_m
    harness.load_personal_model(1)
    features = torch.randn(2, harness.model.get_submodule(head).endpoints.shape[2])
    beta = algorithm.store.get(1)[f"{head}.alpha"]
    endpoints = algorithm.global_state[f"{head}.endpoints"]
    manual = features @ (beta[:, None, None] * endpoints).sum(dim=0).t() + algorithm.global_state[f"{head}.bias"]
    assert torch.allclose(harness.model.get_submodule(head)(features), manual, atol=1e-6)


def test_training_samples_the_subregion_after_the_projection(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("floco", tmp_path), {"endpoints": 3, "tau": 2, "rho": 0.05}))
    program = harness.algorithm.program
    head = harness.algorithm.head_module
    program = type(program).__new__(type(program))
    program.__dict__.update(harness.algorithm.program.__dict__)
    program.generator = torch.Generator().manual_seed(0)
    before = {f"{head}.alpha": torch.full((3,), 1 / 3), f"{head}.radius": torch.tensor([-1.0])}
    assert torch.allclose(program.sample_alpha(before), uniform_simplex_sample(3, torch.Generator().manual_seed(0)))
    program.generator = torch.Generator().manual_seed(0)
    after = {f"{head}.alpha": torch.tensor([0.6, 0.3, 0.1]), f"{head}.radius": torch.tensor([0.05])}
    expected = subregion_sample(torch.tensor([0.6, 0.3, 0.1]), 0.05, torch.Generator().manual_seed(0))
    assert torch.allclose(program.sample_alpha(after), expected)


# ---- every executor, resume -----------------------------------------------------------------------
def sgd_run(out: Path, **settings) -> RunConfig:
    base = dict(dataset="digits", model="cnn_bn", num_clients=4, rounds=4, alpha=0.3, optimizer="sgd", lr=0.05)
    return RunConfig(algo="floco", out=str(out), **{**base, **settings})


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return sgd_run(out, checkpoint_every=2, new_clients=0.25)

    # τ = 3: the projection (after round 2) is in the checkpoint, round 3–4 train on subregions
    resumed, whole = killed_and_resumed(
        lambda c, **kw: run_experiment(c, {"tau": 3}, **kw), config, tmp_path, after_round=3
    )
    assert round_numbers(resumed) == round_numbers(whole)
    assert resumed["pers_acc"] == whole["pers_acc"] and resumed["new_acc"] == whole["new_acc"]


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        sequential = run_experiment(sgd_run(tmp_path / "seq", rounds=3, model="mlp"), {"tau": 2})
        on_ray = run_experiment(
            sgd_run(tmp_path / "ray", rounds=3, model="mlp", executor="ray", ray_workers=2), {"tau": 2}
        )
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "floco", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--endpoints", "1"], "--endpoints must be ≥ 2, got 1"),
        (["--tau", "1"], "--tau must be ≥ 2"),
        (["--rho", "-0.1"], "--rho must be in [0, 2]"),
        (["--head-layers", "2"], "--head-layers 2 would be ignored"),
        (["--executor", "vmap"], "vmap"),
        (["--dp", "client"], "cannot make --algo floco private"),
        (["--robust-agg", "krum"], "cannot replace the aggregation of --algo floco"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


NO_BIAS_MODEL = """
from torch import nn
from pflbench import register_model


@register_model("nobias_mlp_floco")
class NoBias(nn.Module):
    layer_names = ("fc1", "fc2")

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(64, 8)
        self.fc2 = nn.Linear(8, num_classes, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x.flatten(1)).relu())
"""


def test_a_final_layer_without_bias_is_refused(tmp_path: Path) -> None:
    plugin = tmp_path / "nobias.py"
    plugin.write_text(NO_BIAS_MODEL)
    out = tmp_path / "out"
    args = ["run", *TINY_ARGS, "--plugin", str(plugin), "--model", "nobias_mlp_floco", "--out", str(out)]
    assert_refused(CliRunner().invoke(cli, args), out, "floco needs a bias in the final layer 'fc2'")


def test_runs_from_a_config_file_and_declares_its_search_space(tmp_path: Path, run_config_file) -> None:
    hparams = run_config_file(
        tmp_path,
        "floco",
        'algo = "floco"\nmodel = "mlp"\nnum_clients = 3\nrounds = 2\nendpoints = 3\ntau = 2\nrho = 0.2\n',
    )["algo_hparams"]
    assert hparams == {"endpoints": 3, "tau": 2, "rho": 0.2}
    resolved = dataclasses.replace(RunConfig(algo="floco"), lr=0.05)
    assert set(Floco.search_space(resolved, Floco.hyperparameters())) == {"lr", "rho", "endpoints"}
