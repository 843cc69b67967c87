"""FedMTL's task-relationship regulariser, PFL-MoE's gated mixture and pFedHN's hypernetwork update:
the defining formulas with hand-computed values, and what each algorithm sends, keeps and refuses."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from pflbench.algorithms.fedmtl import (
    PEERS,
    FedMTLHyperparameters,
    RegulariserTerms,
    mean_regularized_omega,
    task_relationship_penalty,
)
from pflbench.algorithms.pfedhn import (
    EMBEDDINGS,
    clip_total_norm,
    generate_weights,
    head_name,
    hypernetwork_gradient,
    layer_name,
    regression_residual,
    sgd_step,
)
from pflbench.algorithms.pflmoe import GATE, GLOBAL, STARTED, mixture_of_experts
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientProgram
from pflbench.errors import ConfigError
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness


def tiny(algo: str, out: Path, **settings) -> RunConfig:
    defaults = dict(
        algo=algo,
        dataset="digits",
        num_clients=3,
        rounds=2,
        model="mlp",
        optimizer="adam",
        lr=0.01,
        out=str(out),
        backbone="random",
    )
    return RunConfig(**{**defaults, **settings})


def records(out: Path) -> list[dict]:
    (folder,) = [p for p in (out / "runs").iterdir() if p.is_dir()]
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


# ---- FedMTL ---------------------------------------------------------------------------------


def test_mean_regularized_omega_gives_the_spread_around_the_mean() -> None:
    """W = [w1, w2, w3] = [1, 0], [3, 2], [2, 4]: w̄ = (2, 2), Σ‖w_k − w̄‖² = 5 + 1 + 4 = 10."""
    models = torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, 4.0]])
    omega = mean_regularized_omega(3)
    assert torch.allclose(omega, torch.eye(3) - 1 / 3)
    assert torch.allclose(omega @ omega, omega)  # (I − 11ᵀ/m)² = I − 11ᵀ/m
    assert task_relationship_penalty(models, omega).item() == pytest.approx(10.0)
    two = torch.tensor([[1.0, 0.0], [3.0, 2.0]])  # w̄ = (2, 1): ‖(−1, −1)‖² + ‖(1, 1)‖² = 4
    assert task_relationship_penalty(two, mean_regularized_omega(2)).item() == pytest.approx(4.0)


def test_the_regulariser_gradient_of_one_client_uses_the_others_models() -> None:
    """∇_{w_1} tr(W Ω Wᵀ) = 2·Σ_j Ω_1j·w_j = 2·(w_1 − w̄) = 2·((1, 0) − (2, 2)) = (−2, −4); the
    client's form Ω_00‖w‖² + 2⟨w, c⟩ + C gives the same value and gradient."""
    own = torch.tensor([1.0, 0.0], requires_grad=True)
    peers = torch.tensor([[3.0, 2.0], [2.0, 4.0]])
    omega = mean_regularized_omega(3)
    full = task_relationship_penalty(torch.cat([own[None], peers]), omega)
    (gradient,) = torch.autograd.grad(full, own)
    assert gradient.tolist() == pytest.approx([-2.0, -4.0])
    terms = RegulariserTerms.of(peers, omega)
    fast = terms.value(own)
    assert fast.item() == pytest.approx(10.0)
    (fast_gradient,) = torch.autograd.grad(fast, own)
    assert fast_gradient.tolist() == pytest.approx([-2.0, -4.0])


def test_fedmtl_default_lambda_pulls_each_model_towards_the_others_mean() -> None:
    """λ = 0.3 (the default). Own model w = 1 (d = 1) and 19 peers at 0 (m = 20): Ω_00 = 19/20,
    c = 0, so ∂/∂w λ·tr(W Ω Wᵀ) = λ·2·Ω_00·w = 0.3·1.9 = 0.57 — the pull 2λ(1 − 1/m)(w − p̄)."""
    assert FedMTLHyperparameters().lam == 0.3
    terms = RegulariserTerms.of(torch.zeros(19, 1), mean_regularized_omega(20))
    own = torch.ones(1, requires_grad=True)
    (FedMTLHyperparameters().lam * terms.value(own)).backward()
    assert own.grad.item() == pytest.approx(0.57)


