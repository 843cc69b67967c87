"""The fixes of the review of the existing algorithms (issue 23): Per-FedAvg's exact
Hessian-vector product, pFedMe's optional μ·θ term, LG-FedAvg's paper split and FedAvg warm start,
FedSDG's aggregation choices and private-branch initialisation. Each against values computed by
hand or by an independent torch routine."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn

from pflbench.algorithms.fedsdg import FedSDG, FedSDGHyperparameters, GatedLoRALinear
from pflbench.algorithms.lgfedavg import LGFedAvg, LGFedAvgHyperparameters, global_layer_count
from pflbench.algorithms.perfedavg import (
    PerFedAvgHyperparameters,
    exact_hessian_vector,
    finite_difference_hessian_vector,
)
from pflbench.algorithms.pfedme import PFedMe, PFedMeHyperparameters, pfedme_inner_solve
from pflbench.config.identity import identity_settings
from pflbench.config.run_config import RunConfig, resolve
from pflbench.engine import ClientUpdate
from pflbench.errors import ConfigError
from pflbench.models.zoo import build_model
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.testing import killed_and_resumed

TINY = {"dataset": "digits", "model": "mlp", "num_clients": 3, "rounds": 2, "backbone": "random", "val_frac": 0.0}


# ---- Per-FedAvg: exact Hessian-vector product ---------------------------------------------------
def relu_mlp_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    inputs, targets = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    names = [n for n, _ in model.named_parameters()]

    def loss(params, batch):
        x, y = batch
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return loss, params, names, (inputs, targets)


def test_exact_hessian_vector_product_equals_torch_autograd_hvp_on_a_relu_model():
    loss, params, names, batch = relu_mlp_loss()
    generator = torch.Generator().manual_seed(1)
    vector = {n: torch.randn(t.shape, generator=generator, dtype=torch.float64) for n, t in params.items()}
    ours = exact_hessian_vector(loss)(params, vector, batch)

    def flat_loss(*tensors):
        return loss(dict(zip(names, tensors)), batch)

    _, reference = torch.autograd.functional.hvp(
        flat_loss, tuple(params[n] for n in names), tuple(vector[n] for n in names)
    )
    for name, expected in zip(names, reference):
        torch.testing.assert_close(ours[name], expected, rtol=1e-10, atol=1e-12)


def test_exact_hessian_vector_product_of_a_quadratic_is_a_times_u_and_zero_where_unused():
    a = torch.tensor([[3.0, 1.0], [1.0, 2.0]])

    def loss(params, batch):  # ½ wᵀAw + 5·c: H = A for w; c enters linearly (gradient constant)
        return 0.5 * params["w"] @ a @ params["w"] + 5 * params["c"].sum()

    product = exact_hessian_vector(loss)(
        {"w": torch.tensor([1.0, -1.0]), "c": torch.ones(2)}, {"w": torch.tensor([1.0, 2.0]), "c": torch.ones(2)}, None
    )
    assert torch.equal(product["w"], torch.tensor([5.0, 5.0]))  # A·[1, 2] = [3 + 2, 1 + 4]
    assert torch.equal(product["c"], torch.zeros(2))


def test_finite_difference_is_the_option_and_differs_from_the_exact_product_on_relu():
    loss, params, names, batch = relu_mlp_loss()

    def gradient(p, b):
        leaves = {n: t.detach().requires_grad_(True) for n, t in p.items()}
        value = loss(leaves, b)
        return value.detach(), dict(zip(leaves, torch.autograd.grad(value, list(leaves.values()))))

    vector = {n: torch.ones_like(t) for n, t in params.items()}
    exact = exact_hessian_vector(loss)(params, vector, batch)
    # a step of δ = 0.5 along u crosses ReLU kinks: the difference quotient is not H·u
    rough = finite_difference_hessian_vector(gradient, 0.5)(params, vector, batch)
    assert any(not torch.allclose(exact[n], rough[n], rtol=1e-3) for n in names)
    assert PerFedAvgHyperparameters().hvp == "exact"


def test_perfedavg_hvp_option_changes_hf_runs_only(tmp_path):
    settings = {**TINY, "algo": "perfedavg", "rounds": 1}
    exact = run_experiment(RunConfig(**settings, out=str(tmp_path / "e")))
    finite = run_experiment(RunConfig(**settings, out=str(tmp_path / "f")), {"hvp": "finite-difference"})
    assert exact["final_train_loss"] != finite["final_train_loss"]
    # --variant fo takes no Hessian-vector product: --hvp is inert there, so it is refused, not ignored
    for hvp in ("exact", "finite-difference"):
        with pytest.raises(ConfigError, match="--hvp .* would be ignored: --variant fo"):
            run_experiment(RunConfig(**settings, out=str(tmp_path / "fo")), {"variant": "fo", "hvp": hvp})
    assert not (tmp_path / "fo").exists()


# ---- pFedMe: the authors' μ·θ term ----------------------------------------------------------
def test_pfedme_inner_step_adds_mu_theta_only_when_asked():
    theta, anchor = {"a": torch.tensor([1.0, -2.0])}, {"a": torch.tensor([0.5, 0.0])}

    def gradient(params):
        return torch.tensor(0.0), {"a": torch.tensor([0.2, 0.4])}

    # θ − ν·(g + λ(θ − w) + μθ) = [1, −2] − 0.1·([0.2, 0.4] + [1, −4] + [0.5, −1]) = [0.83, −1.54]
    with_mu, _ = pfedme_inner_solve(gradient, theta, anchor, lam=2.0, lr=0.1, steps=1, mu=0.5)
    torch.testing.assert_close(with_mu["a"], torch.tensor([0.83, -1.54]))
    # without μ: [1, −2] − 0.1·([0.2, 0.4] + [1, −4]) = [0.88, −1.64]
    paper, _ = pfedme_inner_solve(gradient, theta, anchor, lam=2.0, lr=0.1, steps=1)
    torch.testing.assert_close(paper["a"], torch.tensor([0.88, -1.64]))
    assert PFedMeHyperparameters().inner_mu == 0.0
    with pytest.raises(ConfigError, match="--inner-mu"):
        PFedMeHyperparameters(inner_mu=-1.0).validate()


def test_options_left_at_their_default_keep_the_run_identity():
    config, _ = resolve(RunConfig(**TINY, algo="pfedme"), PFedMe, PFedMeHyperparameters())
    identity = identity_settings(config, PFedMe, PFedMeHyperparameters())
    assert "inner_mu" not in identity["algo_hparams"]
    assert identity_settings(config, PFedMe, PFedMeHyperparameters(inner_mu=0.001))["algo_hparams"]["inner_mu"] == 0.001
    lg = identity_settings(config, LGFedAvg, LGFedAvgHyperparameters())
    assert lg["algo_hparams"] == {}  # as before the options existed (no hyperparameters)
    assert identity_settings(config, LGFedAvg, LGFedAvgHyperparameters(warmup_rounds=3))["algo_hparams"] == {
        "warmup_rounds": 3
    }


# ---- LG-FedAvg: the paper's split, FedAvg warm start ------------------------------------------
def test_lgfedavg_paper_split_by_model():
    assert global_layer_count("head-layers", "mlp", 1) == 1
    assert global_layer_count("paper", "mlp", 1) == 2
    assert global_layer_count("paper", "cnn", 1) == 2 and global_layer_count("paper", "lenet", 3) == 2
    with pytest.raises(ConfigError, match="--global-layers paper is defined for --model mlp, cnn, lenet"):
        global_layer_count("paper", "cnn_bn", 1)
    torch.manual_seed(0)
    hparams = LGFedAvgHyperparameters(global_layers="paper")
    config, _ = resolve(RunConfig(**TINY, algo="lgfedavg"), LGFedAvg, hparams)
    algorithm = LGFedAvg(
        config, LGFedAvgHyperparameters(global_layers="paper"), build_model("mlp", (1, 8, 8), 10), [5, 5, 5]
    )
    assert set(algorithm.layout.private) == {"fc1.weight", "fc1.bias"}
    assert set(algorithm.layout.shared) == {"fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}


def test_lgfedavg_warm_start_is_fedavg_on_the_whole_model_then_splits(tmp_path):
    settings = {**TINY, "frac": 1.0}
    run_experiment(RunConfig(**settings, algo="lgfedavg", out=str(tmp_path / "warm")), {"warmup_rounds": 1})
    run_experiment(RunConfig(**{**settings, "rounds": 1}, algo="fedavg", out=str(tmp_path / "fedavg")))
    (warm,) = (tmp_path / "warm" / "runs").iterdir()
    (fedavg,) = (tmp_path / "fedavg" / "runs").iterdir()
    rounds = [json.loads(line) for line in (warm / "rounds.jsonl").read_text().splitlines()]
    reference = json.loads((fedavg / "rounds.jsonl").read_text().splitlines()[0])
    # round 1 is FedAvg: the whole model travels both ways, the same numbers as a FedAvg run
    assert rounds[0]["bytes_down"] == reference["bytes_down"] and rounds[0]["bytes_up"] == reference["bytes_up"]
    assert rounds[0]["train_loss"] == reference["train_loss"]
    head_bytes = 3 * (200 * 10 + 10) * 4  # fc3 of mlp(64 → 200 → 200 → 10), to each of 3 clients
    assert rounds[1]["bytes_down"] == head_bytes and rounds[1]["bytes_up"] == head_bytes


# ---- FedSDG: --server-agg fedavg is the uniform mean, --private-init authors -------------------
FEDSDG = {**TINY, "algo": "fedsdg", "lora_targets": "fc1,fc2", "out": "unused"}


def fedsdg(**options):
    return prepare(RunConfig(**FEDSDG), options).algorithm


def test_fedsdg_fedavg_is_the_uniform_mean_and_fedavg_weighted_the_sample_weighted_one():
    uniform, weighted = fedsdg(server_agg="fedavg"), fedsdg(server_agg="fedavg-weighted")
    name = next(iter(uniform.global_state))
    base = uniform.global_state[name]
    updates = [
        ClientUpdate(k, n, {m: t.clone() + value for m, t in uniform.global_state.items()}, {})
        for k, (n, value) in enumerate([(10, 1.0), (30, 2.0), (60, 4.0)])
    ]
    expected = base.clone()
    uniform.aggregate(updates)
    # (1 + 2 + 4)/3 = 7/3 above the old value; sample-weighted: 0.1·1 + 0.3·2 + 0.6·4 = 3.1
    torch.testing.assert_close(uniform.global_state[name], expected + 7 / 3)
    assert uniform._last_weights == [1 / 3, 1 / 3, 1 / 3]
    weighted.aggregate(updates)
    torch.testing.assert_close(weighted.global_state[name], expected + 3.1)
    assert weighted._last_weights == pytest.approx([0.1, 0.3, 0.6])
    assert uniform.round_diagnostics(updates)["agg_weight_std"] == pytest.approx(0.0)


def test_fedsdg_private_init_notes_by_default_authors_on_request():
    def private_branches(algorithm):
        layers = [m for m in algorithm.model.modules() if isinstance(m, GatedLoRALinear)]
        return torch.cat([m.lora_A_private.flatten() for m in layers]), torch.cat(
            [m.lora_B_private.flatten() for m in layers]
        )

    a_notes, b_notes = private_branches(fedsdg())
    assert torch.count_nonzero(a_notes) == 0 and b_notes.abs().max() < 1e-3  # A_p = 0, B_p ~ N(0, 1e-8)
    a_authors, b_authors = private_branches(fedsdg(private_init="authors"))
    # A_p ~ N(0, 1/r) with r = 8: std 8^-½ ≈ 0.354; B_p ~ N(0, 0.01²)  (thousands of draws each)
    assert a_authors.numel() > 2000 and b_authors.numel() > 2000
    assert a_authors.std().item() == pytest.approx(8**-0.5, rel=0.05)
    assert b_authors.std().item() == pytest.approx(0.01, rel=0.05)
    assert abs(a_authors.mean().item()) < 0.02 and abs(b_authors.mean().item()) < 0.001


def test_fedsdg_new_options_at_their_default_keep_the_run_identity():
    config, _ = resolve(RunConfig(**FEDSDG), FedSDG, FedSDGHyperparameters())
    identity = identity_settings(config, FedSDG, FedSDGHyperparameters())
    assert "private_init" not in identity["algo_hparams"] and identity["algo_hparams"]["server_agg"] == "alignment"
    authors = identity_settings(config, FedSDG, FedSDGHyperparameters(private_init="authors"))
    assert authors["algo_hparams"]["private_init"] == "authors"


def test_lgfedavg_warm_start_survives_a_kill_and_resume(tmp_path):
    """Checkpoint at round 2, the warm start's last round: the resumed run must start every
    client (and the new one) from the averaged local part, as the whole run does."""
    options = {"warmup_rounds": 2}

    def config(out):
        return RunConfig(
            **{**TINY, "rounds": 4, "num_clients": 4, "frac": 0.67},
            algo="lgfedavg",
            new_clients=0.25,
            checkpoint_every=2,
            out=str(out),
        )

    # killed after round 3 (past the checkpoint of round 2)
    run = functools.partial(run_experiment, algo_options=options)
    resumed, whole = killed_and_resumed(run, config, tmp_path, after_round=3)
    timing = {k for k in whole if "time" in k or k in ("run_dir", "peak_mem_mb", "checkpoints_written")}
    assert {k: v for k, v in resumed.items() if k not in timing} == {k: v for k, v in whole.items() if k not in timing}
    assert resumed["new_acc"] == whole["new_acc"]
