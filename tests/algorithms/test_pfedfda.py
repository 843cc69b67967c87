"""pFedFDA: the Gaussian (LDA) classifier, the local estimates, the β interpolation and its
cross-validated choice, each against a hand or independent computation; the server wiring;
resume and Ray give the same numbers; bad input is one ``Error:`` line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench.algorithms.pfedfda import (
    PFedFDA,
    beta_grid_losses,
    cross_validated_beta,
    gaussian_mle,
    interpolate,
    label_priors,
    lda_head,
    stratified_folds,
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
def test_lda_head_hand_computed() -> None:
    means = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    covariance = torch.diag(torch.tensor([1.0, 4.0]))
    priors = torch.tensor([0.25, 0.75])
    coefs, intercepts = lda_head(means, covariance, priors, eps=0.0)
    # w_c = Σ⁻¹μ_c, b_c = −½·μ_cᵀΣ⁻¹μ_c + log π_c
    assert torch.allclose(coefs, torch.tensor([[1.0, 0.0], [0.0, 0.5]], dtype=torch.float64))
    expected = torch.tensor([-0.5 + math.log(0.25), -0.5 + math.log(0.75)], dtype=torch.float64)
    assert torch.allclose(intercepts, expected)
    # shrinkage ε = 0.5: Σ̃ = 0.5·Σ + 0.5·(tr Σ / 2)·I = diag(1.75, 3.25)
    coefs, intercepts = lda_head(means, covariance, priors, eps=0.5)
    assert torch.allclose(coefs, torch.tensor([[1 / 1.75, 0.0], [0.0, 2 / 3.25]], dtype=torch.float64))
    expected = torch.tensor([-0.5 / 1.75 + math.log(0.25), -0.5 * 4 / 3.25 + math.log(0.75)], dtype=torch.float64)
    assert torch.allclose(intercepts, expected)


def test_lda_logits_are_bayes_rule_of_the_class_gaussians() -> None:
    generator = torch.Generator().manual_seed(0)
    means = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    root = torch.randn(4, 4, generator=generator, dtype=torch.float64)
    covariance = root @ root.t() + 0.5 * torch.eye(4, dtype=torch.float64)
    priors = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    z = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    coefs, intercepts = lda_head(means, covariance, priors, eps=0.0)
    posterior = torch.log_softmax(z @ coefs.t() + intercepts, dim=1)
    gaussians = [torch.distributions.MultivariateNormal(m, covariance) for m in means]
    joint = torch.stack([g.log_prob(z) for g in gaussians], dim=1) + priors.log()
    assert torch.allclose(posterior, torch.log_softmax(joint, dim=1), atol=1e-10)


def test_local_estimates_hand_computed() -> None:
    features = torch.tensor([[0.0, 0.0], [2.0, 0.0], [4.0, 3.0], [1.0, 1.0]])
    labels = torch.tensor([0, 0, 0, 1])
    fallback = torch.tensor([[9.0, 9.0], [5.0, 5.0], [7.0, 7.0]])
    means, covariance = gaussian_mle(features, labels, fallback, eps=0.1)
    # class 0 (3 > 2 samples): its mean (2, 1); class 1 (1 sample) and 2 (none): the fallback's
    assert torch.allclose(means, torch.tensor([[2.0, 1.0], [5.0, 5.0], [7.0, 7.0]], dtype=torch.float64))
    # centred: (−2, −1), (0, −1), (2, 2), (−4, −4): scatter [[24, 22], [22, 22]], / (n − 1) = 3, + 0.1·I
    expected = torch.tensor([[8.0 + 0.1, 22 / 3], [22 / 3, 22 / 3 + 0.1]], dtype=torch.float64)
    assert torch.allclose(covariance, expected)


def test_priors_and_interpolation_hand_computed() -> None:
    priors = label_priors(torch.tensor([3, 1, 0]), eps=0.1)
    assert torch.allclose(priors, torch.tensor([0.85, 0.35, 0.1], dtype=torch.float64) / 1.3)
    local, global_ = torch.tensor([4.0, 0.0]), torch.tensor([0.0, 8.0])
    assert torch.equal(interpolate(local, global_, 0.25), torch.tensor([1.0, 6.0]))  # β·local + (1 − β)·global


def test_stratified_folds_deal_each_class_round_robin_and_leave_out_rare_classes() -> None:
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 2, 2])
    folds = stratified_folds(labels, 2, torch.Generator().manual_seed(0))
    assert folds[4] == -1  # class 1 has one sample < 2 folds
    assert sorted(folds[:4].tolist()) == [0, 0, 1, 1] and sorted(folds[5:].tolist()) == [0, 0, 1]


def test_grid_loss_is_the_held_out_cross_entropy_of_the_interpolated_classifier() -> None:
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(12, 3, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2] * 4)
    assignment = torch.tensor([0, 0, 0, 1, 1, 1] * 2)
    global_means = torch.randn(3, 3, generator=generator, dtype=torch.float64)
    global_covariance = 2 * torch.eye(3, dtype=torch.float64)
    priors = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    grid = torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64)
    losses = beta_grid_losses(features, labels, assignment, global_means, global_covariance, priors, grid, 0.0)
    # independently: (β_μ, β_Σ) = (0.25, 1.0), each fold's Gaussians fitted on the other fold by hand
    total = 0.0
    for fold in (0, 1):
        train, test = assignment != fold, assignment == fold
        x, y = features[train], labels[train]
        own = torch.stack([x[y == c].mean(dim=0) for c in range(3)])  # 2 samples per class ≤ 2: fallback!
        assert all(int((y == c).sum()) == 2 for c in range(3))
        means = 0.25 * global_means + 0.75 * global_means  # every class falls back to the global mean
        assert not torch.allclose(own, global_means)
        centred = x - global_means[y]
        covariance = centred.t() @ centred / (len(y) - 1)
        gaussians = [torch.distributions.MultivariateNormal(m, covariance) for m in means]
        joint = torch.stack([g.log_prob(features[test]) for g in gaussians], dim=1) + priors.log()
        total += float(torch.nn.functional.cross_entropy(joint, labels[test]))
    assert math.isclose(float(losses[1, 2]), total, rel_tol=1e-9)


def test_grid_loss_with_own_class_means_hand_fitted() -> None:
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(18, 2, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1] * 9)
    assignment = torch.tensor([0] * 6 + [1] * 12)  # fold 0: 3 per class held out; its train fold has 6 per class
    global_means = torch.tensor([[3.0, 0.0], [0.0, -3.0]], dtype=torch.float64)
    global_covariance = torch.eye(2, dtype=torch.float64)
    priors = torch.tensor([0.5, 0.5], dtype=torch.float64)
    grid = torch.tensor([0.5, 1.0], dtype=torch.float64)
    losses = beta_grid_losses(features, labels, assignment, global_means, global_covariance, priors, grid, 0.0)
    total = 0.0
    for fold in (0, 1):
        train, test = assignment != fold, assignment == fold
        x, y = features[train], labels[train]
        own = torch.stack([x[y == c].mean(dim=0) for c in range(2)])
        means = 0.5 * own + 0.5 * global_means  # β_μ = 0.5
        centred = x - own[y]
        local_covariance = centred.t() @ centred / (len(y) - 1)
        covariance = 1.0 * local_covariance + 0.0 * global_covariance  # β_Σ = 1
        gaussians = [torch.distributions.MultivariateNormal(m, covariance) for m in means]
        joint = torch.stack([g.log_prob(features[test]) for g in gaussians], dim=1) + priors.log()
        total += float(torch.nn.functional.cross_entropy(joint, labels[test]))
    assert math.isclose(float(losses[0, 1]), total, rel_tol=1e-9)


def gaussian_client(shift: float, per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[shift, 0.0], [0.0, shift]], dtype=torch.float64)
    labels = torch.tensor([0, 1] * per_class)
    return centres[labels] + 0.3 * torch.randn(len(labels), 2, generator=generator, dtype=torch.float64), labels


def test_cross_validation_trusts_local_means_when_the_global_ones_are_wrong() -> None:
    features, labels = gaussian_client(2.0, 20, seed=0)
    wrong = torch.tensor([[0.0, 2.0], [2.0, 0.0]], dtype=torch.float64)  # the classes' means swapped
    priors = torch.tensor([0.5, 0.5], dtype=torch.float64)
    args = (features, labels, wrong, torch.eye(2, dtype=torch.float64), priors)
    beta_mean, _ = cross_validated_beta(*args, "cv", 11, 2, 1e-4, torch.Generator().manual_seed(0))
    assert beta_mean == 1.0
    single = cross_validated_beta(*args, "single", 11, 2, 1e-4, torch.Generator().manual_seed(0))
    assert single[0] == single[1] and single[0] > 0.5
    assert cross_validated_beta(*args, "local", 11, 2, 1e-4, torch.Generator()) == (1.0, 1.0)
    # no class with ≥ 2 samples: no split, the global statistics alone (the authors' fallback)
    one_each = cross_validated_beta(features[:2], labels[:2], *args[2:], "cv", 11, 2, 1e-4, torch.Generator())
    assert one_each == (0.0, 0.0)


# ---- wiring ---------------------------------------------------------------------------------------
def test_client_trains_the_body_against_the_global_lda_head_and_uploads_adapted_statistics(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("pfedfda", tmp_path, alpha=0.1)))
    algorithm = harness.algorithm
    head = algorithm.head_module
    assert set(algorithm.layout.private) == {f"{head}.weight", f"{head}.bias"}
    assert {f"{head}.means", f"{head}.covariance"} <= set(algorithm.layout.shared)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    update = harness.train_client(0, received)
    assert f"{head}.weight" not in update.params and not update.private
    # the frozen head the body trained against is LDA(μ_g, Σ_g, π_0)
    data = harness.data
    counts = torch.bincount(data.labels[data.train_indices[0]], minlength=data.num_classes)
    coefs, intercepts = lda_head(
        received[f"{head}.means"], received[f"{head}.covariance"], label_priors(counts, 1e-4), 1e-4
    )
    assert torch.allclose(harness.state[f"{head}.weight"], coefs.float())
    assert torch.allclose(harness.state[f"{head}.bias"], intercepts.float())
    # a class the client lacks keeps the global mean: β·μ_g + (1 − β)·μ_g
    absent = counts == 0
    assert bool(absent.any())
    assert torch.allclose(update.params[f"{head}.means"][absent], received[f"{head}.means"][absent])
    assert not torch.allclose(update.params[f"{head}.means"][~absent], received[f"{head}.means"][~absent])
    covariance = update.params[f"{head}.covariance"]
    assert torch.allclose(covariance, covariance.t()) and float(torch.linalg.eigvalsh(covariance.double()).min()) > 0


def test_global_model_is_the_lda_of_the_global_statistics_with_uniform_priors(tmp_path: Path) -> None:
    algorithm = prepare(tiny_run("pfedfda", tmp_path)).algorithm
    head = algorithm.head_module
    state = algorithm.global_model()
    uniform = torch.full((10,), 0.1, dtype=torch.float64)
    coefs, intercepts = lda_head(state[f"{head}.means"], state[f"{head}.covariance"], uniform, 1e-4)
    assert torch.allclose(state[f"{head}.weight"], coefs.float()) and torch.allclose(
        state[f"{head}.bias"], intercepts.float()
    )
    assert algorithm.personalization_program() is not None and PFedFDA.method_family == "representation"


def test_evaluation_adapts_the_global_statistics_to_each_client(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("pfedfda", tmp_path, alpha=0.1)))
    algorithm = harness.algorithm
    head = algorithm.head_module
    program = algorithm.personalization_program()
    from pflbench import ClientJob

    personal = algorithm.personal_model(1)
    job = ClientJob(1, 1, 7, personal, {})
    (update,) = harness.executor.train(program, [job])
    data = harness.data
    counts = torch.bincount(data.labels[data.train_indices[1]], minlength=data.num_classes)
    priors = label_priors(counts, 1e-4)
    # the evaluated head is LDA of statistics that moved away from the global ones towards the client's
    global_head, _ = lda_head(personal[f"{head}.means"], personal[f"{head}.covariance"], priors, 1e-4)
    assert not torch.allclose(update.params[f"{head}.weight"], global_head.float())
    trained = {n: t for n, t in update.params.items() if not n.startswith(head)}
    assert all(torch.equal(t, personal[n]) for n, t in trained.items())  # nothing is trained


# ---- every executor, resume -----------------------------------------------------------------------
def sgd_run(out: Path, **settings) -> RunConfig:
    base = dict(dataset="digits", model="cnn_bn", num_clients=4, rounds=3, alpha=0.3, optimizer="sgd", lr=0.05)
    return RunConfig(algo="pfedfda", out=str(out), **{**base, **settings})


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return sgd_run(out, rounds=4, frac=0.67, checkpoint_every=2, new_clients=0.25)

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
TINY_ARGS = ["--algo", "pfedfda", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
NO_BIAS_MODEL = """
from torch import nn
from pflbench import register_model


