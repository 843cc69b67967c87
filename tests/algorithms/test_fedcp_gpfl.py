"""FedCP and GPFL — each defining formula against hand-computed values on small tensors, plus the
wiring: what travels, what stays private, what a client computes in its local update."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from pflbench.algorithms.fedcp import (
    ConditionalPolicyHeads,
    FedCP,
    FedCPHyperparameters,
    client_vector,
    lr_matched_weight,
    mixed_global_head,
    mmd_rbf,
    policy_masks,
    resolved_mmd_weight,
)
from pflbench.algorithms.gpfl import (
    GPFL,
    ConditionalValveHead,
    GPFLHyperparameters,
    angle_level_loss,
    class_shares,
    conditional_inputs,
    magnitude_level_loss,
    squared_norm,
    valve,
)
from pflbench.config.groups import LocalSpec
from pflbench.errors import ConfigError
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness, tiny_run

LN3 = math.log(3.0)


# ---- FedCP: formulas ---------------------------------------------------------------------
def test_client_vector_is_the_normalised_sum_of_the_personal_heads_rows() -> None:
    weight = torch.tensor([[1.0, 2.0], [3.0, -2.0]])  # rows sum to (4, 0)
    assert torch.equal(client_vector(weight), torch.tensor([1.0, 0.0]))
    weight = torch.tensor([[1.0, 1.0], [2.0, 3.0]])  # (3, 4) / 5
    assert torch.allclose(client_vector(weight), torch.tensor([0.6, 0.8]))


def test_policy_masks_split_each_dimension_between_the_two_heads() -> None:
    scores = torch.tensor([[0.0, LN3, LN3, 0.0]])  # s¹ = (0, ln 3), s² = (ln 3, 0)
    personal, generic = policy_masks(scores, 1.0)
    assert torch.allclose(personal, torch.tensor([[0.25, 0.75]]))  # e^0/(e^0 + 3), 3/(3 + 1)
    assert torch.allclose(generic, torch.tensor([[0.75, 0.25]]))
    personal, generic = policy_masks(scores, 0.5)  # τ = ½ squares the odds: 1:9
    assert torch.allclose(personal, torch.tensor([[0.1, 0.9]]))
    noise = torch.tensor([[LN3, 0.0, 0.0, 0.0]])  # Gumbel noise on s¹₁: (ln 3, ln 3) → even
    personal, generic = policy_masks(scores, 1.0, noise)
    assert torch.allclose(personal, torch.tensor([[0.5, 0.75]]))
    assert torch.allclose(personal + generic, torch.ones(1, 2))


def test_mmd_rbf_hand_computed() -> None:
    x, y = torch.tensor([[0.0]]), torch.tensor([[2.0]])  # ‖x − y‖² = 4
    cross = sum(math.exp(-4.0 / (2 * sigma)) for sigma in (10, 15, 20, 50))
    assert mmd_rbf(x, y).item() == pytest.approx(4 + 4 - 2 * cross)  # K(a, a) = 4 kernels × e^0
    # two samples each: the mean over the 2×2 blocks
    x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [1.0]])
    assert mmd_rbf(x, y).item() == pytest.approx(0.0, abs=1e-6)
    assert mmd_rbf(x, x + 1).item() > 0


def test_mixed_global_head_is_the_mean_of_personal_and_global() -> None:
    assert torch.equal(mixed_global_head(torch.tensor([2.0, -1.0]), torch.tensor([4.0, 1.0])), torch.tensor([3.0, 0.0]))


def test_policy_heads_route_the_masked_features_to_each_head() -> None:
    torch.manual_seed(0)
    heads = ConditionalPolicyHeads(nn.Linear(3, 2), policy_seed=7)
    assert torch.equal(heads.personal.weight, heads.generic.weight)  # φ_p starts as a copy of φ_g
    assert torch.equal(heads.client_vector, client_vector(heads.personal.weight))
    with torch.no_grad():
        heads.personal.weight.mul_(2)
    heads.eval()
    z = torch.randn(4, 3)
    with torch.no_grad():
        scores = torch.relu(heads.policy_norm(heads.policy(z * heads.client_vector)))
        personal, generic = policy_masks(scores, 1.0)
        expected = heads.personal(z * personal) + heads.generic(z * generic)
        output = heads(z)
    assert torch.allclose(output, expected) and torch.equal(output.fedcp_features, z)
    heads.train()  # training with a generator: seeded Gumbel noise; without one: none
    heads.noise_generator = torch.Generator().manual_seed(1)
    noisy = heads(z).detach()
    heads.noise_generator = torch.Generator().manual_seed(1)
    assert torch.equal(heads(z).detach(), noisy) and not torch.allclose(noisy, expected)
    heads.noise_generator = None
    assert torch.allclose(heads(z).detach(), expected)


def test_policy_initialisation_leaves_the_global_random_stream_alone() -> None:
    torch.manual_seed(3)
    ConditionalPolicyHeads(nn.Linear(3, 2), policy_seed=1)
    after = torch.rand(1)
    torch.manual_seed(3)
    nn.Linear(3, 2)
    assert torch.equal(torch.rand(1), after)


# ---- FedCP: wiring -----------------------------------------------------------------------
def test_fedcp_trains_policy_and_personal_head_and_uploads_the_mixed_global_head(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedcp", tmp_path)))
    layout = harness.algorithm.layout
    assert set(layout.private) == {"fc3.personal.weight", "fc3.personal.bias", "fc3.client_vector"}
    received = {n: t.clone() for n, t in harness.broadcast(0).items()}
    update = harness.train_client(0, received)
    assert set(update.params) == set(layout.shared)
    private = update.private
    for part in ("weight", "bias"):  # φ_g frozen locally; the upload is ½(φ_p + φ_g)
        expected = mixed_global_head(private[f"fc3.personal.{part}"], received[f"fc3.generic.{part}"])
        assert torch.equal(update.params[f"fc3.generic.{part}"], expected)
        assert not torch.equal(private[f"fc3.personal.{part}"], harness.store.initial[f"fc3.personal.{part}"])
    assert not torch.equal(update.params["fc3.policy.weight"], received["fc3.policy.weight"])
    assert not torch.equal(update.params["fc1.weight"], received["fc1.weight"])
    # v_k: from the trained φ_p, kept for evaluation and the next round
    assert torch.equal(private["fc3.client_vector"], client_vector(private["fc3.personal.weight"]))
    terms = update.loss_terms
    assert terms["mmd"] > 0
    assert update.loss == pytest.approx(terms["task"] + 5.0 * terms["mmd"], rel=1e-5)


def test_fedcp_global_model_is_the_global_route_alone(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedcp", tmp_path)))
    model = harness.algorithm.global_model()
    assert float(model["fc3.personal.weight"].abs().sum()) == 0.0
    assert float(model["fc3.personal.bias"].abs().sum()) == 0.0
    assert torch.equal(model["fc3.generic.weight"], harness.global_state["fc3.generic.weight"])


def test_fedcp_mmd_weight_scales_the_loss(tmp_path: Path) -> None:
    off = Harness(prepare(tiny_run("fedcp", tmp_path / "off"), {"mmd_weight": 0.0}))
    update = off.train_client(0, {n: t.clone() for n, t in off.broadcast(0).items()})
    assert update.loss == pytest.approx(update.loss_terms["task"], rel=1e-6) and update.loss_terms["mmd"] > 0


def test_fedcp_default_mmd_weight_keeps_the_authors_lambda_times_lr(tmp_path: Path) -> None:
    """λ·lr = 5 × 0.005 = 0.025 under SGD: λ = 0.5 at lr 0.05, 0.25 at 0.1, 5 at the authors' 0.005;
    Adam (steps independent of the loss scale) keeps λ = 5; a given --mmd-weight is used as is."""
    sgd = LocalSpec(epochs=1, batch_size=32, lr=0.05, optimizer="sgd", momentum=0.0, weight_decay=0.0, max_grad_norm=0)
    assert lr_matched_weight(5.0, 0.005, sgd) == pytest.approx(0.5)
    assert lr_matched_weight(5.0, 0.005, dataclasses.replace(sgd, lr=0.1)) == pytest.approx(0.25)
    assert lr_matched_weight(5.0, 0.005, dataclasses.replace(sgd, lr=0.005)) == pytest.approx(5.0)
    assert lr_matched_weight(5.0, 0.005, dataclasses.replace(sgd, optimizer="adam")) == 5.0
    assert resolved_mmd_weight(FedCPHyperparameters(), sgd) == pytest.approx(0.5)
    assert resolved_mmd_weight(FedCPHyperparameters(mmd_weight=5.0), sgd) == 5.0
    run = prepare(dataclasses.replace(tiny_run("fedcp", tmp_path), optimizer="sgd", lr=0.05))
    assert run.algorithm.program.loss_weights == {"mmd": pytest.approx(0.5)}
    assert run.algorithm.run_info() == {"fedcp_mmd_weight": pytest.approx(0.5)}


# ---- GPFL: formulas ----------------------------------------------------------------------
def test_conditional_inputs_hand_computed() -> None:
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    global_input, personalized = conditional_inputs(embeddings, torch.tensor([0.5, 0.5, 0.0]))
    assert torch.allclose(global_input, torch.tensor([4 / 3, 2.0]))
    assert torch.allclose(personalized, torch.tensor([0.5, 1.0]))
    assert torch.allclose(class_shares(torch.tensor([0, 0, 2]), 3), torch.tensor([2 / 3, 0.0, 1 / 3]))


def test_valve_hand_computed() -> None:
    out = valve(torch.tensor([[1.0, 2.0]]), torch.tensor([0.0, -2.0]), torch.tensor([1.0, -1.0]))
    assert torch.equal(out, torch.tensor([[2.0, 0.0]]))  # ReLU(1·1 + 1, 2·(−1) − 1)


def test_angle_level_loss_is_the_cross_entropy_of_the_cosines() -> None:
    features = torch.tensor([[1.0, 0.0]])
    embeddings = torch.tensor([[2.0, 0.0], [0.0, 3.0]])  # cosines (1, 0): the scale is ignored
    loss = angle_level_loss(features, embeddings, torch.tensor([0]))
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)))
    loss = angle_level_loss(features, embeddings, torch.tensor([1]))
    assert loss.item() == pytest.approx(math.log(1 + math.e))


def test_magnitude_level_loss_is_the_batch_norm_of_the_distance() -> None:
    features = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 3.0]])  # differences (0, 1), (0, −3)
    loss = magnitude_level_loss(features, embeddings, torch.tensor([0, 1]))
    assert loss.item() == pytest.approx(math.sqrt(10))


def test_squared_norm_hand_computed() -> None:
    assert squared_norm([torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]).item() == 7.0  # ½(1 + 4 + 9)


def test_valve_head_routes_the_personalized_feature_to_the_head() -> None:
    torch.manual_seed(0)
    valve_head = ConditionalValveHead(nn.Linear(3, 2), num_classes=2, module_seed=5)
    with torch.no_grad():
        valve_head.personalized_input.copy_(torch.tensor([1.0, -1.0, 0.5]))
        valve_head.global_input.copy_(torch.tensor([0.0, 2.0, 1.0]))
    z = torch.randn(4, 3)
    output = valve_head(z)
    p, g = valve_head.personalized_input, valve_head.global_input
    personalized = valve(z, valve_head.gamma(p), valve_head.beta(p))
    assert torch.allclose(output, valve_head.head(personalized))
    assert torch.allclose(output.gpfl_global, valve(z, valve_head.gamma(g), valve_head.beta(g)))
    assert output.gpfl_embeddings is valve_head.embedding.weight


# ---- GPFL: wiring ------------------------------------------------------------------------
def test_gpfl_keeps_head_and_conditional_inputs_and_shares_the_rest(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("gpfl", tmp_path)))
    layout = harness.algorithm.layout
    assert set(layout.private) == {"fc3.head.weight", "fc3.head.bias", "fc3.personalized_input", "fc3.global_input"}
    received = {n: t.clone() for n, t in harness.broadcast(1).items()}
    update = harness.train_client(1, received)
    assert set(update.params) == set(layout.shared)
    data = harness.data
    shares = class_shares(data.labels[data.train_indices[1]], data.num_classes)
    expected_global, expected_personal = conditional_inputs(received["fc3.embedding.weight"], shares)
    assert torch.allclose(update.private["fc3.global_input"], expected_global)
    assert torch.allclose(update.private["fc3.personalized_input"], expected_personal)
    for name in ("fc3.embedding.weight", "fc3.gamma.0.weight", "fc3.beta.0.weight", "fc1.weight"):
        assert not torch.equal(update.params[name], received[name]), name
    terms = update.loss_terms
    assert terms["regularisation"] > 0 and terms["magnitude"] > 0 and terms["angle"] > 0
    total = terms["task"] + terms["angle"] + 0.01 * terms["magnitude"] + 0.1 * terms["regularisation"]
    assert update.loss == pytest.approx(total, rel=1e-5)


def test_gpfl_new_client_trains_only_a_fresh_head_on_its_own_inputs(tmp_path: Path) -> None:
    from pflbench.engine import personalize

    run = prepare(tiny_run("gpfl", tmp_path))
    algorithm = run.algorithm
    start = algorithm.new_client_model(2)
    (served,) = personalize(run.executor, algorithm.new_client_program(), [start], [2], [3], 1)
    data = run.data
    shares = class_shares(data.labels[data.train_indices[2]], data.num_classes)
    _, personalized = conditional_inputs(start["fc3.embedding.weight"], shares)
    assert torch.allclose(served["fc3.personalized_input"], personalized)
    for name in start:
        changed = not torch.equal(served[name], start[name])
        assert changed == (name.startswith("fc3.head.") or name.endswith("_input")), name


# ---- both --------------------------------------------------------------------------------
def test_bytes_count_what_travels(tmp_path: Path) -> None:
    """One round on digits (mlp 64 → 200 → 200 → 10), 3 clients."""
    from pflbench.runs.execute import execute

    body = (64 * 200 + 200 + 200 * 200 + 200) * 4
    head = (200 * 10 + 10) * 4
    expected = {
        "fedcp": body + head + (200 * 400 + 400) * 4 + 2 * 400 * 4,  # φ_g, CPN + LayerNorm(2D)
        "gpfl": body + 2 * (200 * 200 + 200 + 2 * 200) * 4 + 10 * 200 * 4,  # γ, β (+ LayerNorm), GCE
    }
    for algo, size in expected.items():
        summary = execute(prepare(tiny_run(algo, tmp_path / algo)))
        assert summary["bytes_up_total"] == 3 * size, algo
        assert summary["bytes_down_total"] == 3 * size, algo


@pytest.mark.parametrize("algo", ["fedcp", "gpfl"])
def test_vmap_dp_and_other_head_layers_are_refused_in_one_line(algo: str, tmp_path: Path) -> None:
    for settings, message in (
        ({"executor": "vmap"}, "vmap"),
        ({"head_layers": 2}, "--head-layers 2"),
        ({"dp": "client"}, "--dp client cannot make --algo " + algo),
        ({"dp": "sample"}, "--dp sample"),
    ):
        with pytest.raises(ConfigError, match=message) as error:
            prepare(tiny_run(algo, tmp_path, **settings))
        assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("algo", "options", "message"),
    [
        ("fedcp", {"mmd_weight": -1.0}, "--mmd-weight"),
        ("fedcp", {"policy_temperature": 0.0}, "--policy-temperature"),
        ("gpfl", {"magnitude_weight": -0.1}, "--magnitude-weight"),
        ("gpfl", {"module_decay": -1.0}, "--module-decay"),
    ],
)
def test_bad_hyperparameters_are_one_clear_error(algo: str, options: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        prepare(tiny_run(algo, tmp_path), options)


def test_defaults_are_the_authors_and_both_are_representation_methods() -> None:
    for algorithm in (FedCP, GPFL):
        assert algorithm.method_family == "representation" and algorithm.display_name and algorithm.paper
    assert {f.name: f.default for f in dataclasses.fields(FedCPHyperparameters)} == {
        "mmd_weight": None,  # the authors' λ·lr = 5 × 0.005 at the run's lr (test_fedcp_default_mmd_weight...)
        "policy_temperature": 1.0,
    }
    assert {f.name: f.default for f in dataclasses.fields(GPFLHyperparameters)} == {
        "magnitude_weight": 0.01,
        "module_decay": 0.1,
    }