def test_fedmtl_without_regulariser_is_local_training(tmp_path: Path) -> None:
    """λ = 0 adds 0·term: every client trains its own model alone, exactly as `local` does."""
    run_experiment(tiny("fedmtl", tmp_path / "mtl"), {"lam": 0.0})
    run_experiment(tiny("local", tmp_path / "local"))
    mtl, local = records(tmp_path / "mtl"), records(tmp_path / "local")
    assert [r["pers_acc"] for r in mtl] == [r["pers_acc"] for r in local]


def test_fedmtl_sends_the_reported_peers_and_pulls_models_together(tmp_path: Path) -> None:
    """Round 1: the server holds no model, nothing travels down; round 2: each of the 3 clients
    receives the 2 others' models (2·d floats) and uploads its own (d floats). A strong λ pulls the
    clients' models towards their mean."""
    spreads = {}
    for lam in (0.0, 10.0):
        run = prepare(tiny("fedmtl", tmp_path / str(lam)), {"lam": lam})
        from pflbench.runs.execute import execute

        execute(run)
        algorithm = run.algorithm
        names = algorithm.layout.trainable
        d = sum(algorithm.initial_state[n].numel() for n in names)
        rounds = records(tmp_path / str(lam))
        assert rounds[0]["bytes_down"] == 0 and rounds[1]["bytes_down"] == 3 * 2 * d * 4
        assert rounds[0]["bytes_up"] == rounds[1]["bytes_up"] == 3 * d * 4
        assert algorithm.reported == [0, 1, 2]
        assert algorithm.broadcast(0)[PEERS].shape == (2, d)
        models = torch.stack([torch.cat([algorithm.store.get(k)[n].reshape(-1) for n in names]) for k in range(3)])
        spreads[lam] = float(task_relationship_penalty(models, mean_regularized_omega(3)))
    assert spreads[10.0] < 0.5 * spreads[0.0]


# ---- pFedHN ---------------------------------------------------------------------------------


def tiny_linear_hypernetwork() -> tuple[dict[str, torch.Tensor], dict[str, torch.Size]]:
    """Embedding size 1, hidden width 1, no hidden layers, one target "w" of 2 numbers:
    z = 3·v + 0.5, θ = (1, −2)·z + (0.1, 0.2); client 0's embedding v = 2."""
    params = {
        EMBEDDINGS: torch.tensor([[2.0], [-1.0]]),
        layer_name(0, "weight"): torch.tensor([[3.0]]),
        layer_name(0, "bias"): torch.tensor([0.5]),
        head_name("w", "weight"): torch.tensor([[1.0], [-2.0]]),
        head_name("w", "bias"): torch.tensor([0.1, 0.2]),
    }
    return params, {"w": torch.Size([2])}


def test_generated_weights_of_a_tiny_linear_hypernetwork() -> None:
    params, targets = tiny_linear_hypernetwork()
    theta = generate_weights(params, params[EMBEDDINGS][0], targets, hidden_layers=0)
    assert theta["w"].tolist() == pytest.approx([6.6, -12.8])  # z = 6.5


def test_hypernetwork_update_is_the_vjp_with_the_upload() -> None:
    """Δθ = (1, −0.5): ∂/∂head.W = Δ·z = (6.5, −3.25), ∂/∂head.b = Δ, ∂/∂z = headᵀΔ = 1 + 1 = 2,
    ∂/∂W0 = 2·v = 4, ∂/∂b0 = 2, ∂/∂V[0] = W0·2 = 6 and V[1] (another client's) gets 0."""
    params, targets = tiny_linear_hypernetwork()
    gradient = hypernetwork_gradient(params, 0, {"w": torch.tensor([1.0, -0.5])}, targets, hidden_layers=0)
    assert gradient[head_name("w", "weight")].flatten().tolist() == pytest.approx([6.5, -3.25])
    assert gradient[head_name("w", "bias")].tolist() == pytest.approx([1.0, -0.5])
    assert gradient[layer_name(0, "weight")].flatten().tolist() == pytest.approx([4.0])
    assert gradient[layer_name(0, "bias")].tolist() == pytest.approx([2.0])
    assert gradient[EMBEDDINGS].flatten().tolist() == pytest.approx([6.0, 0.0])