@register_model("nobias_mlp")
class NoBias(nn.Module):
    layer_names = ("fc1", "fc2")

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(64, 8)
        self.fc2 = nn.Linear(8, num_classes, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x.flatten(1)).relu())
"""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--beta-grid", "1"], "--beta-grid must be ≥ 2, got 1"),
        (["--cv-folds", "1"], "--cv-folds must be ≥ 2, got 1"),
        (["--eps", "1"], "--eps must be in [0, 1), got 1.0"),
        (["--eps", "-0.1"], "--eps must be in [0, 1)"),
        (["--beta-mode", "both"], "both"),
        (["--beta-mode", "local", "--beta-grid", "5"], "beta-grid"),
        (["--head-layers", "2"], "--head-layers 2 would be ignored"),
        (["--executor", "vmap"], "vmap"),
        (["--dp", "client"], "cannot make --algo pfedfda private"),
        (["--robust-agg", "krum"], "cannot replace the aggregation of --algo pfedfda"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_a_final_layer_without_bias_is_refused(tmp_path: Path) -> None:
    plugin = tmp_path / "nobias.py"
    plugin.write_text(NO_BIAS_MODEL)
    out = tmp_path / "out"
    args = ["run", *TINY_ARGS, "--plugin", str(plugin), "--model", "nobias_mlp", "--out", str(out)]
    assert_refused(CliRunner().invoke(cli, args), out, "pfedfda needs a bias in the final layer 'fc2'")


def test_runs_from_a_config_file_and_declares_its_search_space(tmp_path: Path, run_config_file) -> None:
    hparams = run_config_file(
        tmp_path,
        "pfedfda",
        'algo = "pfedfda"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\nbeta_mode = "single"\nbeta_grid = 6\n',
    )["algo_hparams"]
    assert hparams["beta_mode"] == "single" and hparams["beta_grid"] == 6
    resolved = dataclasses.replace(RunConfig(algo="pfedfda"), lr=0.05)
    assert set(PFedFDA.search_space(resolved, PFedFDA.hyperparameters())) == {"lr"}
