"""FedCAC: the critical-parameter mask, the overlap and its rising threshold, the collaboration
sets and the mixed model, each against a hand computation; the server wiring; resume, vmap and
Ray give the sequential numbers; bad input is one ``Error:`` line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench import ClientUpdate
from pflbench.algorithms.fedcac import (
    MASK,
    FedCAC,
    collaboration_sets,
    collaboration_threshold,
    combine,
    critical_mask,
    overlap_matrix,
    sensitivity,
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
def test_sensitivity_is_update_times_parameter_and_the_mask_its_top_tau() -> None:
    start = torch.tensor([0.5, 4.0, 1.0, 1.0])
    trained = torch.tensor([2.0, 0.1, 1.5, -3.0])
    score = sensitivity(trained, start)  # |Δθ ⊙ θ| = |[1.5, −3.9, 0.5, −4]·[2, 0.1, 1.5, −3]|
    assert torch.allclose(score, torch.tensor([3.0, 0.39, 0.75, 12.0]))
    # top ⌊0.5·4⌋ = 2 scores {12, 3}; |Δθ| alone or |Δθ ⊙ θ^start| would pick position 1 instead
    assert critical_mask(score, 0.5).tolist() == [True, False, False, True]
    assert critical_mask(score, 0.75).tolist() == [True, False, True, True]  # top 3
    assert critical_mask(score, 1.0).all()
    assert not critical_mask(torch.tensor([5.0]), 0.5).any()  # ⌊0.5·1⌋ = 0: nothing critical


def test_a_vanishing_threshold_is_replaced_by_the_smallest_nonzero_score() -> None:
    score = torch.tensor([0.0, 0.0, 0.0, 1e-12])
    # the 2nd largest score is 0 ≤ 1e-10: the threshold becomes 1e-12 (else every entry is critical)
    assert critical_mask(score, 0.5).tolist() == [False, False, False, True]
    assert critical_mask(torch.zeros(4), 0.5).all()  # nothing moved: no nonzero score, threshold 0 keeps all


def test_overlap_threshold_and_collaboration_sets_hand_computed() -> None:
    masks = [torch.tensor([1, 1, 0, 0]), torch.tensor([1, 0, 1, 0]), torch.tensor([0, 1, 1, 1])]
    overlap = overlap_matrix(masks)
    # o_kj = 1 − ‖m_k − m_j‖₁ / (2‖m_k‖₁): ‖m_3‖₁ = 3 makes the matrix asymmetric
    expected = torch.tensor([[1.0, 0.5, 0.25], [0.5, 1.0, 0.25], [0.5, 0.5, 1.0]], dtype=torch.float64)
    assert torch.allclose(overlap, expected)
    mean, largest = 2.5 / 6, 0.5  # over the 6 ordered pairs
    assert math.isclose(collaboration_threshold(overlap, 1, 4), mean + 0.25 * (largest - mean))
    assert math.isclose(collaboration_threshold(overlap, 3, 4), mean + 0.75 * (largest - mean))
    # t = 1, β = 2: ν = 0.4583 → client 3 (o = 0.5, 0.5) joins both others; 1 and 2 skip 3 (0.25)
    assert collaboration_sets(overlap, 1, 2) == [[0, 1], [0, 1], [0, 1, 2]]
    assert collaboration_sets(overlap, 2, 2) == [[0, 1], [0, 1], [0, 1, 2]]  # ν = max: ≥ keeps ties
    assert collaboration_sets(overlap, 3, 2) == [[0], [1], [2]]  # t > β: ν above every overlap
    assert collaboration_sets(overlap[:1, :1], 1, 2) == [[0]]  # a lone client


def test_an_empty_mask_overlaps_nobody() -> None:
    overlap = overlap_matrix([torch.zeros(3), torch.tensor([1.0, 0.0, 1.0])])
    assert overlap[0, 1] == 0.0 and overlap[0, 0] == 1.0  # the empty row
    assert overlap[1, 0] == 0.5  # 1 − ‖[1, 0, 1]‖₁ / (2·2)


def test_combine_takes_critical_entries_from_the_customized_model() -> None:
    mask = {"w": torch.tensor([True, False, True])}
    mixed = combine(mask, {"w": torch.tensor([1.0, 2.0, 3.0])}, {"w": torch.tensor([10.0, 20.0, 30.0])})
    assert mixed["w"].tolist() == [1.0, 20.0, 3.0]


# ---- wiring ---------------------------------------------------------------------------------------
def test_server_averages_globally_customizes_by_overlap_and_mixes_by_mask(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedcac", tmp_path), {"tau": 0.5, "beta": 2}))
    algorithm = harness.algorithm
    names = algorithm.layout.shared
    assert names == tuple(algorithm.layout.trainable)  # BatchNorm-free mlp: every parameter travels
    generator = torch.Generator().manual_seed(0)
    models = [
        {n: torch.randn(t.shape, generator=generator) for n, t in algorithm.global_state.items()} for _ in range(3)
    ]
    # masks with the overlaps of the hand-computed test: first 4 entries of every tensor flattened
    patterns = [[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 1]]
    masks = []
    for pattern in patterns:
        mask = {}
        for n, t in algorithm.global_state.items():
            flat = torch.zeros(t.numel(), dtype=torch.bool)
            flat[:4] = torch.tensor(pattern, dtype=torch.bool)
            mask[n] = flat.reshape(t.shape)
        masks.append(mask)
    sizes = [10, 30, 60]
    updates = [ClientUpdate(k, sizes[k], {**models[k], **{MASK + n: masks[k][n] for n in names}}, {}) for k in range(3)]
    algorithm.aggregate(updates)
    for n in names:  # θ̄: sample-weighted
        expected = 0.1 * models[0][n] + 0.3 * models[1][n] + 0.6 * models[2][n]
        assert torch.allclose(algorithm.global_state[n], expected, atol=1e-6)
    # t = 1, β = 2: C_0 = {0, 1}, C_2 = {0, 1, 2} (plain means)
    sent = algorithm.broadcast(0)
    for n in names:
        customized = (models[0][n] + models[1][n]) / 2
        expected = torch.where(masks[0][n], customized, algorithm.global_state[n])
        assert torch.allclose(sent[n], expected, atol=1e-6)
    third = algorithm.broadcast(2)
    for n in names:
        customized = (models[0][n] + models[1][n] + models[2][n]) / 3
        assert torch.allclose(third[n], torch.where(masks[2][n], customized, algorithm.global_state[n]), atol=1e-6)
    assert algorithm.round_diagnostics(updates) == {"fedcac_collaborators_mean": 7 / 3, "fedcac_collaborators_max": 3}


def test_a_client_uploads_its_model_and_the_mask_of_its_own_update(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedcac", tmp_path), {"tau": 0.3}))
    received = {n: t.clone() for n, t in harness.algorithm.broadcast(0).items()}
    update = harness.train_client(0, received)
    for n in harness.algorithm.layout.shared:
        expected = critical_mask(sensitivity(update.params[n], received[n]), 0.3)
        assert torch.equal(update.params[MASK + n], expected)
        assert 0.29 <= float(expected.float().mean()) <= 0.35 or expected.numel() < 10


def test_batchnorm_statistics_stay_private(tmp_path: Path) -> None:
    algorithm = prepare(dataclasses.replace(tiny_run("fedcac", tmp_path), model="cnn_bn")).algorithm
    assert algorithm.layout.private and all("running" in n for n in algorithm.layout.private)
    assert FedCAC.method_family == "decoupling" and FedCAC.has_global_model


def test_each_client_is_evaluated_with_its_own_mixed_model(tmp_path: Path) -> None:
    """Regression: FedCAC holds no private tensors and its personal model is what it would
    receive, but clients receive different models (its broadcast), so evaluation must not take
    the one-pass shortcut for a shared model (it did: pers_acc was the global model's accuracy)."""
    algorithm = prepare(tiny_run("fedcac", tmp_path)).algorithm
    assert not algorithm.layout.private and not algorithm.clients_share_one_model()
    summary = run_experiment(sgd_run(tmp_path / "run"), {"beta": 1})
    assert summary["pers_acc_weighted"] != summary["global_acc"]  # equal while each got θ̄


# ---- every executor, resume -----------------------------------------------------------------------
def sgd_run(out: Path, **settings) -> RunConfig:
    base = dict(dataset="digits", model="mlp", num_clients=4, rounds=3, alpha=0.3, optimizer="sgd", lr=0.05)
    return RunConfig(algo="fedcac", out=str(out), **{**base, **settings})


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return sgd_run(out, rounds=4, frac=0.67, checkpoint_every=2, model="cnn_bn")

    resumed, whole = killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    assert round_numbers(resumed) == round_numbers(whole)
    assert resumed["pers_acc"] == whole["pers_acc"]


def test_vmap_gives_the_sequential_numbers(tmp_path: Path) -> None:
    sequential = round_numbers(run_experiment(sgd_run(tmp_path / "seq", batch_size=16)))
    vectorized = round_numbers(run_experiment(sgd_run(tmp_path / "vmap", batch_size=16, executor="vmap")))
    for a, b in zip(sequential, vectorized, strict=True):
        assert a["pers_acc"] == b["pers_acc"] and a["fedcac_collaborators_mean"] == b["fedcac_collaborators_mean"]
        assert math.isclose(a["train_loss"], b["train_loss"], rel_tol=1e-4)


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        sequential = run_experiment(sgd_run(tmp_path / "seq", rounds=2))
        on_ray = run_experiment(sgd_run(tmp_path / "ray", rounds=2, executor="ray", ray_workers=2))
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "fedcac", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tau", "0"], "--tau must be in (0, 1], got 0.0"),
        (["--tau", "1.5"], "--tau must be in (0, 1]"),
        (["--beta", "0"], "--beta must be an integer ≥ 1, got 0"),
        (["--dp", "client"], "cannot make --algo fedcac private"),
        (["--robust-agg", "krum"], "cannot replace the aggregation of --algo fedcac"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_runs_from_a_config_file_and_declares_its_search_space(tmp_path: Path, run_config_file) -> None:
    hparams = run_config_file(
        tmp_path, "fedcac", 'algo = "fedcac"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\ntau = 0.3\nbeta = 10\n'
    )["algo_hparams"]
    assert hparams == {"tau": 0.3, "beta": 10}
    resolved = dataclasses.replace(RunConfig(algo="fedcac"), lr=0.05)
    assert {"lr", "tau", "beta"} <= set(FedCAC.search_space(resolved, FedCAC.hyperparameters()))
