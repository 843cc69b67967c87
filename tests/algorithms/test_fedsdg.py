"""FedSDG: the server's alignment aggregation (seed 001 worked example and edge cases) and the
client side (penalties, gates, private branch, optimizer) on a 6-block ViT."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pflbench import ClientProgram
from pflbench.algorithms.fedsdg import GatedLoRALinear, fedsdg_server_aggregate, gate_penalty, weight_statistics
from pflbench.config.run_config import RunConfig
from pflbench.registry import ALGORITHMS
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness

T = torch.tensor


def cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-8))


def test_seed_worked_example() -> None:
    """Seed 001: θ = [1, 2]; clients [1.5, 2.3], [1.6, 2.4], [0.5, 1.8] → w ≈ [0.498, 0.502, 0]."""
    new, weights = fedsdg_server_aggregate(
        {"w": T([1.0, 2.0])}, [{"w": T([1.5, 2.3])}, {"w": T([1.6, 2.4])}, {"w": T([0.5, 1.8])}]
    )
    assert weights == pytest.approx([0.498, 0.502, 0.0], abs=1e-3)
    assert new["w"].tolist() == pytest.approx([1.550, 2.351], abs=1e-3)


def test_hand_computed_case_not_in_the_seed_over_two_tensors() -> None:
    """Δ1 = [1, 0 | 0], Δ2 = [0, 1 | 0], Δ3 = [1, 1 | 2] split over two named tensors."""
    deltas = [np.array([1.0, 0, 0]), np.array([0, 1.0, 0]), np.array([1.0, 1, 2])]
    mean = sum(deltas) / 3  # [2/3, 2/3, 2/3]
    scores = [max(0.0, cosine(d, mean)) for d in deltas]
    # cos = 1/√3, 1/√3, 4/(3√2) → w = 0.27526, 0.27526, 0.44949
    assert scores == pytest.approx([1 / math.sqrt(3), 1 / math.sqrt(3), 4 / (3 * math.sqrt(2))], abs=1e-6)
    expected_w = [s / (sum(scores) + 1e-8) for s in scores]
    assert expected_w == pytest.approx([0.27526, 0.27526, 0.44949], abs=1e-5)
    base = {"a": T([1.0, -1.0]), "b": T([0.5])}
    clients = [{"a": base["a"] + T(d[:2].tolist()), "b": base["b"] + T(d[2:].tolist())} for d in deltas]
    new, weights = fedsdg_server_aggregate(base, clients)
    assert weights == pytest.approx(expected_w, abs=1e-6)
    # θ + Σ w_k Δ_k = [1, −1 | 0.5] + [0.72474, 0.72474 | 0.89898]
    assert new["a"].tolist() == pytest.approx([1.72474, -0.27526], abs=1e-5)
    assert new["b"].tolist() == pytest.approx([1.39898], abs=1e-5)


def test_no_clients_leaves_params_unchanged() -> None:
    new, weights = fedsdg_server_aggregate({"w": T([1.0, 2.0])}, [])
    assert weights == [] and new["w"].tolist() == [1.0, 2.0]


def test_one_client_takes_its_params() -> None:
    new, weights = fedsdg_server_aggregate({"w": T([1.0, 2.0])}, [{"w": T([3.0, -1.0])}])
    assert weights == [1.0] and new["w"].tolist() == [3.0, -1.0]


def test_identical_updates_get_equal_weights() -> None:
    new, weights = fedsdg_server_aggregate({"w": T([0.0, 0.0])}, [{"w": T([1.0, 2.0])}] * 4)
    assert weights == pytest.approx([0.25] * 4, abs=1e-6)
    assert new["w"].tolist() == pytest.approx([1.0, 2.0], abs=1e-6)


def test_opposite_updates_fall_back_to_uniform() -> None:
    """Δ̄ = 0 → every α = 0 → Σα < 1e-6 → w = 1/M; θ + mean Δ = θ."""
    new, weights = fedsdg_server_aggregate({"w": T([1.0, 1.0])}, [{"w": T([2.0, 3.0])}, {"w": T([0.0, -1.0])}])
    assert weights == [0.5, 0.5]
    assert new["w"].tolist() == pytest.approx([1.0, 1.0])


def test_zero_updates_never_give_nan() -> None:
    new, weights = fedsdg_server_aggregate({"w": T([1.0, 2.0])}, [{"w": T([1.0, 2.0])}] * 3)
    assert weights == pytest.approx([1 / 3] * 3) and not torch.isnan(new["w"]).any()


def test_return_weights_false_returns_params_only() -> None:
    new = fedsdg_server_aggregate({"w": T([1.0])}, [{"w": T([2.0])}, {"w": T([4.0])}], return_weights=False)
    assert isinstance(new, dict) and new["w"].item() == pytest.approx(3.0)


def test_weight_statistics() -> None:
    stats = weight_statistics([0.5, 0.5, 0.0])
    assert stats["agg_weight_zeros"] == 1 and stats["agg_weight_max"] == 0.5
    assert stats["agg_weight_entropy"] == pytest.approx(math.log(2))


def test_gate_penalties() -> None:
    logits = [T(0.0), T(math.log(3.0))]  # m = 0.5, 0.75
    assert gate_penalty(logits, "l1").item() == pytest.approx(1.25)
    assert gate_penalty(logits, "bilateral").item() == pytest.approx(0.75)


# ---- client side on a 6-block ViT ---------------------------------------------------------

VIT = ("depth=6", "embed_dim=24", "num_heads=2", "patch_size=4")


@pytest.fixture(scope="module")
def server():
    config = RunConfig(
        algo="fedsdg",
        dataset="digits",
        model="vit_tiny_patch16_224",
        model_option=VIT,
        num_clients=4,
        frac=0.5,
        rounds=2,
        optimizer="adam",
        lr=1e-3,
        backbone="random",
        out="unused",
    )
    return Harness(prepare(config))


def test_structure_names_and_init(server) -> None:
    assert len(server.gate_names) == 6 and all("lambda_k_logit" in n for n in server.gate_names)
    layers = [m for m in server.model.modules() if isinstance(m, GatedLoRALinear)]
    assert len(layers) == 12  # attn.proj and mlp.fc2 in each block
    for layer in layers:
        assert layer.lora_A_private.shape == layer.lora_A.shape
        assert layer.lora_B_private.shape == layer.lora_B.shape
        assert torch.count_nonzero(layer.branch_delta(layer.lora_A_private, layer.lora_B_private)) == 0
    assert all(n.endswith("_private") for n in server.private_lora_names)
    assert set(server.private_names) == set(server.private_lora_names) | set(server.gate_names)
    assert not set(server.shared_names) & set(server.private_names)
    assert any(n.startswith("head.") for n in server.shared_names)


def test_effective_weight_is_shared_plus_gated_private(server) -> None:
    layer = next(m for m in server.model.modules() if isinstance(m, GatedLoRALinear))
    with torch.no_grad():
        layer.lora_A_private.normal_()
        x = torch.randn(3, layer.base.in_features)
        s = layer.scaling
        m = torch.sigmoid(layer.gate.lambda_k_logit)
        expected = (
            x
            @ (
                layer.base.weight + s * (layer.lora_B @ layer.lora_A + m * layer.lora_B_private @ layer.lora_A_private)
            ).T
        )
        assert torch.allclose(layer(x), expected + layer.base.bias, atol=1e-5)
        layer.lora_A_private.zero_()


def test_first_step_penalties_and_private_gradient(server) -> None:
    inputs, targets = server.data.gather(server.data.train_indices[0][:16])
    server.load_client(0, server.global_state)
    terms = server.program.loss_terms(server.forward, server.parameters, inputs, targets, server.global_state)
    assert terms["gate_penalty"].item() == pytest.approx(3.0)  # 6 blocks × m = 0.5
    assert terms["private_penalty"].item() < 1e-4
    loss = sum(server.program.loss_weights.get(n, 1.0) * t for n, t in terms.items())
    loss.backward()
    grads = [server.parameters[n].grad for n in server.private_lora_names if n.endswith("lora_A_private")]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    server.model.zero_grad(set_to_none=True)


def test_optimizer_groups_and_no_weight_decay(server) -> None:
    from pflbench.engine import build_optimizer

    trainable = {n: server.parameters[n] for n in server.trainable_names}
    optimizer = build_optimizer(server.program.optimizer(), trainable)
    from pflbench.engine.optim import Adam

    assert isinstance(optimizer, Adam)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-3, 1e-2]
    assert optimizer.weight_decay == 0 and optimizer.betas == (0.9, 0.999)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
    assert server.program.max_grad_norm == 1.0


def test_private_params_and_gates_never_travel(server, record_traffic) -> None:
    private = set(server.private_names)
    received, uploads = record_traffic(server)
    records = []
    server.run(records.append)
    assert uploads and all(not keys & private for keys in uploads + received)
    assert not private & set(server.global_state)
    trained = [k for k in range(4) if k in server.store]
    assert trained and all(set(server.store.get(k)) == private for k in trained)
    moved = [
        not torch.equal(server.store.get(k)[n], server.store.initial[n]) for k in trained for n in server.gate_names
    ]
    assert any(moved), "gates train on the client"
    for key in (
        "loss_task",
        "loss_gate_penalty",
        "loss_private_penalty",
        "agg_weight_mean",
        "agg_weight_std",
        "agg_weight_min",
        "agg_weight_max",
        "agg_weight_zeros",
        "agg_weight_entropy",
        "agg_fallbacks",
    ):
        assert key in records[-1], key
    assert not {"task_loss", "gate_penalty", "private_penalty"} & set(records[-1]), "each term logged once"
    summary, columns = server.final_report()
    assert len(summary["gates"]) == 4 and len(summary["gates"][0]) == 6
    assert set(columns) == {f"gate_{i}" for i in range(6)}
    for key in ("gate_frac_below_0.1", "gate_frac_above_0.9", "gate_frac_0.4_to_0.6"):
        assert 0.0 <= summary[key] <= 1.0


def test_global_model_forces_gates_to_zero(server) -> None:
    server.load_global_model()
    layer = next(m for m in server.model.modules() if isinstance(m, GatedLoRALinear))
    assert layer.gate().item() == 0.0


@pytest.mark.parametrize("algo", [a for a in ALGORITHMS.names() if a != "fedsdg"])
def test_penalties_absent_for_every_other_algorithm(algo: str) -> None:
    config = RunConfig(
        algo=algo,
        dataset="digits",
        model="cnn_bn" if algo == "fedbn" else "mlp",
        num_clients=3,
        rounds=1,
        lora_targets="fc1,fc2",
        backbone="random",
        out="unused",
        optimizer="sgd" if algo == "scaffold" else None,
    )
    other = Harness(prepare(config))
    if type(other.program).local_update is not ClientProgram.local_update:
        pytest.skip(f"{algo} computes its loss in its own local update (job state)")
    inputs, targets = other.data.gather(other.data.train_indices[0][:8])
    terms = other.program.loss_terms(other.forward, other.parameters, inputs, targets, other.global_state)
    assert not {"gate_penalty", "private_penalty"} & set(terms)
    assert not any("lambda_k_logit" in n or n.endswith("_private") for n in other.parameters)


def test_cli_run_writes_gates_and_plots_heatmap(tmp_path) -> None:
    from click.testing import CliRunner

    from pflbench.cli import cli

    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--algo",
            "fedsdg",
            "--model",
            "mlp",
            "--lora-targets",
            "fc1,fc2",
            "--backbone",
            "random",
            "--num-clients",
            "3",
            "--rounds",
            "2",
            "--quiet",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    (run_dir,) = list((out / "runs").iterdir())
    header = (run_dir / "clients.csv").read_text().splitlines()[0]
    assert "gate_0" in header and "gate_1" in header
    # the names the docs give the logged loss terms (issue 23: not task_loss, gate_penalty, ...)
    first = json.loads((run_dir / "rounds.jsonl").read_text().splitlines()[0])
    assert {"loss_task", "loss_gate_penalty", "loss_private_penalty"} <= set(first)
    assert not {"task_loss", "gate_penalty", "private_penalty"} & set(first)
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "lora.md").read_text()  # moved from the README
    section = guide[guide.index("## FedSDG") :]
    assert "`loss_task`, `loss_gate_penalty`, `loss_private_penalty`" in section
    plot = tmp_path / "gates.png"
    result = CliRunner().invoke(cli, ["gates", str(run_dir), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "gates < 0.1" in result.output and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = CliRunner().invoke(cli, ["gates", str(tmp_path)])
    assert result.exit_code == 2 and "has no gate values" in result.output
