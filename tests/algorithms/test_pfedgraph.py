"""pFedGraph: the graph QP against a closed-form and a brute-force solution, the cosine distances
with their 0.9 cut, the graph aggregation and the cosine regulariser (its sign: the paper's)
against hand computations; the server wiring; resume, vmap and Ray give the sequential numbers;
bad input is one ``Error:`` line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench import ClientUpdate
from pflbench.algorithms.pfedgraph import (
    DIRECTION,
    PFedGraph,
    aggregate_by_graph,
    cosine_term,
    graph_distances,
    graph_objective,
    graph_row,
    simplex_projection,
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
def test_cosine_distances_with_the_authors_cut() -> None:
    updates = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.1], [-1.0, 0.0]], dtype=torch.float64)
    d = graph_distances(updates)
    assert math.isclose(float(d[0, 1]), -1 / math.sqrt(2))  # cos 45° = 0.707 ≤ 0.9: d = −cos
    assert float(d[0, 2]) == -1.0  # cos = 1/√1.01 = 0.995 > 0.9: counted as identical
    assert math.isclose(float(d[0, 3]), 1.0)  # opposite updates: d = +1
    assert float(d[1, 1]) == -1.0 and torch.allclose(d, d.T)


def test_graph_row_two_clients_closed_form() -> None:
    # minimise Σ a_j d_j + α‖a − p‖², a = (x, 1 − x): d/dx = d_1 − d_2 + 2α(2x − 1) = 0 (p = ½, ½)
    # α = 0.8, d = (−1, −0.2): x = ½ − (d_1 − d_2)/(4α) = ½ + 0.8/3.2 = 0.75
    row = graph_row(torch.tensor([-1.0, -0.2], dtype=torch.float64), torch.tensor([0.5, 0.5]).double(), 0.8)
    assert torch.allclose(row, torch.tensor([0.75, 0.25], dtype=torch.float64))
    # a small α lets the similarity win outright: the unconstrained x > 1 is clipped to the vertex
    row = graph_row(torch.tensor([-1.0, 1.0], dtype=torch.float64), torch.tensor([0.5, 0.5]).double(), 0.1)
    assert row.tolist() == [1.0, 0.0]


def test_graph_row_matches_a_brute_force_search_over_the_simplex() -> None:
    generator = torch.Generator().manual_seed(3)
    step = 0.005
    i, j = torch.meshgrid(torch.arange(201), torch.arange(201), indexing="ij")
    keep = (i + j) <= 200
    grid = torch.stack([i[keep] * step, j[keep] * step, 1 - (i[keep] + j[keep]) * step], dim=1).double()
    for alpha in (0.05, 0.3, 0.8, 5.0):
        distances = -torch.rand(3, generator=generator, dtype=torch.float64)
        shares = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
        row = graph_row(distances, shares, alpha)
        assert math.isclose(float(row.sum()), 1.0) and bool((row >= 0).all())
        values = grid @ distances + alpha * (grid - shares).pow(2).sum(dim=1)  # the objective on the grid
        best = float(values.min())
        found = graph_objective(row, distances, shares, alpha)
        assert found <= best + 1e-12, (alpha, found, best)  # never worse than any grid point
        assert found >= best - 2 * step, (alpha, found, best)  # and the grid gets within its step


def test_simplex_projection_hand_computed() -> None:
    # v = (1.125, 0.625): θ = (1.125 + 0.625 − 1)/2 = 0.375
    assert simplex_projection(torch.tensor([1.125, 0.625])).tolist() == [0.75, 0.25]
    # v = (2, 0, −1): only the first stays, θ = 1
    assert simplex_projection(torch.tensor([2.0, 0.0, -1.0])).tolist() == [1.0, 0.0, 0.0]


def test_aggregate_by_graph_and_the_direction_hand_computed() -> None:
    models = [
        {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0])},
        {"w": torch.tensor([0.0, 2.0]), "b": torch.tensor([3.0])},
    ]
    aggregated, direction = aggregate_by_graph(models, [0.25, 0.75], ["w"])
    assert torch.allclose(aggregated["w"], torch.tensor([0.75, 2.5])) and torch.allclose(
        aggregated["b"], torch.tensor([2.5])
    )
    # c = 0.25·(3, 4)/5 + 0.75·(0, 2)/2 = (0.15, 0.2 + 0.75)
    assert set(direction) == {"w"} and torch.allclose(direction["w"], torch.tensor([0.15, 0.95]))


def test_cosine_term_rewards_alignment() -> None:
    params = {"w": torch.tensor([3.0, 4.0], requires_grad=True)}
    direction = {"w": torch.tensor([0.6, 0.0])}
    term = cosine_term(params, direction)
    assert math.isclose(float(term.detach()), -(3 * 0.6) / 5, rel_tol=1e-6)  # −⟨w, c⟩/‖w‖
    term.backward()
    # a gradient step (w − η∇) turns w towards c: the cosine with c grows (the paper's sign)
    stepped = params["w"].detach() - 1.0 * params["w"].grad
    assert float(stepped[0] / stepped.norm()) > 3 / 5


# ---- wiring ---------------------------------------------------------------------------------------
def test_server_solves_one_row_per_client_and_sends_its_aggregate(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("pfedgraph", tmp_path), {"graph_alpha": 0.5}))
    algorithm = harness.algorithm
    generator = torch.Generator().manual_seed(0)
    initial = algorithm.initial_state
    models = [
        {n: initial[n] + 0.1 * torch.randn(t.shape, generator=generator) for n, t in algorithm.global_state.items()}
        for _ in range(3)
    ]
    sizes = [10, 30, 60]
    algorithm.aggregate([ClientUpdate(k, sizes[k], models[k], {}) for k in range(3)])
    trainable = algorithm.layout.trainable
    flat = torch.stack([torch.cat([(m[n] - initial[n]).reshape(-1) for n in trainable]).double() for m in models])
    distances = graph_distances(flat)
    shares = torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64)
    row = graph_row(distances[1], shares, 0.5)
    sent = algorithm.broadcast(1)
    for n in algorithm.layout.shared:
        assert torch.allclose(sent[n], sum(a * m[n] for a, m in zip(row.tolist(), models)), atol=1e-6)
    norms = [math.sqrt(sum(float(m[n].pow(2).sum()) for n in trainable)) for m in models]
    for n in trainable:
        expected = sum(a * m[n] / norm for a, m, norm in zip(row.tolist(), models, norms))
        assert torch.allclose(sent[DIRECTION + n], expected, atol=1e-6)
    assert torch.equal(algorithm.personal_model(1)[trainable[0]], sent[trainable[0]])
    # a client never aggregated: w⁰ and no pull
    assert all(float(algorithm.broadcast(0)[DIRECTION + n].abs().sum()) > 0 for n in trainable)
    harness.algorithm.personalized.clear()
    harness.algorithm.direction.clear()
    fresh = algorithm.broadcast(2)
    assert all(torch.equal(fresh[n], initial[n]) for n in trainable)
    assert all(float(fresh[DIRECTION + n].abs().sum()) == 0 for n in trainable)
    assert PFedGraph.method_family == "model_combination" and not PFedGraph.has_global_model


def test_local_loss_carries_the_weighted_cosine_term(tmp_path: Path) -> None:
    summary = run_experiment(
        RunConfig(**{**SGD, "rounds": 2}, algo="pfedgraph", out=str(tmp_path)), {"graph_lambda": 0.5}
    )
    first, second = round_numbers(summary)
    assert first["loss_graph"] == 0.0  # no aggregate before the first round
    assert -1.0 <= second["loss_graph"] < -0.5  # −Σ a_ij cos(w, w_j): neighbours point the same way
    assert math.isclose(second["train_loss"], second["loss_task"] + 0.5 * second["loss_graph"], rel_tol=1e-6)


# ---- every executor, resume -----------------------------------------------------------------------
SGD = dict(dataset="digits", model="mlp", num_clients=4, rounds=3, alpha=0.3, optimizer="sgd", lr=0.05)


def sgd_run(out: Path, **settings) -> RunConfig:
    return RunConfig(algo="pfedgraph", out=str(out), **{**SGD, **settings})


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return sgd_run(out, rounds=4, frac=0.67, checkpoint_every=2, model="cnn_bn")

    resumed, whole = killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    assert round_numbers(resumed) == round_numbers(whole)


def test_vmap_gives_the_sequential_numbers(tmp_path: Path) -> None:
    sequential = round_numbers(run_experiment(sgd_run(tmp_path / "seq", batch_size=16)))
    vectorized = round_numbers(run_experiment(sgd_run(tmp_path / "vmap", batch_size=16, executor="vmap")))
    for a, b in zip(sequential, vectorized, strict=True):
        assert a["pers_acc"] == b["pers_acc"]
        for key in ("train_loss", "loss_graph", "pfedgraph_self_weight_mean"):
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-7), key


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        sequential = run_experiment(sgd_run(tmp_path / "seq", rounds=2))
        on_ray = run_experiment(sgd_run(tmp_path / "ray", rounds=2, executor="ray", ray_workers=2))
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "pfedgraph", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--graph-alpha", "0"], "--graph-alpha must be > 0, got 0.0"),
        (["--graph-lambda", "-1"], "--graph-lambda must be ≥ 0, got -1.0"),
        (["--dp", "client"], "cannot make --algo pfedgraph private"),
        (["--attack", "gaussian", "--attackers", "0.34"], "has none to poison"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_runs_from_a_config_file(tmp_path: Path, run_config_file) -> None:
    assert run_config_file(
        tmp_path, "pfedgraph", 'algo = "pfedgraph"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\ngraph_alpha = 0.4\n'
    )["algo_hparams"] == {
        "graph_alpha": 0.4,
        "graph_lambda": 0.01,
    }
