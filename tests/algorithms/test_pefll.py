"""PeFLL: the embedding network, the client descriptor, the hypernetwork, the chain-rule gradient
of both and the server's Adam step, each against a hand or independent computation; the wiring
(client upload, server update, inference for evaluation and new clients); resume and Ray give the
same numbers; bad input is one ``Error:`` line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench.algorithms.pefll import (
    GRAD,
    PHI,
    PSI,
    PeFLL,
    adam_step,
    client_embedding,
    clip_total_norm,
    embed_samples,
    generate_weights,
    joint_gradient,
)
from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientJob
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
def test_embedding_network_hand_computed() -> None:
    psi = {
        "fc0.weight": torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, -1.0, 0.0, 2.0]]),
        "fc0.bias": torch.tensor([0.0, 1.0]),
        "fc1.weight": torch.tensor([[1.0, 1.0]]),
        "fc1.bias": torch.tensor([0.5]),
    }
    # [x ‖ one-hot(y)] = [1, 2, 0, 1]: fc0 → [1, −2 + 2 + 1] = [1, 1], ReLU, fc1 → 1 + 1 + 0.5
    out = embed_samples(psi, torch.tensor([[1.0, 2.0]]), torch.tensor([1]), 2)
    assert torch.allclose(out, torch.tensor([[2.5]]))
    # the negative pre-activation is cut by the ReLU: x = [0, 3], y = 0 → [0 + 1, −3 + 0 + 1] = [1, −2] → [1, 0]
    assert torch.allclose(embed_samples(psi, torch.tensor([[0.0, 3.0]]), torch.tensor([0]), 2), torch.tensor([[1.5]]))


def test_images_enter_the_embedding_average_pooled_to_8x8() -> None:
    image = torch.arange(256.0).reshape(1, 1, 16, 16)
    psi = {"fc0.weight": torch.eye(66), "fc0.bias": torch.zeros(66)}  # one identity layer: the input itself
    out = embed_samples(psi, image, torch.tensor([1]), 2)
    pooled = image.reshape(8, 2, 8, 2).mean(dim=(1, 3)).flatten()  # 2 × 2 block means
    assert torch.allclose(out[0, :64], pooled) and out[0, 64:].tolist() == [0.0, 1.0]


def test_images_enter_flattened_when_the_model_reads_them_flat() -> None:
    """mlp on 28 × 28 images: ψ is built for the 784 flattened pixels (+ labels), so no pooling."""
    image = torch.arange(784.0).reshape(1, 1, 28, 28)
    psi = {"fc0.weight": torch.eye(786), "fc0.bias": torch.zeros(786)}
    out = embed_samples(psi, image, torch.tensor([0]), 2)
    assert torch.equal(out[0, :784], image.flatten()) and out[0, 784:].tolist() == [1.0, 0.0]


def test_client_embedding_is_the_standardised_mean() -> None:
    v = client_embedding(torch.tensor([2.0, 4.0, 6.0]), 2)  # mean [1, 2, 3], sd 1 (n − 1)
    assert torch.allclose(v, torch.tensor([-1.0, 0.0, 1.0]))


def test_hypernetwork_hand_computed() -> None:
    phi = {
        "mlp0.weight": torch.tensor([[1.0, -1.0]]),
        "mlp0.bias": torch.tensor([0.0]),
        "mlp1.weight": torch.tensor([[2.0]]),
        "mlp1.bias": torch.tensor([1.0]),
        "out[w].weight": torch.tensor([[1.0], [0.0], [-1.0], [3.0]]),
        "out[w].bias": torch.tensor([0.0, 1.0, 0.0, 0.0]),
    }
    # v = [3, 1]: z = 2 → ReLU 2 → 2·2 + 1 = 5 → θ = [5, 1, −5, 15] as 2 × 2
    theta = generate_weights(phi, torch.tensor([3.0, 1.0]), {"w": torch.Size([2, 2])}, hidden_layers=1)
    assert torch.allclose(theta["w"], torch.tensor([[5.0, 1.0], [-5.0, 15.0]]))
    # v = [1, 3]: z = −2, the ReLU cuts it: 0·2 + 1 = 1 → [1, 1, −1, 3]
    theta = generate_weights(phi, torch.tensor([1.0, 3.0]), {"w": torch.Size([2, 2])}, hidden_layers=1)
    assert torch.allclose(theta["w"], torch.tensor([[1.0, 1.0], [-1.0, 3.0]]))


def test_joint_gradient_is_the_chain_rule_through_embedding_and_hypernetwork() -> None:
    generator = torch.Generator().manual_seed(0)
    psi = {
        "fc0.weight": torch.randn(3, 5, generator=generator, dtype=torch.float64),
        "fc0.bias": torch.randn(3, generator=generator, dtype=torch.float64),
    }
    phi = {
        "mlp0.weight": torch.randn(4, 3, generator=generator, dtype=torch.float64),
        "mlp0.bias": torch.randn(4, generator=generator, dtype=torch.float64),
        "out[w].weight": torch.randn(6, 4, generator=generator, dtype=torch.float64),
        "out[w].bias": torch.randn(6, generator=generator, dtype=torch.float64),
    }
    x = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    delta = {"w": torch.randn(2, 3, generator=generator, dtype=torch.float64)}
    targets = {"w": torch.Size([2, 3])}

    def theta_of(all_params: dict) -> torch.Tensor:
        p = {n[len(PSI) :]: t for n, t in all_params.items() if n.startswith(PSI)}
        h = {n[len(PHI) :]: t for n, t in all_params.items() if n.startswith(PHI)}
        v = client_embedding(embed_samples(p, x, y, 2).sum(dim=0), len(y))
        return generate_weights(h, v, targets, hidden_layers=0)["w"]

    leaves = {PSI + n: t.clone().requires_grad_(True) for n, t in psi.items()}
    leaves.update({PHI + n: t.clone().requires_grad_(True) for n, t in phi.items()})
    gradients = joint_gradient({"w": theta_of(leaves)}, leaves, delta)
    # independently: central finite differences of ⟨θ(ψ, φ), Δθ⟩ in every coordinate
    base = {n: t.detach() for n, t in leaves.items()}
    for name, tensor in base.items():
        for index in range(tensor.numel()):
            step = torch.zeros(tensor.numel(), dtype=torch.float64)
            step[index] = 1e-6
            plus = {**base, name: tensor + step.view_as(tensor)}
            minus = {**base, name: tensor - step.view_as(tensor)}
            numeric = float(((theta_of(plus) - theta_of(minus)) * delta["w"]).sum()) / 2e-6
            assert math.isclose(float(gradients[name].view(-1)[index]), numeric, rel_tol=1e-5, abs_tol=1e-8), name


def test_adam_step_is_torch_adam() -> None:
    generator = torch.Generator().manual_seed(1)
    start = torch.randn(4, generator=generator)
    reference = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.Adam([reference], lr=0.01)
    params, first, second = {"p": start.clone()}, {"p": torch.zeros(4)}, {"p": torch.zeros(4)}
    for step in range(1, 4):
        gradient = torch.randn(4, generator=generator)
        reference.grad = gradient.clone()
        optimizer.step()
        adam_step(params, {"p": gradient}, first, second, step, 0.01)
        assert torch.allclose(params["p"], reference.detach(), atol=1e-7)


def test_clip_total_norm_hand_computed() -> None:
    clipped = clip_total_norm({"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0, 4.0])}, 1.0)
    scale = 1.0 / (5.0 + 1e-6)  # ‖g‖ = 5
    assert torch.allclose(clipped["a"], torch.tensor([3 * scale, 0.0])) and torch.allclose(
        clipped["b"], torch.tensor([0.0, 4 * scale])
    )
    small = clip_total_norm({"a": torch.tensor([0.3, 0.4])}, 1.0)  # ‖g‖ = 0.5 < 1: unchanged
    assert torch.allclose(small["a"], torch.tensor([0.3, 0.4]))


# ---- wiring ---------------------------------------------------------------------------------------
def test_client_uploads_the_gradient_and_the_server_takes_one_adam_step(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("pefll", tmp_path), {"hn_hidden": 8, "hn_hidden_layers": 1}))
    algorithm = harness.algorithm
    assert algorithm.layout.shared == () and PeFLL.method_family == "hypernetwork"
    received = algorithm.broadcast(0)
    assert {n[len(PSI) :] for n in received if n.startswith(PSI)} == set(algorithm.psi)
    updates = [harness.train_client(k, received) for k in range(3)]
    names = list(algorithm.adam_first)
    assert set(updates[0].params) == {GRAD + n for n in names}
    before = {
        **{PSI + n: t.clone() for n, t in algorithm.psi.items()},
        **{PHI + n: t.clone() for n, t in algorithm.phi.items()},
    }
    algorithm.aggregate(updates)
    mean = {n: sum(u.params[GRAD + n] for u in updates) / 3 for n in names}
    clipped = clip_total_norm(mean, 50.0)
    expected, first, second = (
        before,
        {n: torch.zeros_like(t) for n, t in before.items()},
        {n: torch.zeros_like(t) for n, t in before.items()},
    )
    adam_step(expected, clipped, first, second, 1, 2e-4)
    for n in names:
        now = algorithm.psi[n[len(PSI) :]] if n.startswith(PSI) else algorithm.phi[n[len(PHI) :]]
        assert torch.allclose(now, expected[n])
    assert algorithm.adam_steps == 1


def test_evaluation_generates_the_model_from_the_whole_train_split(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("pefll", tmp_path), {"hn_hidden": 8, "hn_hidden_layers": 1}))
    algorithm = harness.algorithm
    program = algorithm.personalization_program()
    assert algorithm.new_client_program() is not None
    (update,) = harness.executor.train(program, [ClientJob(2, 1, 0, algorithm.personal_model(2), {})])
    data = harness.data
    inputs, labels = data.gather(data.train_indices[2])
    v = client_embedding(embed_samples(algorithm.psi, inputs, labels, 10).sum(dim=0), len(labels))
    expected = generate_weights(algorithm.phi, v, algorithm.targets, 1)
    for name, tensor in expected.items():
        assert torch.allclose(update.params[name], tensor, atol=1e-5), name


# ---- every executor, resume -----------------------------------------------------------------------
def sgd_run(out: Path, **settings) -> RunConfig:
    base = dict(dataset="digits", model="cnn_bn", num_clients=4, rounds=3, alpha=0.3, optimizer="sgd", lr=0.05)
    return RunConfig(algo="pefll", out=str(out), **{**base, **settings})


def test_killed_and_resumed_run_is_identical(tmp_path: Path) -> None:
    def config(out: Path) -> RunConfig:
        return sgd_run(out, rounds=4, frac=0.67, checkpoint_every=2, new_clients=0.25)

    resumed, whole = killed_and_resumed(
        lambda c, **kw: run_experiment(c, {"hn_hidden": 16}, **kw), config, tmp_path, after_round=3
    )
    assert round_numbers(resumed) == round_numbers(whole)
    assert resumed["pers_acc"] == whole["pers_acc"] and resumed["new_acc"] == whole["new_acc"]


def test_ray_gives_the_sequential_numbers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray():
        options = {"hn_hidden": 16}
        sequential = run_experiment(sgd_run(tmp_path / "seq", rounds=2, model="mlp"), options)
        on_ray = run_experiment(
            sgd_run(tmp_path / "ray", rounds=2, model="mlp", executor="ray", ray_workers=2), options
        )
    assert round_numbers(on_ray) == round_numbers(sequential)


# ---- bad input ------------------------------------------------------------------------------------
TINY_ARGS = ["--algo", "pefll", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
CONV1D_MODEL = """
from torch import nn
from pflbench import register_model


