"""``--executor vmap``: the same numbers as ``sequential`` (to floating-point tolerance) for every
algorithm it hosts, and a one-line ConfigError at prepare time for what it cannot host."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

from pflbench import ClientProgram, ConfigError, OptimizerSpec, ProgramCapabilities, register_algorithm
from pflbench.algorithms.fedavg import FedAvg
from pflbench.config.run_config import RunConfig
from pflbench.engine.vmap import batchable_forms, contiguous_runs
from pflbench.engine.vmap_optim import FunctionalOptimizer
from pflbench.models.lora import LoRALinear
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare

# batch 16 on ~40-sample clients: full, short and merged batches, unequal step counts
BASE = RunConfig(
    dataset="digits",
    model="mlp",
    num_clients=4,
    rounds=1,
    alpha=0.3,
    batch_size=16,
    lr=0.05,
    backbone="random",
)
LORA = {"lora_targets": "fc1,fc2"}  # LoRA on the mlp's layers (given only to LoRA runs: elsewhere it is inert)


def rounds(config: RunConfig, algo_options: dict | None = None) -> list[dict]:
    summary = run_experiment(config, algo_options)
    with open(f"{summary['run_dir']}/rounds.jsonl") as file:
        return [json.loads(line) for line in file]


def assert_close(sequential: list[dict], vectorized: list[dict]) -> None:
    assert len(sequential) == len(vectorized)
    for a, b in zip(sequential, vectorized):
        assert a["pers_acc"] == b["pers_acc"], (a["round"], a["pers_acc"], b["pers_acc"])
        assert a["global_acc"] == b["global_acc"]
        for key in (k for k in a if k == "train_loss" or k.startswith("loss_")):
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-7), (key, a[key], b[key])


CASES = {
    "fedavg_momentum_wd_clip": ("fedavg", {"momentum": 0.9, "weight_decay": 1e-3, "max_grad_norm": 1.0}, {}),
    "fedavg_adam": ("fedavg", {"optimizer": "adam", "lr": 0.003}, {}),
    "fedprox": ("fedprox", {}, {"mu": 0.1}),
    "local": ("local", {}, {}),
    "fedper": ("fedper", {"rounds": 2}, {}),  # private heads carried across rounds
    "fedrep": ("fedrep", {"rounds": 2}, {"head_epochs": 2}),
    "fedper_cnn": ("fedper", {"model": "cnn"}, {}),
    "fedavg_lora": ("fedavg", {"lora_rank": 2, "optimizer": "adam", "lr": 0.003, **LORA}, {}),
    "fedsdg": ("fedsdg", {"optimizer": "adam", "lr": 0.01, **LORA}, {}),
    # per-client ranks 1 and 2 (zero-padded to 2, scaling α/r_k per client under vmap)
    "flexlora_ranks": ("flexlora", {"optimizer": "adam", "lr": 0.01, "rounds": 2, **LORA}, {"rank_dist": "1,2,1,2"}),
    # timm's ViT: its fused attention runs unfused under vmap (no batching rule), fused sequentially
    "fedavg_lora_vit": (
        "fedavg",
        {
            "model": "vit_tiny_patch16_224",
            "model_option": ("depth=1", "embed_dim=16", "num_heads=2"),
            "lora_rank": 2,
            "optimizer": "adam",
            "lr": 0.003,
            **LORA,
        },
        {},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_vmap_matches_sequential(case: str, tmp_path) -> None:
    algo, settings, hparams = CASES[case]
    config = dataclasses.replace(BASE, algo=algo, **settings)
    sequential = rounds(dataclasses.replace(config, out=str(tmp_path / "seq")), hparams)
    vectorized = rounds(dataclasses.replace(config, out=str(tmp_path / "vmap"), executor="vmap"), hparams)
    assert_close(sequential, vectorized)


def test_fednova_under_vmap_reads_the_same_unequal_step_counts(tmp_path) -> None:
    """FedNova's a_k needs each client's τ_k: vmap reports the batches each client drew (clients
    of different sizes, 2 epochs, momentum-corrected a_k), and the rounds match sequential."""
    config = dataclasses.replace(BASE, algo="fednova", rounds=2, local_epochs=2, momentum=0.5)
    sequential = rounds(dataclasses.replace(config, out=str(tmp_path / "seq")))
    vectorized = rounds(dataclasses.replace(config, out=str(tmp_path / "vmap"), executor="vmap"))
    assert_close(sequential, vectorized)
    for a, b in zip(sequential, vectorized):
        assert a["fednova_steps_min"] < a["fednova_steps_max"]  # unequal τ_k
        for key in ("fednova_steps_min", "fednova_steps_max", "fednova_tau_eff"):
            assert a[key] == b[key], (key, a[key], b[key])


def test_a_vmap_round_does_not_import_torch_dynamo(tmp_path) -> None:
    """torch.func.grad's first call would import torch._dynamo (seconds); ``func_grad`` avoids
    it. In a fresh interpreter: one FedAvg round under vmap, then torch._dynamo is still absent."""
    script = (
        "import sys, dataclasses\n"
        "from pflbench.config.run_config import RunConfig\n"
        "from pflbench.runs.api import run_experiment\n"
        f"run_experiment(RunConfig(dataset='digits', model='mlp', num_clients=2, rounds=1, executor='vmap', out={str(tmp_path)!r}))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_autograd_without_dynamo_gives_torch_s_gradients_and_restores_it() -> None:
    from torch._functorch import eager_transforms

    from pflbench.engine.func_grad import autograd_without_dynamo

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    params = {n: torch.stack([p.detach(), p.detach() * 0.5]) for n, p in model.named_parameters()}
    inputs, targets = torch.randn(2, 6, 5), torch.randint(0, 3, (2, 6))

    def loss(p, x, y):
        return torch.nn.functional.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    step = torch.func.vmap(torch.func.grad(loss))
    original = eager_transforms._autograd_grad
    with autograd_without_dynamo():
        assert eager_transforms._autograd_grad is not original
        ours = step(params, inputs, targets)
    assert eager_transforms._autograd_grad is original
    theirs = step(params, inputs, targets)
    for name in params:
        assert torch.equal(ours[name], theirs[name]), name


def test_attention_runs_unfused_inside_vmap_and_fused_again_after() -> None:
    from timm.layers import Attention

    model = torch.nn.Sequential(Attention(8, num_heads=2), Attention(8, num_heads=2))
    assert all(m.fused_attn for m in model)  # timm's default where torch has the fused kernel
    x = torch.randn(3, 5, 8)
    fused = model(x)
    with batchable_forms(model):
        assert not any(m.fused_attn for m in model)
        unfused = model(x)
    assert all(m.fused_attn for m in model)
    torch.testing.assert_close(unfused, fused, rtol=1e-5, atol=1e-6)  # the same function


def test_a_padded_lora_layer_is_its_active_rank_and_leaves_the_padding_at_zero() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(torch.nn.Linear(6, 5), rank=3, alpha=4.0)
    layer.set_active_rank(2)  # FlexLoRA: a rank-2 client on the rank-3 layer, factors padded with zeros
    with torch.no_grad():
        layer.lora_A[2:] = 0
        layer.lora_B.normal_()
        layer.lora_B[:, 2:] = 0
    x = torch.randn(4, 6)
    sliced = layer(x)  # A[:2], B[:, :2], s = 4/2
    expected = layer.base(x) + 2.0 * x @ layer.lora_A[:2].T @ layer.lora_B[:, :2].T
    torch.testing.assert_close(sliced, expected)
    with batchable_forms(torch.nn.Sequential(layer)):
        assert layer.padded
        padded = layer(x)
        padded.sum().backward()
        delta = layer.delta_weight()
    assert not layer.padded
    torch.testing.assert_close(padded, sliced, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(delta, 2.0 * layer.lora_B[:, :2] @ layer.lora_A[:2])
    assert not layer.lora_A.grad[2:].any() and not layer.lora_B.grad[:, 2:].any()  # the padding stays zero


class CustomLoop(ClientProgram):
    capabilities = ProgramCapabilities(model_upload=True)  # its own local_update, declared

    def local_update(self, trainer):
        return super().local_update(trainer)


@register_algorithm("test_vmap_custom_loop")
class CustomLoopAlgorithm(FedAvg):
    program_class = CustomLoop


@pytest.mark.parametrize(
    "settings, reason",
    [
        ({"algo": "test_vmap_custom_loop"}, "overrides local_update"),
        ({"model": "cnn_bn"}, "BatchNorm"),
        ({"model": "char_lstm", "dataset": "synthetic", "dataset_option": ("num_samples=200",)}, None),
    ],
)
def test_vmap_refuses_what_it_cannot_host_at_prepare(settings: dict, reason: str | None, tmp_path) -> None:
    config = dataclasses.replace(BASE, executor="vmap", out=str(tmp_path), **settings)
    with pytest.raises(ConfigError) as error:
        prepare(config)
    message = str(error.value)
    assert "\n" not in message and (reason is None or reason in message), message


def test_a_client_without_a_batch_takes_no_step() -> None:
    """Clients are stepped in contiguous runs of equal batch size; the others keep their
    parameters and optimizer state."""
    assert contiguous_runs([32, 32, 5, 0, 32]) == [slice(0, 2), slice(2, 3), slice(4, 5)]
    params = {"w": torch.ones(3, 2)}
    optimizer = FunctionalOptimizer(OptimizerSpec(kind="adam", lr=0.1), ["w"], params)
    optimizer.step_({"w": params["w"][0:2]}, {"w": torch.ones(2, 2)}, 1, slice(0, 2))
    exp_avg, exp_avg_sq = optimizer.state["w"]
    assert torch.equal(params["w"][2], torch.ones(2)) and not torch.equal(params["w"][0], torch.ones(2))
    assert torch.equal(exp_avg[2], torch.zeros(2)) and torch.equal(exp_avg_sq[2], torch.zeros(2))
    assert exp_avg[0].abs().sum() > 0


def test_functional_sgd_matches_torch_optim() -> None:
    spec = OptimizerSpec(kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.01, max_grad_norm=0.5)
    torch.manual_seed(0)
    start, grads = torch.randn(2, 5), [torch.randn(2, 5) for _ in range(3)]
    optimizer = FunctionalOptimizer(spec, ["w"], {"w": start})
    value = start.clone()
    for step, g in enumerate(grads, 1):
        optimizer.step_({"w": value}, {"w": g}, step, slice(0, 2))
    for client in range(2):
        p = torch.nn.Parameter(start[client].clone())
        reference = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
        for g in grads:
            p.grad = g[client].clone()
            torch.nn.utils.clip_grad_norm_([p], 0.5)
            reference.step()
        torch.testing.assert_close(value[client], p.detach())