def test_server_sgd_step_and_clipping_by_hand() -> None:
    """torch.optim.SGD's rule by hand. p = 1, g = 0.5, wd 0.1, μ 0.9, lr 0.1: d = 0.6, b = 0.6,
    p = 0.94; again: d = 0.5 + 0.094, b = 0.54 + 0.594 = 1.134, p = 0.94 − 0.1134 = 0.8266."""
    params, buffers = {"p": torch.tensor([1.0])}, {"p": torch.zeros(1)}
    for expected_param, expected_buffer in ((0.94, 0.6), (0.8266, 1.134)):
        sgd_step(params, {"p": torch.tensor([0.5])}, buffers, {"p": 0.1}, momentum=0.9, weight_decay=0.1)
        assert params["p"].item() == pytest.approx(expected_param)
        assert buffers["p"].item() == pytest.approx(expected_buffer)
    clipped = clip_total_norm({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}, 1.0)  # ‖g‖ = 5
    assert [clipped["a"].item(), clipped["b"].item()] == pytest.approx([0.6, 0.8], abs=1e-6)
    kept = clip_total_norm({"a": torch.tensor([0.3])}, 1.0)
    assert kept["a"].item() == pytest.approx(0.3)


def test_pfedhn_sends_generated_models_and_updates_from_the_deltas(tmp_path: Path) -> None:
    """Down: each client's generated θ_i; up: Δθ_i of the same size; the server's hypernetwork
    changes, clients get different models, and a client's upload is θ_i minus its trained model."""
    from pflbench.runs.execute import execute

    run = prepare(tiny("pfedhn", tmp_path, rounds=1))
    algorithm = run.algorithm
    d = sum(algorithm.initial_state[n].numel() for n in algorithm.layout.trainable)
    assert algorithm.embed_dim == int(1 + 3 / 4)  # the authors' automatic size
    theta = algorithm.broadcast(0)
    assert set(theta) == set(algorithm.layout.trainable)
    assert not torch.equal(theta["fc1.weight"], algorithm.broadcast(1)["fc1.weight"])
    harness = Harness(run)
    update = harness.train_client(0, theta)
    trained = harness.state
    assert all(torch.allclose(update.params[n], theta[n] - trained[n]) for n in theta)
    before = {n: t.clone() for n, t in algorithm.hypernetwork.items()}
    execute(run)
    (record,) = records(tmp_path)
    assert record["bytes_down"] == record["bytes_up"] == 3 * d * 4
    assert all(not torch.equal(before[n], algorithm.hypernetwork[n]) for n in before)
    assert algorithm.reported == [0, 1, 2]


def test_pfedhn_server_steps_once_per_client_with_gradients_at_the_generating_phi(tmp_path: Path) -> None:
    """Two uploads: the server's update equals two SGD steps (client-id order) whose VJPs are both
    taken at φ^t, where the two models were generated — not at the φ after the first step."""
    from pflbench.engine.types import ClientUpdate

    algorithm = prepare(tiny("pfedhn", tmp_path)).algorithm
    hparams, targets = algorithm.hparams, algorithm.targets
    phi = {n: t.clone() for n, t in algorithm.hypernetwork.items()}
    generator = torch.Generator().manual_seed(3)
    deltas = {k: {n: 0.01 * torch.randn(shape, generator=generator) for n, shape in targets.items()} for k in (0, 2)}
    expected, buffers = {n: t.clone() for n, t in phi.items()}, {n: torch.zeros_like(t) for n, t in phi.items()}
    for k in (0, 2):
        gradient = hypernetwork_gradient(phi, k, deltas[k], targets, hparams.hn_hidden_layers)
        clipped = clip_total_norm(gradient, hparams.hn_max_grad_norm)
        sgd_step(expected, clipped, buffers, algorithm.learning_rates, hparams.hn_momentum, hparams.hn_weight_decay)
    algorithm.aggregate([ClientUpdate(2, 10, deltas[2], {}), ClientUpdate(0, 10, deltas[0], {})])
    assert all(torch.allclose(algorithm.hypernetwork[n], expected[n], atol=1e-7) for n in phi)
    assert all(torch.equal(algorithm.momentum_buffers[n], buffers[n]) for n in phi)
    assert algorithm.learning_rates[EMBEDDINGS] == hparams.hn_lr == 3e-3  # the suite's default (docstring)