@register_model("conv1d_first")
class Conv1dFirst(nn.Module):
    layer_names = ("conv", "fc")

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3)
        self.fc = nn.Linear(124, num_classes)

    def forward(self, x):
        return self.fc(self.conv(x.flatten(1).unsqueeze(1)).flatten(1))
"""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--embed-dim", "1"], "--embed-dim must be ≥ 2 (the descriptor is standardised over its entries) or -1"),
        (["--hn-hidden", "0"], "--hn-hidden must be ≥ 1, got 0"),
        (["--embed-batches", "0"], "--embed-batches must be ≥ 1, got 0"),
        (["--hn-hidden-layers", "-1"], "--hn-hidden-layers must be ≥ 0"),
        (["--hn-lr", "0"], "--hn-lr must be > 0, got 0.0"),
        (["--hn-max-grad-norm", "-1"], "--hn-max-grad-norm must be > 0"),
        (["--executor", "vmap"], "vmap"),
        (["--dp", "client"], "cannot make --algo pefll private"),
        (["--robust-agg", "krum"], "cannot replace the aggregation of --algo pefll"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", *TINY_ARGS, "--out", str(out), *args])
    assert_refused(result, out, expected)


def test_a_model_whose_first_layer_the_embedding_cannot_read_is_refused(tmp_path: Path) -> None:
    plugin = tmp_path / "conv1d.py"
    plugin.write_text(CONV1D_MODEL)
    out = tmp_path / "out"
    args = ["run", *TINY_ARGS, "--plugin", str(plugin), "--model", "conv1d_first", "--out", str(out)]
    assert_refused(CliRunner().invoke(cli, args), out, "must be a Conv2d or a Linear; 'conv' is a Conv1d")


def test_holdout_domain_is_refused() -> None:
    from pflbench.errors import ConfigError

    config = dataclasses.replace(RunConfig(algo="pefll"), holdout_domain="photo")
    with pytest.raises(ConfigError, match="--holdout-domain"):
        PeFLL.check_config(config, PeFLL.hyperparameters())


def test_runs_from_a_config_file_and_declares_its_search_space(tmp_path: Path, run_config_file) -> None:
    hparams = run_config_file(
        tmp_path, "pefll", 'algo = "pefll"\nmodel = "mlp"\nnum_clients = 3\nrounds = 1\nhn_hidden = 12\nembed_dim = 3\n'
    )["algo_hparams"]
    assert hparams["hn_hidden"] == 12 and hparams["embed_dim"] == 3
    resolved = dataclasses.replace(RunConfig(algo="pefll"), lr=0.05)
    assert set(PeFLL.search_space(resolved, PeFLL.hyperparameters())) == {"lr", "hn_lr"}
