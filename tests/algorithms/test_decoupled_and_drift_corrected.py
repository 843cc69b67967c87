"""FedBN, FedRoD, FedALA, SCAFFOLD, MOON, FedDyn — each distinctive formula
against hand-computed values on small tensors, plus the wiring of the stateful clients."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from pflbench.algorithms.fedala import (
    FedALA,
    FedALAHyperparameters,
    ala_combine,
    ala_weight_step,
    converged,
    sample_batches,
)
from pflbench.algorithms.fedbn import FedBN, batchnorm_state_names
from pflbench.algorithms.feddyn import FedDyn, FedDynHyperparameters, dynamic_term, linear_state_update, linear_term
from pflbench.algorithms.feddyn import server_update as feddyn_server_update
from pflbench.algorithms.fedrod import FedRoD, TwoHeads, balanced_softmax_loss
from pflbench.algorithms.moon import Moon, MoonHyperparameters, contrastive_loss
from pflbench.algorithms.scaffold import (
    CLIENT_CONTROL,
    CONTROL_DELTA,
    Scaffold,
    ScaffoldHyperparameters,
    client_control_update,
    corrected_gradient,
)
from pflbench.algorithms.scaffold import server_update as scaffold_server_update
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientJob, NoHyperparameters, SequentialExecutor
from pflbench.errors import ConfigError
from pflbench.models.zoo import BatchNormCNN
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.testing import RESOLVED, tiny_data, tiny_model


# ---- FedBN ---------------------------------------------------------------------------------
def test_fedbn_keeps_every_batchnorm_tensor_local_incl_running_stats() -> None:
    model = BatchNormCNN((1, 8, 8), 10)
    config = RunConfig(algo="fedbn", num_clients=2, **{**RESOLVED, "model": "cnn_bn"})
    algorithm = FedBN(config, NoHyperparameters(), model, [5, 5])
    expected = {f"{bn}.{t}" for bn in ("bn1", "bn2", "bn3") for t in ("weight", "bias", "running_mean", "running_var")}
    assert set(algorithm.layout.private) == expected
    assert not expected & set(algorithm.layout.shared)
    assert {"conv1.weight", "fc2.bias"} <= set(algorithm.layout.shared)
    assert "bn1.num_batches_tracked" in batchnorm_state_names(model)  # listed, never moved (int)
    assert not algorithm.has_global_model


def test_fedbn_refuses_a_model_without_batchnorm() -> None:
    config = RunConfig(algo="fedbn", **RESOLVED)
    with pytest.raises(ConfigError, match="BatchNorm"):
        FedBN.configure_model(tiny_model(), config, NoHyperparameters())


# ---- FedRoD --------------------------------------------------------------------------------
def test_balanced_softmax_loss_hand_computed() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    counts = torch.tensor([2, 1, 0])
    # sample 1 (y=0): −log(2e¹ / (2e¹ + 1e²)) = log((2 + e)/2); sample 2 (y=1): −log(1 / (2 + 1))
    expected = (math.log((2 + math.e) / 2) + math.log(3)) / 2
    loss = balanced_softmax_loss(logits, torch.tensor([0, 1]), counts)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_fedrod_heads_personal_loss_trains_only_the_personal_head() -> None:
    model = tiny_model()
    config = RunConfig(algo="fedrod", num_clients=2, **RESOLVED)
    FedRoD.configure_model(model, config, NoHyperparameters())
    assert isinstance(model.fc3, TwoHeads)
    algorithm = FedRoD(config, NoHyperparameters(), model, [6, 6])
    assert set(algorithm.layout.private) == {"fc3.personal.weight", "fc3.personal.bias"}
    assert "fc3.generic.weight" in algorithm.layout.shared
    inputs = torch.randn(6, 4)
    output = model(inputs)
    generic, personal = output.fedrod_heads
    assert torch.equal(output, generic) and not personal.any()  # zero-initialised P-head
    program = algorithm.program
    program.label_counts = torch.tensor([3, 2, 1])
    terms = program.loss_terms(
        lambda p, x: model(x), dict(model.named_parameters()), inputs, torch.tensor([0, 1, 2, 0, 1, 0]), {}
    )
    terms["personal_ce"].backward()
    assert model.fc3.personal.weight.grad is not None and model.fc3.personal.weight.grad.abs().sum() > 0
    assert model.fc1.weight.grad is None and model.fc3.generic.weight.grad is None
    # the global model is body + generic head (P-head zero), whatever a client's P-head is
    algorithm.store.put(0, {"fc3.personal.weight": torch.ones(3, 5), "fc3.personal.bias": torch.ones(3)})
    assert not algorithm.global_model()["fc3.personal.weight"].any()
    assert algorithm.personal_model(0)["fc3.personal.weight"].eq(1).all()


# ---- FedALA --------------------------------------------------------------------------------
def test_fedala_weight_step_and_clipping_hand_computed() -> None:
    weight = torch.tensor([0.5, 0.9, 0.1, 0.4])
    gradient = torch.tensor([1.0, -2.0, 3.0, 0.0])
    local = torch.tensor([0.0, 1.0, 1.0, 2.0])
    received = torch.tensor([0.2, 1.1, 1.5, 5.0])  # θ_g − θ_l = [0.2, 0.1, 0.5, 3.0]
    # W − 1.0·g⊙(θ_g − θ_l) = [0.3, 1.1, −1.4, 0.4] → clipped to [0.3, 1, 0, 0.4]
    new = ala_weight_step(weight, gradient, local, received, eta=1.0)
    assert torch.allclose(new, torch.tensor([0.3, 1.0, 0.0, 0.4]))
    # θ̂ = θ_l + (θ_g − θ_l)⊙W
    assert torch.allclose(ala_combine(local, received, new), torch.tensor([0.06, 1.1, 1.0, 3.2]))
    # the step is the chain rule through ala_combine
    w = weight.clone().requires_grad_()
    (ala_combine(local, received, w) * gradient).sum().backward()
    assert torch.allclose(w.grad, gradient * (received - local))


def test_fedala_convergence_test() -> None:
    assert not converged([1.0, 1.0], window=3, threshold=0.1)
    assert converged([5.0, 1.0, 1.05, 0.95], window=3, threshold=0.1)
    assert not converged([1.0, 1.3, 0.7], window=3, threshold=0.1)  # std ≈ 0.245


def test_fedala_sample_batches_never_hold_one_sample() -> None:
    sizes = [len(b) for b in sample_batches(torch.arange(9), 4)]
    assert sizes == [4, 5] and [len(b) for b in sample_batches(torch.arange(1), 4)] == [2]


def test_fedala_client_learns_weights_on_its_second_round_and_evaluates_the_aggregate() -> None:
    data, model = tiny_data(), tiny_model()
    config = RunConfig(algo="fedala", num_clients=1, batch_size=4, **RESOLVED)
    algorithm = FedALA(config, FedALAHyperparameters(), model, data.num_train)
    assert algorithm.layout.groups["ala"] == ("fc3.weight", "fc3.bias")  # --layer-idx 1
    executor = SequentialExecutor(model, data)
    first_global = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    (first,) = executor.train(algorithm.program, [ClientJob(0, 1, 1, first_global, algorithm.store.get(0))])
    assert not any(k.startswith("fedala.weight.") for k in first.private)  # no local model yet
    algorithm.store.put(0, first.private)
    algorithm.aggregate([first])
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    with torch.no_grad():  # make θ_g differ from θ_l so that W matters
        received["fc3.weight"] += 0.5
    (second,) = executor.train(algorithm.program, [ClientJob(0, 2, 2, received, algorithm.store.get(0))])
    weight = second.private["fedala.weight.fc3.weight"]
    assert weight.min() >= 0 and weight.max() <= 1 and (weight < 1).any()
    algorithm.store.put(0, second.private)
    personal = algorithm.personal_model(0)
    local = second.private["fedala.local.fc3.weight"]
    assert torch.allclose(personal["fc3.weight"], ala_combine(local, algorithm.global_state["fc3.weight"], weight))
    assert torch.equal(personal["fc1.weight"], algorithm.global_state["fc1.weight"])  # lower layers: θ_g


# ---- SCAFFOLD ------------------------------------------------------------------------------
def test_scaffold_formulas_hand_computed() -> None:
    g, c_i, c = torch.tensor([1.0, -1.0]), torch.tensor([0.5, 0.0]), torch.tensor([0.25, 2.0])
    assert torch.allclose(corrected_gradient(g, c_i, c), torch.tensor([0.75, 1.0]))
    # c_i⁺ = c_i − c + (x − y)/(Kη) = [0.5, 0] − [0.25, 2] + [0.5, −1]/(5·0.1)
    new = client_control_update(c_i, c, torch.tensor([2.0, 0.0]), torch.tensor([1.5, 1.0]), 5, 0.1)
    assert torch.allclose(new, torch.tensor([1.25, -4.0]))
    assert torch.equal(client_control_update(c_i, c, torch.ones(2), torch.zeros(2), 0, 0.1), c_i)
    # x + η_g·mean Δy, c + (|S|/N)·mean Δc with |S| = 2 of N = 4
    model, control = scaffold_server_update(
        {"w": torch.tensor([1.0])},
        {"w": torch.tensor([0.5])},
        [{"w": torch.tensor([0.2])}, {"w": torch.tensor([0.6])}],
        [{"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])}],
        server_lr=0.5,
        num_clients=4,
    )
    assert model["w"].item() == pytest.approx(1.0 + 0.5 * 0.4)
    assert control["w"].item() == pytest.approx(0.5 + 0.5 * 2.0)


def test_scaffold_local_step_uses_the_corrected_gradient() -> None:
    """One full-batch SGD step: y = x − η(∇f(x) − c_i + c); with K = 1, c_i⁺ = ∇f(x)."""
    data, model = tiny_data(), tiny_model()
    config = RunConfig(algo="scaffold", num_clients=1, batch_size=12, **RESOLVED)
    algorithm = Scaffold(config, ScaffoldHyperparameters(), model, data.num_train)
    names = algorithm.layout.groups["controlled"]
    torch.manual_seed(1)
    for n in names:
        algorithm.control[n].normal_()
    private = {CLIENT_CONTROL + n: torch.randn_like(algorithm.global_state[n]) for n in names}
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    x = {n: received[n] for n in names}
    inputs, targets = data.gather(data.train_indices[0])
    params = {n: x[n].clone().requires_grad_() for n in names}
    loss = F.cross_entropy(torch.func.functional_call(model, params, (inputs,)), targets)
    gradient = dict(zip(names, torch.autograd.grad(loss, list(params.values()))))
    (update,) = SequentialExecutor(model, data).train(algorithm.program, [ClientJob(0, 1, 7, received, private)])
    for n in names:
        c, c_i = algorithm.control[n], private[CLIENT_CONTROL + n]
        y = x[n] - 0.1 * corrected_gradient(gradient[n], c_i, c)
        assert torch.allclose(update.params[n], y - x[n], atol=1e-6)  # Δy
        assert torch.allclose(update.private[CLIENT_CONTROL + n], gradient[n], atol=1e-5)
        assert torch.allclose(update.params[CONTROL_DELTA + n], gradient[n] - c_i, atol=1e-5)


def test_scaffold_refuses_adam_and_momentum() -> None:
    for settings in ({"optimizer": "adam"}, {"momentum": 0.9}):
        config = RunConfig(algo="scaffold", **{**RESOLVED, **settings})
        with pytest.raises(ConfigError, match="plain SGD"):
            Scaffold.check_config(config, ScaffoldHyperparameters())


# ---- MOON ----------------------------------------------------------------------------------
def test_moon_contrastive_loss_hand_computed() -> None:
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_global = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # cos: 1, 1/√2
    z_previous = torch.tensor([[0.0, 3.0], [1.0, 1.0]])  # cos: 0, 1
    tau = 0.5
    first = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0)))
    second = -math.log(math.exp(2**-0.5 / tau) / (math.exp(2**-0.5 / tau) + math.exp(1 / tau)))
    loss = contrastive_loss(z, z_global, z_previous, tau)
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)
    # identical global and previous representations: log 2, whatever z is
    assert contrastive_loss(z, z_global, z_global, tau).item() == pytest.approx(math.log(2))


def test_moon_client_contrasts_with_its_previous_model_from_its_second_round() -> None:
    data, model = tiny_data(), tiny_model()
    config = RunConfig(algo="moon", num_clients=1, batch_size=4, **RESOLVED)
    algorithm = Moon(config, MoonHyperparameters(), model, data.num_train)
    assert algorithm.program.head_module == "fc3"  # z = the classifier's input (fc2's output)
    executor = SequentialExecutor(model, data)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    (first,) = executor.train(algorithm.program, [ClientJob(0, 1, 1, received, algorithm.store.get(0))])
    # no previous model yet: z_prev = z_glob, so every batch's ℓ_con is exactly log 2
    assert first.loss_terms["contrastive"] == pytest.approx(math.log(2), abs=1e-6)
    assert first.loss == pytest.approx(first.loss_terms["task"] + math.log(2), abs=1e-5)  # μ = 1
    for n in algorithm.layout.shared:
        assert torch.equal(first.private["moon.prev." + n], first.params[n])  # the trained model
    algorithm.store.put(0, first.private)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}  # ≠ the previous model
    (second,) = executor.train(algorithm.program, [ClientJob(0, 2, 2, received, algorithm.store.get(0))])
    assert abs(second.loss_terms["contrastive"] - math.log(2)) > 1e-4


# ---- FedDyn --------------------------------------------------------------------------------
def test_feddyn_client_and_server_updates_hand_computed() -> None:
    # ∇L_k ← ∇L_k − α(θ_k − θ^{t−1})
    new = linear_state_update(torch.tensor([0.5, -1.0]), torch.tensor([3.0, 1.0]), torch.tensor([1.0, 2.0]), alpha=0.1)
    assert torch.allclose(new, torch.tensor([0.3, -0.9]))
    # h = 0 − α·(1/m)·Σ(θ_k − θ^{t−1}) = −0.1·(1/4)·(1 + 3) = −0.1; θ = mean − h/α = 3 + 1 = 4
    h, model = feddyn_server_update(
        {"w": torch.tensor([0.0])},
        {"w": torch.tensor([1.0])},
        [{"w": torch.tensor([2.0])}, {"w": torch.tensor([4.0])}],
        alpha=0.1,
        num_clients=4,
    )
    assert h["w"].item() == pytest.approx(-0.1) and model["w"].item() == pytest.approx(4.0)


def test_feddyn_regulariser_gradient_is_minus_state_plus_alpha_difference() -> None:
    theta = torch.tensor([1.0, 2.0], requires_grad=True)
    anchor, state = torch.tensor([0.0, 4.0]), torch.tensor([0.3, -0.2])
    (linear_term({"w": theta}, {"w": state}) + dynamic_term({"w": theta}, {"w": anchor}, 0.5)).backward()
    assert torch.allclose(theta.grad, -state + 0.5 * (theta.detach() - anchor))


def test_feddyn_local_update_updates_the_private_state() -> None:
    data, model = tiny_data(), tiny_model()
    config = RunConfig(algo="feddyn", num_clients=1, batch_size=4, **RESOLVED)
    algorithm = FedDyn(config, FedDynHyperparameters(feddyn_alpha=0.1), model, data.num_train)
    received = {n: t.clone() for n, t in algorithm.broadcast(0).items()}
    (update,) = SequentialExecutor(model, data).train(
        algorithm.program, [ClientJob(0, 1, 3, received, algorithm.store.get(0))]
    )
    assert set(update.loss_terms) == {"task", "linear", "dynamic"}
    for n in algorithm.layout.groups["regularized"]:
        expected = -0.1 * (update.params[n] - received[n])  # from ∇L_k = 0
        assert torch.allclose(update.private["feddyn.grad." + n], expected)


# ---- the stateful clients keep their state in the store; SCAFFOLD's bytes ------------------
@pytest.mark.parametrize(
    "algo, key",
    [
        ("scaffold", "scaffold.ci.fc1.weight"),
        ("feddyn", "feddyn.grad.fc1.weight"),
        ("moon", "moon.prev.fc1.weight"),
        ("fedala", "fedala.local.fc1.weight"),
    ],
)
def test_stateful_clients_keep_their_state_in_the_store(algo: str, key: str, tmp_path) -> None:
    config = RunConfig(
        algo=algo,
        dataset="digits",
        model="mlp",
        num_clients=3,
        rounds=2,
        frac=0.67,
        optimizer="sgd",
        lr=0.05,
        out=str(tmp_path),
        backbone="random",
    )
    prepared = prepare(config)
    execute(prepared)
    store = prepared.algorithm.store
    assert store.clients() and all(key in store.get(k) for k in store.clients())
    records = [json.loads(line) for line in next((tmp_path / "runs").iterdir()).joinpath("rounds.jsonl").open()]
    model_bytes = sum(t.numel() * t.element_size() for t in prepared.algorithm.global_state.values())
    factor = 2 if algo == "scaffold" else 1  # SCAFFOLD: x and c down, Δy and Δc_i up
    assert all(r["bytes_down"] == factor * model_bytes * len(r["clients"]) for r in records)
    assert all(r["bytes_up"] == factor * model_bytes * len(r["clients"]) for r in records)
