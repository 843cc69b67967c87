"""FedProto, FedPAC, FedDBE — each defining formula against hand-computed values on small
tensors, plus the wiring: what travels, what stays private, what the server combines."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from pflbench.algorithms.feddbe import (
    BIAS,
    CLIENT_MEAN,
    GLOBAL_MEAN,
    BiasedLinear,
    FedDBE,
    FedDBEHyperparameters,
    global_mean,
    mean_regularisation,
    running_mean_update,
)
from pflbench.algorithms.fedpac import (
    CENTROIDS,
    COMBINED,
    HEAD,
    VARIANCE,
    FedPAC,
    FedPACHyperparameters,
    combination_matrix,
    combination_weights,
    feature_statistics,
    project_to_simplex,
    simplex_qp,
)
from pflbench.algorithms.fedproto import (
    UPLOADED_COUNTS,
    UPLOADED_PROTOTYPES,
    FedProto,
    FedProtoHyperparameters,
    PrototypeLinear,
    aggregate_prototypes,
    class_sums,
    install_prototype_head,
    nearest_prototype_scores,
    own_class_mask,
    prototype_loss,
)
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset
from pflbench.engine import ClientJob, SequentialExecutor
from pflbench.engine.types import tensor_bytes
from pflbench.errors import ConfigError
from pflbench.models.zoo import MLP
from pflbench.runs.prepare import prepare
from pflbench.testing import RESOLVED, tiny_data, tiny_model, tiny_run


def body(model: MLP, inputs: torch.Tensor) -> torch.Tensor:
    return model.run_stages(inputs, 0, 2)  # fc1, fc2 with ReLU: the classifier's input


# ---- FedProto: formulas --------------------------------------------------------------------
def test_prototype_loss_hand_computed() -> None:
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    prototypes = torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    mass = torch.tensor([2.0, 1.0, 0.0])  # class 2 has no global prototype
    # (1² + 2²) + (2² + 3²) + 0 = 18 over 3 samples × 2 dimensions
    assert prototype_loss(z, torch.tensor([0, 1, 2]), prototypes, mass).item() == pytest.approx(3.0)
    assert prototype_loss(z, torch.tensor([2, 2, 2]), prototypes, mass).item() == 0.0


def test_class_sums_and_count_weighted_global_prototypes_hand_computed() -> None:
    sums, counts = class_sums(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.tensor([0, 0, 2]), 3)
    assert torch.equal(sums, torch.tensor([[4.0, 6.0], [0.0, 0.0], [5.0, 6.0]]))
    assert torch.equal(counts, torch.tensor([2.0, 0.0, 1.0]))
    client_a = (torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]), torch.tensor([1.0, 3.0, 0.0]))
    client_b = (torch.tensor([[3.0, 3.0], [0.0, 0.0], [0.0, 0.0]]), torch.tensor([3.0, 0.0, 0.0]))
    prototypes, mass = aggregate_prototypes([client_a[0], client_b[0]], [client_a[1], client_b[1]])
    # class 0: (1·[1, 1] + 3·[3, 3]) / 4; class 1: only client a; class 2: nobody
    assert torch.allclose(prototypes, torch.tensor([[2.5, 2.5], [2.0, 0.0], [0.0, 0.0]]))
    assert torch.equal(mass, torch.tensor([4.0, 3.0, 0.0]))


def test_nearest_prototype_ignores_classes_without_a_prototype() -> None:
    scores = nearest_prototype_scores(
        torch.tensor([[0.0, 0.0]]),
        torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 0.5]]),
        torch.tensor([True, True, False]),
    )
    assert scores[0, :2].tolist() == [-1.0, -9.0] and scores[0, 2] == float("-inf")
    assert int(scores.argmax()) == 0  # class 2 is nearer but has no prototype


def test_prototype_head_keeps_the_weights_and_draws_no_random_numbers() -> None:
    model = tiny_model()
    weights = {n: t.clone() for n, t in model.named_parameters()}
    inputs = torch.randn(6, 4)
    before = model(inputs)
    state = torch.random.get_rng_state()
    assert install_prototype_head(model, "fedproto") == "fc3"
    assert torch.equal(torch.random.get_rng_state(), state)
    head = model.fc3
    assert isinstance(head, PrototypeLinear)
    assert {n: t for n, t in model.named_parameters()}.keys() == weights.keys()
    assert all(torch.equal(t, weights[n]) for n, t in model.named_parameters())
    head.nearest = True
    assert torch.equal(model(inputs), before)  # train mode: the classifier
    model.eval()
    assert torch.equal(model(inputs), before)  # no prototype yet: the classifier
    head.prototypes.copy_(torch.randn(3, 5))
    head.prototype_mass.copy_(torch.tensor([1.0, 0.0, 2.0]))
    z = body(model, inputs)
    expected = nearest_prototype_scores(z, head.prototypes, torch.tensor([True, False, True]))
    assert torch.equal(model(inputs), expected)


# ---- FedProto: wiring ----------------------------------------------------------------------
def fedproto(hparams: FedProtoHyperparameters = FedProtoHyperparameters(), samples: int = 12):
    data, model = tiny_data(samples), tiny_model()
    config = RunConfig(algo="fedproto", num_clients=1, batch_size=4, **RESOLVED)
    FedProto.configure_model(model, config, hparams)
    return data, model, FedProto(config, hparams, model, data.num_train)


def test_fedproto_uploads_only_the_trained_models_class_means() -> None:
    data, model, algorithm = fedproto()
    assert algorithm.layout.shared == ("fc3.prototypes", "fc3.prototype_mass")
    # the whole model, and (own-classes inference, the default) the client's own-class record
    assert set(algorithm.layout.private) == {n for n, _ in model.named_parameters()} | {"fc3.own_classes"}
    executor = SequentialExecutor(model, data)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    assert tensor_bytes(received) == (3 * 5 + 3) * 4  # C·D + C floats
    (update,) = executor.train(algorithm.program, [ClientJob(0, 1, 1, received, algorithm.store.get(0))])
    assert set(update.params) == {UPLOADED_PROTOTYPES, UPLOADED_COUNTS}
    assert update.loss_terms["prototype"] == 0.0  # round 1: no global prototype yet
    # Eq. 4 with the trained model (eval mode)
    trained = MLP((4,), 3, hidden=5)
    trained.load_state_dict({n: t for n, t in update.private.items() if n != "fc3.own_classes"})
    assert update.private["fc3.own_classes"].tolist() == [1.0, 1.0, 1.0]  # tiny_data: every class
    inputs, labels = data.gather(torch.arange(12))
    with torch.no_grad():
        z = body(trained, inputs)
    for label in range(3):
        assert torch.allclose(update.params[UPLOADED_PROTOTYPES][label], z[labels == label].mean(0), atol=1e-6)
    assert update.params[UPLOADED_COUNTS].tolist() == [4.0, 4.0, 4.0]
    # the server's prototypes become what every client receives; the second round pulls towards them
    algorithm.aggregate([update])
    assert torch.equal(algorithm.global_state["fc3.prototypes"], update.params[UPLOADED_PROTOTYPES])
    algorithm.store.put(0, update.private)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    (second,) = executor.train(algorithm.program, [ClientJob(0, 2, 2, received, algorithm.store.get(0))])
    assert second.loss_terms["prototype"] > 0
    assert second.loss == pytest.approx(second.loss_terms["task"] + second.loss_terms["prototype"], rel=1e-5)


def test_fedproto_weights_the_prototype_term_by_lambda() -> None:
    _, _, algorithm = fedproto(FedProtoHyperparameters(proto_weight=0.25))
    assert algorithm.program.loss_weights == {"prototype": 0.25}


def test_fedproto_personal_model_predicts_by_the_current_global_prototypes() -> None:
    data, model, algorithm = fedproto()
    algorithm.global_state["fc3.prototypes"].copy_(torch.eye(3, 5))
    algorithm.global_state["fc3.prototype_mass"].copy_(torch.tensor([1.0, 1.0, 1.0]))
    personal = algorithm.personal_model(0)
    assert torch.equal(personal["fc3.prototypes"], torch.eye(3, 5))
    assert not FedProto.has_global_model


def test_own_class_mask_limits_nearest_prototype_to_the_clients_classes() -> None:
    """z = 0; prototypes at distances² 1, 9, 0.25 (classes 0, 1, 2), all present. Over every class
    the nearest is class 2; a client holding
    classes {0, 1} predicts class 0 (−1 > −9); an
    empty record (never trained) leaves every class."""
    z = torch.tensor([[0.0, 0.0]])
    prototypes = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 0.5]])
    present = torch.tensor([True, True, True])
    assert int(nearest_prototype_scores(z, prototypes, present).argmax()) == 2
    own = own_class_mask(present, torch.tensor([1.0, 1.0, 0.0]))
    assert own.tolist() == [True, True, False]
    scores = nearest_prototype_scores(z, prototypes, own)
    assert scores[0, :2].tolist() == [-1.0, -9.0] and scores[0, 2] == float("-inf") and int(scores.argmax()) == 0
    assert own_class_mask(present, torch.zeros(3)).tolist() == [True, True, True]
    assert own_class_mask(torch.tensor([True, False, True]), None).tolist() == [True, False, True]


def test_fedproto_default_inference_is_the_authors_own_classes_rule() -> None:
    """The default head predicts, in eval mode, the nearest prototype among the classes recorded in
    its ``own_classes`` buffer (a client's state, private), and that record is what local training
    writes: a client holding only classes 0 and 2 never predicts class 1."""
    assert FedProtoHyperparameters().proto_inference == "own-classes"
    model = tiny_model()
    FedProto.configure_model(model, RunConfig(algo="fedproto", **RESOLVED), FedProtoHyperparameters())
    head = model.fc3
    assert head.nearest is True and torch.equal(head.own_classes, torch.zeros(3))
    inputs = torch.randn(8, 4)
    model.eval()
    with torch.no_grad():
        z = body(model, inputs)
        head.prototypes.copy_(z[:3])  # class j's prototype: sample j's representation
        head.prototype_mass.fill_(1.0)
        head.own_classes.copy_(torch.tensor([1.0, 0.0, 1.0]))
        predictions = model(inputs).argmax(1)
    assert 1 not in predictions.tolist() and predictions[0] == 0 and predictions[2] == 2
    data, _, algorithm = fedproto(samples=12)
    program = algorithm.program
    labels_of_client = data.labels[data.train_indices[0]]
    assert torch.equal(torch.bincount(labels_of_client, minlength=3), torch.tensor([4, 4, 4]))
    for inference, nearest, buffer in (("prototype", True, False), ("head", False, False)):
        other = tiny_model()
        FedProto.configure_model(
            other, RunConfig(algo="fedproto", **RESOLVED), FedProtoHyperparameters(proto_inference=inference)
        )
        assert other.fc3.nearest is nearest and hasattr(other.fc3, "own_classes") is buffer
    assert program.head_module == "fc3"


def test_fedproto_head_inference_is_an_option() -> None:
    model = tiny_model()
    FedProto.configure_model(
        model, RunConfig(algo="fedproto", **RESOLVED), FedProtoHyperparameters(proto_inference="head")
    )
    assert model.fc3.nearest is False


# ---- FedPAC: formulas ----------------------------------------------------------------------
def test_fedpac_feature_statistics_hand_computed() -> None:
    # class 0: z = [1, 0], [3, 0]; class 1: z = [0, 2]; n = 3
    z = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    labels = torch.tensor([0, 0, 1])
    sums, counts = class_sums(z, labels, 3)
    squares, _ = class_sums(z.pow(2).sum(1, keepdim=True), labels, 3)
    variance, centroids = feature_statistics(sums, squares.squeeze(1), counts)
    # p = (2/3, 1/3, 0), μ_0 = [2, 0], μ_1 = [0, 2], E‖z‖²|0 = 5, E‖z‖²|1 = 4
    # V = ((2/3)·5 − (4/9)·4 + (1/3)·4 − (1/9)·4) / 3 = (30 − 16 + 12 − 4)/9/3 = 22/27
    assert variance.item() == pytest.approx(22 / 27)
    assert torch.allclose(centroids, torch.tensor([[4 / 3, 0.0], [0.0, 2 / 3], [0.0, 0.0]]))


def test_fedpac_combination_matrix_and_weights_hand_computed() -> None:
    variances = torch.tensor([1.0, 1.0])
    centroids = torch.tensor([[[0.0]], [[1.0]]])  # M = 2 clients, C = 1, D = 1
    # client 0: h_0 − h_0 = 0, h_0 − h_1 = −1  →  P = diag(1, 1) + [[0, 0], [0, 1]]
    assert torch.equal(combination_matrix(variances, centroids, 0), torch.tensor([[1.0, 0.0], [0.0, 2.0]]).double())
    # min α₀² + 2α₁² on the simplex: α ∝ (1/1, 1/2) = (2/3, 1/3)
    assert torch.allclose(combination_weights(variances, centroids, 0), torch.tensor([2 / 3, 1 / 3]).double())
    # a client far from everyone else with little variance keeps its own head
    far = torch.tensor([[[0.0]], [[100.0]]])
    assert combination_weights(torch.tensor([0.01, 0.01]), far, 0).tolist() == [1.0, 0.0]


def test_simplex_qp_hand_computed_and_kkt() -> None:
    assert torch.allclose(simplex_qp(torch.tensor([[1.0, 0.0], [0.0, 3.0]])), torch.tensor([0.75, 0.25]).double())
    # [[a, c], [c, b]]: α₀ = (b − c)/(a + b − 2c) = 3/4; clipped to the simplex: (1, 0)
    assert torch.allclose(simplex_qp(torch.tensor([[2.0, 1.0], [1.0, 4.0]])), torch.tensor([0.75, 0.25]).double())
    assert torch.allclose(simplex_qp(torch.tensor([[1.0, 2.0], [2.0, 5.0]])), torch.tensor([1.0, 0.0]).double())
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(12, 30, generator=generator, dtype=torch.float64)
    p = a @ a.t() + torch.diag(torch.rand(12, generator=generator, dtype=torch.float64))
    alpha = simplex_qp(p)
    assert alpha.min() >= 0 and alpha.sum().item() == pytest.approx(1.0)
    gradient = 2 * p @ alpha  # KKT: equal on the support, not smaller off it
    support = alpha > 1e-9
    assert float(gradient[support].max() - gradient[support].min()) < 1e-6
    if (~support).any():
        assert float(gradient[~support].min()) >= float(gradient[support].max()) - 1e-6
    assert project_to_simplex(np.array([0.5, 0.5, 3.0])).tolist() == [0.0, 0.0, 1.0]


# ---- FedPAC: wiring ------------------------------------------------------------------------
def test_fedpac_trains_classifier_then_body_and_combines_heads_per_client() -> None:
    data, model = tiny_data(), tiny_model()
    config = RunConfig(algo="fedpac", num_clients=2, batch_size=4, **RESOLVED)
    hparams = FedPACHyperparameters()
    FedPAC.configure_model(model, config, hparams)
    algorithm = FedPAC(config, hparams, model, [12, 12])
    assert set(algorithm.layout.private) == {"fc3.weight", "fc3.bias"}
    assert {"fc1.weight", "fc3.prototypes"} <= set(algorithm.layout.shared)
    phases = algorithm.program.local_phases(0)
    assert [p.epochs for p in phases] == [1, config.local_epochs]
    assert phases[0].trainable == {"fc3.weight", "fc3.bias"} and "fc1.weight" in phases[1].trainable
    dataset = TensorDataset(*data.gather(torch.arange(12)), 3, "test")
    twins = FederatedData(dataset, [np.arange(12)] * 2, [np.arange(12)] * 2, torch.device("cpu"))
    executor = SequentialExecutor(model, twins)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    updates = executor.train(
        algorithm.program, [ClientJob(k, 1, 1 + k, received, algorithm.store.get(k)) for k in (0, 1)]
    )
    for update in updates:
        assert {HEAD + "fc3.weight", VARIANCE, CENTROIDS, UPLOADED_PROTOTYPES, "fc1.weight"} <= set(update.params)
        assert "fc3.weight" not in update.params  # the classifier travels only under its own name
        algorithm.store.put(update.client_id, update.private)
    # statistics come from the received (initial) model, identical data: equal statistics (up to
    # the summation order of the two clients' batch orders)
    assert torch.allclose(updates[0].params[CENTROIDS], updates[1].params[CENTROIDS], atol=1e-7)
    algorithm.aggregate(updates)
    heads = [u.params[HEAD + "fc3.weight"] for u in updates]
    combined = algorithm.broadcast(0)[COMBINED + "fc3.weight"]
    assert torch.allclose(combined, (heads[0] + heads[1]) / 2, atol=1e-6)  # equal statistics: equal weights
    assert torch.equal(algorithm.personal_model(0)["fc3.weight"], combined)
    assert torch.equal(algorithm.personal_model(0)["fc1.weight"], algorithm.global_state["fc1.weight"])


def test_fedpac_uses_the_combined_head_as_the_clients_starting_classifier() -> None:
    model = tiny_model()
    config = RunConfig(algo="fedpac", num_clients=1, **RESOLVED)
    FedPAC.configure_model(model, config, FedPACHyperparameters())
    algorithm = FedPAC(config, FedPACHyperparameters(), model, [12])
    algorithm.combined_heads = {"0/fc3.weight": torch.ones(3, 5), "0/fc3.bias": torch.zeros(3)}
    state = algorithm.program.assemble(algorithm.broadcast(0), algorithm.store.get(0))
    assert state["fc3.weight"].eq(1).all()
    assert COMBINED + "fc3.weight" not in algorithm.broadcast(1)  # nothing combined for client 1


# ---- FedDBE --------------------------------------------------------------------------------
def test_feddbe_running_mean_and_mean_regularisation_hand_computed() -> None:
    z = torch.tensor([[1.0, 2.0], [3.0, 6.0]])  # batch mean [2, 4]
    running = running_mean_update(torch.tensor([10.0, 0.0]), z, momentum=0.1)
    assert torch.allclose(running, torch.tensor([9.2, 0.4]))  # 0.9·[10, 0] + 0.1·[2, 4]
    assert torch.equal(running_mean_update(torch.tensor([10.0, 0.0]), z, momentum=1.0), torch.tensor([2.0, 4.0]))
    # ½·mean((2 − 1)², (4 − 0)²) = ½·(1 + 16)/2
    assert mean_regularisation(torch.tensor([2.0, 4.0]), torch.tensor([1.0, 0.0])).item() == pytest.approx(4.25)
    mean = global_mean([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 4.0])], [0.25, 0.75])
    assert torch.equal(mean, torch.tensor([0.25, 3.0]))


def test_feddbe_prbm_is_added_to_the_classifiers_input() -> None:
    layer = BiasedLinear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        layer.bias.zero_()
        layer.representation_bias.copy_(torch.tensor([1.0, -1.0]))
    assert torch.equal(layer(torch.tensor([[2.0, 3.0]])), torch.tensor([[3.0, 5.0]]))  # W·([2, 3] + [1, −1])


def test_feddbe_first_round_initialises_the_global_mean_then_trains_the_prbm() -> None:
    data, model = tiny_data(), tiny_model()
    config = RunConfig(algo="feddbe", num_clients=1, batch_size=4, **RESOLVED)
    hparams = FedDBEHyperparameters()
    state = torch.random.get_rng_state()
    FedDBE.configure_model(model, config, hparams)
    assert torch.equal(torch.random.get_rng_state(), state)  # other runs' random streams untouched
    algorithm = FedDBE(config, hparams, model, data.num_train)
    bias = f"fc3.{BIAS}"
    assert algorithm.layout.private == (bias,) and bias not in algorithm.layout.shared
    executor = SequentialExecutor(model, data)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    assert GLOBAL_MEAN not in received
    (first,) = executor.train(algorithm.program, [ClientJob(0, 1, 1, received, algorithm.store.get(0))])
    assert not first.private[bias].any()  # the initialization period: PRBM frozen at 0
    assert first.loss_terms["mean_regularisation"] == 0.0
    trained = MLP((4,), 3, hidden=5)
    trained.load_state_dict({n: t for n, t in first.params.items() if n != CLIENT_MEAN}, strict=False)
    with torch.no_grad():
        expected = body(trained, data.gather(torch.arange(12))[0]).mean(0)
    assert torch.allclose(first.params[CLIENT_MEAN], expected, atol=1e-6)
    algorithm.store.put(0, first.private)
    algorithm.aggregate([first])
    assert torch.equal(algorithm.global_mean, first.params[CLIENT_MEAN])
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    assert torch.equal(received[GLOBAL_MEAN], algorithm.global_mean)
    (second,) = executor.train(algorithm.program, [ClientJob(0, 2, 2, received, algorithm.store.get(0))])
    assert second.private[bias].abs().sum() > 0 and CLIENT_MEAN not in second.params and bias not in second.params
    assert second.loss_terms["mean_regularisation"] > 0
    fixed = algorithm.global_mean.clone()
    algorithm.aggregate([second])
    assert torch.equal(algorithm.global_mean, fixed)  # obtained once
    assert not algorithm.global_model()[bias].any()  # the global model: PRBM 0
    algorithm.store.put(0, second.private)
    assert torch.equal(algorithm.personal_model(0)[bias], second.private[bias])


# ---- refusals ------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["fedproto", "fedpac", "feddbe"])
def test_vmap_and_other_head_layers_are_refused_in_one_line(algo: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vmap") as error:
        prepare(tiny_run(algo, tmp_path, executor="vmap"))
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="--head-layers 2") as error:
        prepare(tiny_run(algo, tmp_path, head_layers=2))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("algo", "options", "message"),
    [
        ("fedproto", {"proto_weight": -1.0}, "--proto-weight"),
        ("fedpac", {"head_epochs": -1}, "--head-epochs"),
        ("feddbe", {"mean_momentum": 0.0}, "--mean-momentum"),
        ("feddbe", {"mr_weight": -1.0}, "--mr-weight"),
    ],
)
def test_bad_hyperparameters_are_one_clear_error(algo: str, options: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        prepare(tiny_run(algo, tmp_path), options)


def test_updates_of_the_three_count_what_travels(tmp_path: Path) -> None:
    """One round of each on digits (mlp 64 → 200 → 200 → 10): bytes as the docstrings say."""
    from pflbench.runs.execute import execute

    sizes = {"fedproto": (10 * 200 + 10) * 4}
    for algo in ("fedproto", "fedpac", "feddbe"):
        run = prepare(tiny_run(algo, tmp_path / algo))
        summary = execute(run)
        body_bytes = sum(t.numel() * 4 for n, t in run.algorithm.model.named_parameters() if not n.startswith("fc3."))
        head_bytes = (200 * 10 + 10) * 4
        prototypes = (10 * 200 + 10) * 4
        clients = 3
        if algo == "fedproto":
            expected_up, expected_down = sizes[algo], prototypes
        elif algo == "fedpac":  # body + head + prototypes, counts + centroids + V
            expected_up, expected_down = (
                body_bytes + head_bytes + prototypes + 10 * 200 * 4 + 4,
                body_bytes + prototypes,
            )
        else:  # model + the round-1 mean; PRBM private
            expected_up, expected_down = body_bytes + head_bytes + 200 * 4, body_bytes + head_bytes
        assert summary["bytes_up_total"] == clients * expected_up, algo
        assert summary["bytes_down_total"] == clients * expected_down, algo


def test_representation_methods_are_listed_as_such() -> None:
    for algorithm in (FedProto, FedPAC, FedDBE):
        assert algorithm.method_family == "representation" and algorithm.display_name and algorithm.paper
    assert dataclasses.fields(FedProtoHyperparameters)[0].default == 1.0