def test_regression_residual_is_the_upload_at_the_generating_phi() -> None:
    """θ_i = (4, −1) generated at φ^t, Δθ = (1, 0.5): θ̃ = (3, −1.5). At φ^t the residual is Δθ;
    after the generated model moved to (3.5, −2) it is (0.5, −0.5)."""
    at_upload, delta = {"w": torch.tensor([4.0, -1.0])}, {"w": torch.tensor([1.0, 0.5])}
    assert regression_residual(at_upload, at_upload, delta)["w"].tolist() == [1.0, 0.5]
    moved = {"w": torch.tensor([3.5, -2.0])}
    assert regression_residual(moved, at_upload, delta)["w"].tolist() == [0.5, -0.5]


def test_pfedhn_server_steps_per_upload(tmp_path: Path) -> None:
    """--hn-server-steps 2 (default 1, the paper's): per client, the paper's step (VJP at φ^t with
    Δθ), then one on ½‖h(v_i; φ) − θ̃_i‖² at the moved φ. By hand on the tiny linear hypernetwork
    with lr 0.1, no momentum or decay, no clipping: step 1 moves head.b by −0.1·Δθ = (−0.1, 0.05)
    among the rest; step 2's residual is h(v; φ₁) − θ̃."""
    from pflbench.engine.types import ClientUpdate

    assert prepare(tiny("pfedhn", tmp_path / "default")).algorithm.server_steps == 1
    algorithm = prepare(tiny("pfedhn", tmp_path / "two"), {"hn_server_steps": 2}).algorithm
    params, targets = tiny_linear_hypernetwork()
    algorithm.hypernetwork = {n: t.clone() for n, t in params.items()}
    algorithm.momentum_buffers = {n: torch.zeros_like(t) for n, t in params.items()}
    algorithm.learning_rates = {n: 0.1 for n in params}
    algorithm.targets = targets
    algorithm.hparams = dataclasses.replace(
        algorithm.hparams, hn_hidden_layers=0, hn_momentum=0.0, hn_weight_decay=0.0, hn_max_grad_norm=1e9
    )
    delta = {"w": torch.tensor([1.0, -0.5])}
    algorithm.aggregate([ClientUpdate(0, 10, delta, {})])
    # step 1 (test_hypernetwork_update_is_the_vjp_with_the_upload's gradient, lr 0.1):
    # head.W = (1, −2) − 0.1·(6.5, −3.25) = (0.35, −1.675); head.b = (0.1, 0.2) − 0.1·(1, −0.5) = (0, 0.25);
    # W0 = 3 − 0.4 = 2.6; b0 = 0.5 − 0.2 = 0.3; v = 2 − 0.6 = 1.4
    # θ_1 = head(z₁), z₁ = 2.6·1.4 + 0.3 = 3.94: (0.35·3.94, −1.675·3.94 + 0.25) = (1.379, −6.3495)
    # θ̃ = θ₀ − Δθ = (6.6, −12.8) − (1, −0.5) = (5.6, −12.3); residual r = (−4.221, 5.9505)
    # step 2: head.b ← (0, 0.25) − 0.1·r = (0.4221, −0.34505)
    assert algorithm.hypernetwork[head_name("w", "bias")].tolist() == pytest.approx([0.4221, -0.34505], abs=1e-5)
    # head.W ← (0.35, −1.675) − 0.1·r·z₁ = (0.35 + 0.4221·3.94, −1.675 − 0.59505·3.94)
    assert algorithm.hypernetwork[head_name("w", "weight")].flatten().tolist() == pytest.approx(
        [0.35 + 0.4221 * 3.94, -1.675 - 0.59505 * 3.94], abs=1e-4
    )


