"""Ditto, APFL, pFedMe, Per-FedAvg, FedBABU, LG-FedAvg and the
``--finetune-epochs`` protocol. Each distinctive formula against values computed by hand (closed
forms, explicit softmax gradients), the local updates on a one-layer model, and the engine hooks."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pflbench.algorithms.apfl import ALPHA, APFL, LOCAL, APFLHyperparameters, apfl_gradients, apfl_mixture
from pflbench.algorithms.ditto import PERSONAL, Ditto, DittoHyperparameters, ditto_personal_gradient
from pflbench.algorithms.fedbabu import FedBABU, FedBABUHyperparameters
from pflbench.algorithms.lgfedavg import LGFedAvg, LGFedAvgHyperparameters
from pflbench.algorithms.perfedavg import (
    OneStepAdaptation,
    PerFedAvg,
    PerFedAvgHyperparameters,
    adaptation_step,
    exact_hessian_vector,
    finite_difference_hessian_vector,
    meta_gradient,
)
from pflbench.algorithms.pfedme import (
    THETA,
    PFedMe,
    PFedMeHyperparameters,
    pfedme_envelope_gradient,
    pfedme_inner_solve,
    pfedme_server_update,
)
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientJob, LocalTrainer
from pflbench.errors import ConfigError
from pflbench.models.zoo import build_model
from pflbench.runs.api import run_experiment
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare

LR = 0.1


# ---- a one-layer model, one batch, gradients by hand ----------------------------------------
class OneBatch:
    """The client data a LocalTrainer reads: the same single batch every epoch."""

    device = torch.device("cpu")

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets, self.num_train = inputs, targets, [len(targets)]

    def train_batches(self, client_id, batch_size, generator):
        yield self.inputs, self.targets


def linear_setup(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    model = nn.Linear(3, 4).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(4, 3, generator=generator, dtype=torch.float64))
        model.bias.copy_(torch.randn(4, generator=generator, dtype=torch.float64))
    data = OneBatch(torch.randn(2, 3, generator=generator, dtype=torch.float64), torch.tensor([1, 3]))
    return model, data


def ce_gradient(params: dict[str, torch.Tensor], data: OneBatch) -> dict[str, torch.Tensor]:
    """∇ of the mean cross-entropy of a linear layer: (softmax(Wx + b) − onehot(y))/N ⊗ x."""
    logits = data.inputs @ params["weight"].T + params["bias"]
    residual = (torch.softmax(logits, dim=1) - nn.functional.one_hot(data.targets, 4)) / len(data.targets)
    return {"weight": residual.T @ data.inputs, "bias": residual.sum(0)}


def make(algorithm_class, hparams, model, **settings):
    config = RunConfig(
        algo="x",
        model="mlp",
        lr=LR,
        optimizer="sgd",
        max_grad_norm=0.0,
        public_frac=0.0,
        local_epochs=1,
        batch_size=2,
        **settings,
    )
    return algorithm_class(config, hparams, model, [2])


def run_local(algorithm, model, data, received, private, program=None):
    """What the sequential executor does for one job."""
    program = program or algorithm.program
    state = program.assemble(received, private)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        for name, value in state.items():
            if name in tensors:
                tensors[name].copy_(value)
    trainer = LocalTrainer(model, data, ClientJob(0, 1, 0, received, private), 2)
    result = program.local_update(trainer)
    if result.upload is None:
        result.upload = program.upload(tensors, received)
    if result.private is None:
        result.private = program.private_state(tensors, private)
    return result


def initial(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ---- Ditto ----------------------------------------------------------------------------------
def test_ditto_personal_gradient_formula():
    v, w, g = {"a": torch.tensor([1.0, -2.0])}, {"a": torch.tensor([0.5, 1.0])}, {"a": torch.tensor([0.1, 0.2])}
    # g + λ(v − w) = [0.1 + 2·0.5, 0.2 + 2·(−3)]
    assert torch.allclose(ditto_personal_gradient(g, v, w, 2.0)["a"], torch.tensor([1.1, -5.8]))


def test_ditto_local_update_trains_w_like_fedavg_and_v_with_the_proximal_pull():
    model, data = linear_setup()
    lam = 0.7
    ditto = make(Ditto, DittoHyperparameters(lam=lam), model)
    w0 = initial(model)
    v0 = {n: t + 0.3 for n, t in w0.items()}  # a personal model away from w
    private = {PERSONAL + n: t.clone() for n, t in v0.items()}
    result = run_local(ditto, model, data, w0, private)
    gw, gv = ce_gradient(w0, data), ce_gradient(v0, data)
    for n in w0:
        assert torch.allclose(result.upload[n], w0[n] - LR * gw[n])  # FedAvg step on w
        expected_v = v0[n] - LR * (gv[n] + lam * (v0[n] - w0[n]))  # v − η(∇f(v) + λ(v − w^t))
        assert torch.allclose(result.private[PERSONAL + n], expected_v)
    assert set(result.upload) == set(w0)  # only w travels
    ditto.store.put(0, result.private)
    assert torch.equal(ditto.personal_model(0)["weight"], result.private[PERSONAL + "weight"])
    assert torch.equal(ditto.global_model()["weight"], w0["weight"])


# ---- APFL -----------------------------------------------------------------------------------
def test_apfl_alpha_gradient_is_the_hand_derived_chain_rule():
    v = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[0.5]])}
    w = {"a": torch.tensor([0.0, 1.0]), "b": torch.tensor([[-0.5]])}
    alpha = 0.25
    mixture = apfl_mixture(v, w, alpha)
    assert torch.allclose(mixture["a"], torch.tensor([0.25, 1.25])) and torch.allclose(
        mixture["b"], torch.tensor([[-0.25]])
    )
    # f(v̄) = ½‖v̄ − t‖²  ⇒  ∇f(v̄) = v̄ − t;  ∂f/∂α = ⟨v − w, v̄ − t⟩
    t = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([[1.0]])}
    g = {n: mixture[n] - t[n] for n in v}  # a: [−0.75, 1.25], b: [[−1.25]]
    local_gradient, alpha_gradient = apfl_gradients(g, v, w, alpha)
    # ⟨[1, 1], [−0.75, 1.25]⟩ + 1·(−1.25) = 0.5 − 1.25 = −0.75
    assert float(alpha_gradient) == pytest.approx(-0.75)
    assert torch.allclose(local_gradient["a"], 0.25 * g["a"])
    # the same number by autograd through v̄(α)
    alpha_leaf = torch.tensor(alpha, requires_grad=True)
    loss = sum(0.5 * (apfl_mixture(v, w, alpha_leaf)[n] - t[n]).pow(2).sum() for n in v)
    loss.backward()
    assert float(alpha_leaf.grad) == pytest.approx(-0.75)


def test_apfl_local_step_updates_w_v_and_alpha_simultaneously():
    model, data = linear_setup(1)
    apfl = make(APFL, APFLHyperparameters(alpha_init=0.4, alpha_lr=0.5), model)
    w0 = initial(model)
    v0 = {n: t * 0.5 - 0.2 for n, t in w0.items()}
    private = {**{LOCAL + n: t.clone() for n, t in v0.items()}, ALPHA: torch.tensor(0.4, dtype=torch.float64)}
    result = run_local(apfl, model, data, w0, private)
    mixture = {n: 0.4 * v0[n] + 0.6 * w0[n] for n in w0}
    gw, gm = ce_gradient(w0, data), ce_gradient(mixture, data)
    alpha_gradient = sum(((v0[n] - w0[n]) * gm[n]).sum() for n in w0)
    for n in w0:
        assert torch.allclose(result.upload[n], w0[n] - LR * gw[n])
        assert torch.allclose(result.private[LOCAL + n], v0[n] - LR * 0.4 * gm[n])
    assert float(result.private[ALPHA]) == pytest.approx(min(1.0, max(0.0, 0.4 - 0.5 * float(alpha_gradient))))
    apfl.store.put(0, result.private)
    personal = apfl.personal_model(0)  # v̄ with the current global w (here w0)
    alpha = result.private[ALPHA]
    assert torch.allclose(personal["bias"], alpha * result.private[LOCAL + "bias"] + (1 - alpha) * w0["bias"])


# ---- pFedMe ---------------------------------------------------------------------------------
def quadratic(a: float, c: torch.Tensor):
    """f(θ) = (a/2)·‖θ − c‖²."""
    return lambda params: (0.5 * a * (params["x"] - c).pow(2).sum(), {"x": a * (params["x"] - c)})


def test_pfedme_inner_solution_on_a_quadratic():
    a, lam, lr = 2.0, 3.0, 0.05
    c, w, theta0 = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 2.0]), torch.tensor([4.0, 4.0])
    closed_form = (a * c + lam * w) / (a + lam)  # argmin (a/2)‖θ − c‖² + (λ/2)‖θ − w‖² = [0.4, 0.8]
    assert torch.allclose(closed_form, torch.tensor([0.4, 0.8]))
    solved, _ = pfedme_inner_solve(quadratic(a, c), {"x": theta0}, {"x": w}, lam, lr, 400)
    assert torch.allclose(solved["x"], closed_form, atol=1e-6)
    # K = 5 steps: θ_K = θ* + (1 − ν(a + λ))^K·(θ₀ − θ*)
    five, _ = pfedme_inner_solve(quadratic(a, c), {"x": theta0}, {"x": w}, lam, lr, 5)
    assert torch.allclose(five["x"], closed_form + (1 - lr * (a + lam)) ** 5 * (theta0 - closed_form))


def test_pfedme_envelope_gradient_and_beta_server_update():
    w, theta = {"x": torch.tensor([1.0, 2.0])}, {"x": torch.tensor([0.5, 3.0])}
    assert torch.allclose(pfedme_envelope_gradient(w, theta, 15.0)["x"], torch.tensor([7.5, -15.0]))
    state = {"x": torch.tensor([1.0, 2.0])}
    pfedme_server_update(state, {"x": torch.tensor([3.0, 0.0])}, 2.0)  # (1 − 2)·w + 2·avg
    assert torch.allclose(state["x"], torch.tensor([5.0, -2.0]))


def test_pfedme_local_update_one_inner_step_closed_form():
    model, data = linear_setup(2)
    lam, nu = 15.0, 0.01
    pfedme = make(PFedMe, PFedMeHyperparameters(lam=lam, inner_steps=1, personal_lr=nu), model)
    w0 = initial(model)
    result = run_local(pfedme, model, data, w0, dict(pfedme.store.initial))
    g = ce_gradient(w0, data)
    # θ₁ = w₀ − ν·∇f(w₀) (θ starts at w); w₁ = w₀ − η·λ·(w₀ − θ₁) = w₀ − η·λ·ν·∇f(w₀)
    for n in w0:
        assert torch.allclose(result.private[THETA + n], w0[n] - nu * g[n])
        assert torch.allclose(result.upload[n], w0[n] - LR * lam * nu * g[n])


# ---- Per-FedAvg -----------------------------------------------------------------------------
def test_perfedavg_first_order_and_hessian_free_steps_on_a_quadratic():
    # batch i: f_i(w) = ½ wᵀA_i w − b_iᵀw, ∇f_i = A_i w − b_i, Hessian A_i
    A = [
        torch.tensor([[2.0, 0.0], [0.0, 1.0]]),
        torch.tensor([[1.0, 1.0], [1.0, 3.0]]),
        torch.tensor([[4.0, 1.0], [1.0, 2.0]]),
    ]
    b = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])]

    def gradient(params, i):
        x = params["w"]
        return 0.5 * x @ A[i] @ x - b[i] @ x, {"w": A[i] @ x - b[i]}

    w, alpha = {"w": torch.tensor([1.0, 1.0])}, 0.1
    # w' = w − α(A₀w − b₀) = [1, 1] − 0.1·[1, 1] = [0.9, 0.9]; g = A₁w' − b₁ = [1.8, 2.6]
    fo, _ = meta_gradient(gradient, w, [0, 1], alpha)
    assert torch.allclose(fo["w"], torch.tensor([1.8, 2.6]))

    # hf: g − α·A₂·g = [1.8, 2.6] − 0.1·[9.8, 7.0] = [0.82, 1.9], exact by double backward and
    # by central differences (exact on a quadratic)
    def loss(params, i):
        return 0.5 * params["w"] @ A[i] @ params["w"] - b[i] @ params["w"]

    for product in (exact_hessian_vector(loss), finite_difference_hessian_vector(gradient, 1e-2)):
        hf, _ = meta_gradient(gradient, w, [0, 1, 2], alpha, product)
        assert torch.allclose(hf["w"], torch.tensor([0.82, 1.9]), atol=1e-5)
    assert torch.allclose(adaptation_step(w, {"w": torch.tensor([1.0, -1.0])}, alpha)["w"], torch.tensor([0.9, 1.1]))


def test_perfedavg_test_time_model_is_one_adaptation_step():
    model, data = linear_setup(3)
    perfedavg = make(PerFedAvg, PerFedAvgHyperparameters(inner_lr=0.05), model)
    program = perfedavg.personalization_program()
    assert isinstance(program, OneStepAdaptation)
    w0 = initial(model)
    result = run_local(perfedavg, model, data, w0, {}, program=program)
    g = ce_gradient(w0, data)
    for n in w0:
        assert torch.allclose(result.upload[n], w0[n] - 0.05 * g[n])


# ---- LG-FedAvg, FedBABU -----------------------------------------------------------------------
def mlp():
    torch.manual_seed(0)
    return build_model("mlp", (1, 8, 8), 10)


def test_lgfedavg_shares_the_head_and_keeps_the_body():
    algorithm = make(LGFedAvg, LGFedAvgHyperparameters(), mlp())
    assert set(algorithm.layout.shared) == {"fc3.weight", "fc3.bias"}
    assert set(algorithm.layout.private) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert set(algorithm.broadcast(0)) == {"fc3.weight", "fc3.bias"}  # bytes: the head only
    assert LGFedAvg.uses_head_layers and not LGFedAvg.has_global_model
    two = make(LGFedAvg, LGFedAvgHyperparameters(), mlp(), head_layers=2)
    assert set(two.layout.shared) == {"fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}


def test_fedbabu_trains_and_sends_the_body_only_with_the_head_frozen(tmp_path):
    config = RunConfig(
        algo="fedbabu", dataset="digits", model="mlp", num_clients=2, rounds=1, out=str(tmp_path), backbone="random"
    )
    prepared = prepare(config, {"ft_epochs": 1})
    algorithm = prepared.algorithm
    assert set(algorithm.layout.shared) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    summary = execute(prepared)
    head = {"fc3.weight", "fc3.bias"}
    global_model = algorithm.global_model()
    for name in head:
        assert torch.equal(global_model[name], algorithm.initial_state[name])  # never updated
    assert not torch.equal(global_model["fc1.weight"], algorithm.initial_state["fc1.weight"])
    assert algorithm.store.clients() == []  # nothing per client
    body_bytes = sum(algorithm.initial_state[n].numel() * 4 for n in algorithm.layout.shared)
    assert summary["bytes_up_total"] == 2 * body_bytes
    # pers_acc is the fine-tuned model's, global_acc the untuned one's
    assert summary["pers_acc"] != pytest.approx(summary["global_acc"])
    program = algorithm.personalization_program()
    assert program.epochs == 1 and program.names == frozenset(algorithm.layout.trainable)
    head_only = FedBABU(
        algorithm.config, FedBABUHyperparameters(ft_part="head"), prepared.executor.model, algorithm.num_train
    ).personalization_program()
    assert head_only.names == frozenset(head)


# ---- --finetune-epochs ------------------------------------------------------------------------
def test_finetune_epochs_adds_pers_acc_ft_and_changes_nothing_else(tmp_path):
    settings = {
        "algo": "fedavg",
        "dataset": "digits",
        "model": "mlp",
        "num_clients": 2,
        "rounds": 1,
        "backbone": "random",
    }
    plain = run_experiment(RunConfig(**settings, out=str(tmp_path / "plain")))
    tuned = run_experiment(RunConfig(**settings, finetune_epochs=2, out=str(tmp_path / "tuned")))
    for key in ("pers_acc", "global_acc", "final_train_loss", "bytes_up_total"):
        assert tuned[key] == plain[key], key
    assert "pers_acc_ft" not in plain
    assert 0 <= tuned["pers_acc_ft"] <= 1 and 0 <= tuned["pers_acc_ft_weighted"] <= 1
    assert tuned["pers_acc_ft"] != plain["pers_acc"]  # two epochs on each client move the model
    (folder,) = (tmp_path / "tuned" / "runs").iterdir()
    last = json.loads((folder / "rounds.jsonl").read_text().splitlines()[-1])
    assert last["pers_acc_ft"] == tuned["pers_acc_ft"]
    assert "pers_acc_ft" in (folder / "clients.csv").read_text().splitlines()[0]
    config = json.loads((folder / "config.json").read_text())
    assert config["identity"]["finetune_epochs"] == 2


def test_finetune_epochs_is_refused_without_a_global_model(tmp_path):
    with pytest.raises(ConfigError, match="finetune-epochs"):
        prepare(
            RunConfig(
                algo="fedper",
                dataset="digits",
                model="mlp",
                num_clients=2,
                rounds=1,
                finetune_epochs=1,
                out=str(tmp_path),
            )
        )


def test_a_sweep_fine_tunes_only_the_algorithms_with_a_global_model():
    from pflbench.sweeps.grid import Grid, expand_grid

    runs = expand_grid(RunConfig(model="mlp", finetune_epochs=3), Grid(("fedavg", "fedper"), ("digits",), (0.5,), (0,)))
    assert {r.config.algo: r.config.finetune_epochs for r in runs} == {"fedavg": 3, "fedper": 0}