def test_pfedhn_inner_steps_take_exactly_k_minibatch_steps(tmp_path: Path) -> None:
    """--inner-steps 7 (the paper's schedule): 7 optimizer steps whatever the client's size; the
    default keeps the engine's --local-epochs batch loop."""
    run = prepare(tiny("pfedhn", tmp_path / "steps"), {"inner_steps": 7})
    harness = Harness(run)
    update = harness.train_client(1, run.algorithm.broadcast(1))
    assert update.local_steps == 7 and math.isfinite(update.loss)
    assert any(float(t.abs().sum()) > 0 for t in update.params.values())
    default = prepare(tiny("pfedhn", tmp_path / "epochs"))
    assert type(default.algorithm.program).local_update is ClientProgram.local_update


def test_pfedhn_new_client_learns_only_its_embedding(tmp_path: Path) -> None:
    """A new client starts from the mean embedding's model; learning its embedding (φ frozen) lowers
    its train loss, and the server's hypernetwork is left as it was."""
    from torch.func import functional_call

    from pflbench.engine import personalize
    from pflbench.runs.execute import execute

    run = prepare(tiny("pfedhn", tmp_path, num_clients=4, new_clients=0.25, rounds=1))
    execute(run)
    algorithm, executor = run.algorithm, run.executor
    (new,) = [k for k in range(4) if k not in algorithm.reported]
    phi = {n: t.clone() for n, t in algorithm.hypernetwork.items()}
    start = algorithm.new_client_model(new)
    (served,) = personalize(executor, algorithm.new_client_program(), [start], [new], [7], 1)
    assert set(served) == set(algorithm.initial_state)  # a model state, nothing of the hypernetwork
    assert all(torch.equal(phi[n], algorithm.hypernetwork[n]) for n in phi)
    data = executor.data
    inputs, labels = data.gather(data.train_indices[new])

    def train_loss(state) -> float:
        model_state = {n: state[n] for n in algorithm.initial_state}
        return float(
            torch.nn.functional.cross_entropy(functional_call(algorithm.model, model_state, (inputs,)), labels)
        )

    assert train_loss(served) < train_loss(start)


@pytest.mark.parametrize("algo", ["fedmtl", "pfedhn"])
def test_vmap_and_client_level_dp_are_refused_in_one_line(algo: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refusal:
        prepare(tiny(algo, tmp_path, executor="vmap"))
    assert "vmap" in str(refusal.value) and "\n" not in str(refusal.value)
    with pytest.raises(ConfigError) as refusal:
        prepare(tiny(algo, tmp_path, dp="client", dp_noise=1.0, dp_clip=1.0))
    assert "\n" not in str(refusal.value)


# ---- PFL-MoE --------------------------------------------------------------------------------


def test_the_gate_mixes_the_two_outputs_per_input() -> None:
    """y = g·f_personal + (1 − g)·f_global: g = 0.25 on (2, 0) and (0, 4) gives (0.5, 3); a gate of
    1 keeps the personal row, 0 the global one."""
    personal, global_ = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 4.0]])
    assert mixture_of_experts(personal, global_, torch.tensor([[0.25]])).tolist() == [[0.5, 3.0]]
    rows = mixture_of_experts(personal.repeat(2, 1), global_.repeat(2, 1), torch.tensor([[1.0], [0.0]]))
    assert rows.tolist() == [[2.0, 0.0], [0.0, 4.0]]


def test_configured_model_outputs_the_gated_mixture_and_the_global_model_alone(tmp_path: Path) -> None:
    run = prepare(tiny("pflmoe", tmp_path))
    algorithm, model = run.algorithm, run.algorithm.model
    expert = model.get_submodule(GLOBAL)
    inputs = torch.randn(5, 64)
    with torch.no_grad():
        for name, tensor in model.named_parameters():  # the personal expert differs from the global one
            if not name.startswith((GLOBAL, GATE)):
                tensor.add_(0.1)
        gate = model.get_submodule(GATE)
        gate.weight.zero_()
        gate.bias.fill_(0.0)  # g = sigmoid(0) = 1/2
        mixed = model(inputs)
        expected = 0.5 * model.forward(inputs) + 0.5 * expert(inputs)
        assert torch.allclose(mixed, expected) and not torch.allclose(model.forward(inputs), expert(inputs))
        personal, global_output, gates = mixed.pflmoe_parts
        assert torch.equal(gates, torch.full((5, 1), 0.5))
        harness = Harness(run)
        harness.load_global_model()  # global_acc: the gate forced to 0, so y = f(x; w) exactly
        assert torch.equal(harness.model(inputs), expert(inputs))
    assert set(algorithm.layout.shared) == {n for n in algorithm.layout.trainable if n.startswith(GLOBAL + ".")}
    assert {n for n in algorithm.layout.private} >= set(algorithm.layout.groups["gate"])


def test_pflmoe_sends_only_the_global_expert_and_keeps_personal_model_and_gate(tmp_path: Path) -> None:
    from pflbench.runs.execute import execute

    run = prepare(tiny("pflmoe", tmp_path, rounds=1))
    algorithm = run.algorithm
    shared = algorithm.layout.shared
    d = sum(algorithm.initial_state[n].numel() for n in shared)
    personal = algorithm.layout.groups["personal"]
    with torch.no_grad():  # as if a later round: the global expert moved away from w⁰
        for name in shared:
            algorithm.global_state[name].add_(0.01)
    untrained = algorithm.personal_model(0)  # a client never trained: v = the current global w
    assert all(torch.equal(untrained[n], algorithm.global_state[f"{GLOBAL}.{n}"]) for n in personal)
    execute(run)
    (record,) = records(tmp_path)
    assert record["bytes_down"] == record["bytes_up"] == 3 * d * 4
    for k in range(3):
        private = algorithm.store.get(k)
        assert float(private[STARTED]) == 1.0
        assert not torch.equal(private[algorithm.layout.groups["gate"][0]], algorithm.store.initial[GATE + ".weight"])


def test_gate_split_is_fixed_disjoint_and_a_quarter(tmp_path: Path) -> None:
    from pflbench.engine import LocalTrainer
    from pflbench.engine.types import ClientJob

    run = prepare(tiny("pflmoe", tmp_path))
    algorithm, executor = run.algorithm, run.executor
    job = ClientJob(1, 1, 0, algorithm.broadcast(1), algorithm.store.get(1))
    trainer = LocalTrainer(executor.model, executor.data, job, 32)
    personal, gate = algorithm.program.splits(trainer)
    everything = executor.data.train_indices[1]
    assert len(gate) == len(everything) // 4 and len(personal) + len(gate) == len(everything)
    assert sorted(torch.cat([personal, gate]).tolist()) == sorted(everything.tolist())
    again = algorithm.program.splits(trainer)
    assert torch.equal(again[1], gate)


def test_pflmoe_refuses_vmap_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refusal:
        prepare(tiny("pflmoe", tmp_path, executor="vmap"))
    assert "vmap" in str(refusal.value) and "\n" not in str(refusal.value)


def test_pflmoe_gate_split_of_one_sample_is_no_single_sample_batch() -> None:
    """A client whose gate split holds one sample (a tiny client) trained BatchNorm on a batch of
    one and crashed (cnn_bn); its batches are cut like the engine's (``minibatches``)."""
    from pflbench.algorithms.pflmoe import subset_batches

    class Gather:
        def gather(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return batch, batch

    generator = torch.Generator().manual_seed(0)
    (batch,) = [b for b, _ in subset_batches(Gather(), torch.tensor([7]), 32, generator)]
    assert batch.tolist() == [7, 7]
    sizes = [len(b) for b, _ in subset_batches(Gather(), torch.arange(33), 32, generator)]
    assert sizes == [33]
